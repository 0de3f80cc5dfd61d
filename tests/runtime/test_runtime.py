"""The runtime both experiments share: worker processes whose death is noticed, and Ray tasks
retried once in a fresh process (with a stand-in for Ray that records what it was asked)."""

from __future__ import annotations

import contextlib
import os
import sys

import pytest

from attnbench.runtime.processes import WorkerProcess, run_each_in_a_process
from attnbench.runtime.ray_tasks import error_reason, tasks_with_one_retry
from tests.helpers.fake_ray import FakeRay, StoppingRay, flaky


def job(x, offset=0):
    """What the worker processes run: ``x`` is a number, or says how to fail."""
    if x == "raise":
        raise ValueError("bad job")
    if x == "exit":
        sys.exit(3)
    if x == "crash":
        os._exit(70)
    return x + offset


def test_a_worker_runs_jobs_one_after_another_and_reports_errors():
    worker = WorkerProcess(job, (10,))
    try:
        assert worker.run(1) == ("ok", 11)
        kind, error = worker.run("raise")
        assert kind == "error" and isinstance(error, ValueError) and "bad job" in str(error)
        assert worker.run(2) == ("ok", 12)  # an error does not end the process
    finally:
        worker.stop()
    assert not worker.proc.is_alive()


def test_a_dead_worker_reads_as_died_with_its_exit_code():
    worker = WorkerProcess(job)
    try:
        assert worker.run("crash") == ("died", 70)
    finally:
        worker.stop()


def test_exceptions_outside_report_end_the_process():
    reporting = WorkerProcess(job)
    strict = WorkerProcess(job, report=Exception)
    try:
        assert reporting.run("exit")[0] == "error"  # SystemExit is sent back
        assert strict.run("exit") == ("died", 3)  # SystemExit ends the process
    finally:
        reporting.stop()
        strict.stop()


def test_each_job_in_its_own_process_several_at_once():
    jobs = [1, "crash", 2, "raise", 3]
    with contextlib.closing(run_each_in_a_process(jobs, job, (100,), at_once=3)) as ends:
        found = dict(ends)
    assert found[1] == ("ok", 101) and found[2] == ("ok", 102) and found[3] == ("ok", 103)
    assert found["crash"] == ("died", 70)
    assert found["raise"][0] == "error" and isinstance(found["raise"][1], ValueError)


def test_a_failed_task_is_retried_once_in_a_fresh_process():
    ray, retried = FakeRay(), []
    jobs = ["fine", "crash-once", "always", "bad-result"]
    ends = list(
        tasks_with_one_retry(
            ray,
            flaky,
            jobs,
            lambda name, attempt: (name, attempt),
            {"num_cpus": 2},
            failed=lambda r: None if r["status"] == "ok" else r["reason"],
            on_retry=lambda name, why: retried.append((name, why)),
        )
    )
    by_job = {e.job: e for e in ends}
    assert set(by_job) == set(jobs)
    assert by_job["fine"].attempt == 1 and by_job["fine"].result["status"] == "ok"
    assert by_job["crash-once"].attempt == 2 and by_job["crash-once"].error is None
    assert by_job["bad-result"].attempt == 2 and by_job["bad-result"].result["attempt"] == 2
    assert by_job["always"].attempt == 2
    assert str(by_job["always"].error).startswith("broken on attempt 2")
    assert dict(retried) == {
        "crash-once": "the process running it died (WorkerCrashedError)",
        "always": "RuntimeError: broken on attempt 1",
        "bad-result": "sticky",
    }
    first = [o for o, args in ray.calls if args[1] == 1]
    again = [o for o, args in ray.calls if args[1] == 2]
    assert all(o == {"max_retries": 0, "num_cpus": 2} for o in first)
    assert all(o == {"max_retries": 0, "max_calls": 1, "num_cpus": 2} for o in again)
    assert len(again) == 3


def test_ctrl_c_stops_what_is_pending_as_ctrl_c_then_kills_it():
    ray = StoppingRay(finishing=())
    ends = tasks_with_one_retry(
        ray, flaky, ["a", "b", "c"], lambda n, a: (n, a), {}, stop_wait_s=7.0
    )
    assert next(ends).pending == 2
    with pytest.raises(KeyboardInterrupt):
        ends.throw(KeyboardInterrupt)
    # first as Ctrl-C (a KeyboardInterrupt in the task: a training checkpoints), waited for,
    # then killed
    assert [force for _, force in ray.cancelled] == [False, False, True, True]
    assert ray.waited[-1] == 7.0


def test_a_task_that_finishes_while_the_others_stop_is_kept():
    ray = StoppingRay(finishing=("c",))
    ends = tasks_with_one_retry(ray, flaky, ["a", "b", "c"], lambda n, a: (n, a), {})
    assert next(ends).job == "a"
    kept = ends.throw(KeyboardInterrupt)  # its result comes out before the interrupt goes on
    assert kept.job == "c" and kept.result["status"] == "ok"
    with pytest.raises(KeyboardInterrupt):
        next(ends)
    assert [(ref.value["name"], force) for ref, force in ray.cancelled] == [
        ("b", False),
        ("c", False),
        ("b", True),
    ]  # only the one still running is killed


def test_error_reason_is_one_line():
    assert error_reason(ValueError("")) == "ValueError"
    assert error_reason(ValueError("x" * 500 + "\nmore")) == "ValueError: " + "x" * 200


def test_a_few_workers_share_the_jobs_and_give_results_in_order():
    from attnbench.runtime.processes import map_in_workers

    assert list(map_in_workers(range(7), job, (1,), workers=3)) == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize(("bad", "error"), [("raise", ValueError), ("crash", Exception)])
def test_a_failed_job_of_the_workers_raises_once_they_are_stopped(bad, error):
    from attnbench.runtime.processes import map_in_workers

    got = []
    with pytest.raises(error) as caught:
        for result in map_in_workers([1, 2, bad, 4], job, (0,), workers=2):
            got.append(result)
    assert got in ([], [1], [1, 2])  # in order, and nothing after the failed job
    if bad == "crash":
        assert "exited with code 70" in str(caught.value)


def test_one_unit_record_lists_and_shards_both_experiments_units():
    from dataclasses import dataclass, field

    from attnbench.runtime.units import Unit, shard_units

    @dataclass(frozen=True)
    class Timing(Unit):  # an experiment's unit: its own fields, listed after index, id, kind
        mechanism: str
        kind: str = field(default="timing", kw_only=True)

        def details(self):
            return {"mechanism": self.mechanism}

    units = [Timing(i, f"t{i}", m) for i, m in enumerate("abc")]
    units.append(Unit(3, "evaluate", kind="evaluation", needs=("t0", "t1", "t2"), done=False))
    assert [u.shard_of(2) for u in units] == [0, 1, 0, 1]
    assert [u.id for u in shard_units(units, (1, 2))] == ["t1", "evaluate"]
    assert shard_units(units, None) == units
    assert units[1].as_dict() == {"index": 1, "id": "t1", "kind": "timing", "mechanism": "b"}
    assert units[3].as_dict((0, 3)) == {
        "index": 3, "id": "evaluate", "kind": "evaluation", "needs": ["t0", "t1", "t2"],
        "done": False, "shard": 0,
    }  # fmt: skip
    assert list(units[3].as_dict()) == ["index", "id", "kind", "needs", "done"]  # key order kept
    with pytest.raises(TypeError):  # the kind is required, by keyword
        Unit(0, "x")
