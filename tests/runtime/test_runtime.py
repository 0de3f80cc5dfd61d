"""The runtime both experiments share: worker processes whose death is noticed, the one way to
run units (each in a worker process or as a Ray task, retried once in a fresh process), and Ray
tasks retried once (with a stand-in for Ray that records what it was asked)."""

from __future__ import annotations

import os
import sys

import pytest

from attnbench.runtime.execute import Executor, Work, _ray_ends, _Tally, run_units
from attnbench.runtime.processes import WorkerProcess
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


def unit(x, attempt, offset=0):
    """What the units run: ``x`` as for :func:`job`, or ``"die-once"`` (dies on attempt 1)."""
    if x == "die-once":
        return os._exit(70) if attempt == 1 else offset
    return job(x, offset)


def run(jobs, work, executor):
    """``run_units``'s ends and the ends it retried."""
    ends, retried = [], []
    run_units(jobs, work, executor, ends.append, on_retry=retried.append)
    return ends, retried


def test_each_unit_in_its_own_process_several_at_once_a_failed_one_retried_once():
    jobs = [1, "crash", 2, "raise", 3, "die-once"]
    ends, retried = run(jobs, Work(unit, (100,)), Executor("local", at_once=3))
    by = {e.job: e for e in ends}
    assert len(ends) == len(jobs) and [by[i].index for i in jobs] == list(range(len(jobs)))
    assert [(by[x].result, by[x].attempt) for x in (1, 2, 3)] == [(101, 1), (102, 1), (103, 1)]
    crash = by["crash"]
    assert crash.died and crash.exit_code == 70 and crash.attempt == 2 and not crash.ok
    assert "exited with code 70" in crash.reason
    assert isinstance(by["raise"].error, ValueError) and by["raise"].attempt == 2
    assert by["die-once"].ok and (by["die-once"].result, by["die-once"].attempt) == (100, 2)
    assert sorted(str(e.job) for e in retried) == ["crash", "die-once", "raise"]
    assert all(e.attempt == 1 for e in retried)
    last = max(ends, key=lambda e: e.done + e.failed)
    assert (last.done, last.failed, last.total) == (4, 2, 6)
    assert last.tally() == "[4 done, 0 running, 2 failed of 6]"


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


def test_a_few_long_lived_workers_share_the_units():
    ends, _ = run(list(range(7)), Work(unit, (1,)), Executor("local", at_once=3, keep_workers=True))
    assert sorted((e.index, e.result) for e in ends) == [(i, i + 1) for i in range(7)]


def test_a_result_that_says_it_failed_is_retried_in_a_fresh_process():
    work = Work(unit, (0,), failed=lambda result: "too big" if result > 5 else None)
    ends, retried = run([1, 9], work, Executor("local", keep_workers=True))
    by = {e.job: e for e in ends}
    assert by[1].ok and by[9].reason == "too big" and by[9].attempt == 2
    assert [(e.job, e.reason) for e in retried] == [(9, "too big")]


@pytest.mark.parametrize("bad", ["raise", "crash"])
def test_a_handler_that_raises_stops_the_units(bad):
    got = []

    def handle(end):
        if not end.ok:
            raise RuntimeError(f"unit {end.job} failed twice")
        got.append(end.result)

    with pytest.raises(RuntimeError, match=f"unit {bad} failed twice"):
        run_units([1, 2, bad, 4], Work(unit, (0,)), Executor("local", at_once=2), handle)
    assert set(got) <= {1, 2, 4}


def test_on_ray_each_unit_is_a_task_retried_once():
    """The Ray side of run_units, on the stand-in: shared arguments put once, the options of a
    first attempt and of a retry in a fresh process, the ends with their counts."""
    ray, retried = FakeRay(), []
    executor = Executor("ray", resources={"num_cpus": 2})
    jobs = ["fine", "crash-once", "always", "bad-result"]
    work = Work(flaky, failed=lambda r: None if r["status"] == "ok" else r["reason"])
    ends = list(_ray_ends(ray, jobs, work, executor, _Tally(len(jobs)), retried.append))
    by = {e.job: e for e in ends}
    assert by["fine"].ok and by["crash-once"].ok and by["crash-once"].attempt == 2
    assert by["always"].attempt == 2 and not by["always"].ok and not by["always"].died
    assert by["bad-result"].ok and by["bad-result"].result["attempt"] == 2
    assert {e.job: e.died for e in retried} == {"crash-once": True, "always": False,
                                               "bad-result": False}  # fmt: skip
    options = ({"max_retries": 0, "num_cpus": 2}, {"max_retries": 0, "max_calls": 1, "num_cpus": 2})
    assert all(o in options for o, _ in ray.calls)
    assert max(e.done for e in ends) == 3 and max(e.failed for e in ends) == 1


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
