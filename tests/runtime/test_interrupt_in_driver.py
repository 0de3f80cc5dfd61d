"""Ctrl-C that lands in the driver's own code while worker processes run (while it logs or
records a result the runtime handed over: :func:`attnbench.runtime.execute.run_units`): the
running workers are still asked to stop (a training saves its checkpoint), not killed, and what
they give back while stopping is still handled.

The jobs below run in spawned worker processes (which import this module): seed 0 ends at
once, the others "train" until SIGTERM, then save and raise Interrupted, as a training does."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from attnbench.runtime.execute import Executor, Work, run_units
from attnbench.runtime.processes import consume
from tests.helpers.stopping_jobs import Job, Variant

READY = ".ready"  # a training that waits for SIGTERM says so with this file beside its checkpoint


def finish_or_save(job: Job, attempt: int = 1) -> str:
    """Seed 0 returns once every other job is ready for SIGTERM (so that it ends while they
    run); the others wait for SIGTERM, take a while to save, then raise Interrupted."""
    from attnbench.extrapolation.training.loop import Interrupted

    if job.seed == 0:
        deadline = time.monotonic() + 60
        while not list(job.saved.parent.glob(f"*{READY}")) and time.monotonic() < deadline:
            time.sleep(0.02)
        return f"{job.variant.label} seed 0: trained"
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    job.saved.with_suffix(READY).write_text("")
    while not stop:
        time.sleep(0.02)
    time.sleep(0.5)  # saving
    job.saved.write_text("checkpoint")
    raise Interrupted(job.saved, 3, 10)


def two_jobs(folder: Path) -> list[Job]:
    return [Job(Variant("O"), seed, folder / f"O-seed{seed}.pt") for seed in (0, 1)]


# --------------------------------------------------------------------------------------------
# consume, with a pool made of plain Python
# --------------------------------------------------------------------------------------------


def pool_that_stops_gently(events: list[str]):
    """What a pool does, without processes: yields 1 and 2; a KeyboardInterrupt at a yield
    makes it "stop its workers" and yield what they gave back, then raise it."""
    try:
        yield 1
        yield 2
    except KeyboardInterrupt:
        events.append("asked the workers to stop")
        yield "saved while stopping"
        raise
    finally:
        events.append("closed")


def test_an_interrupt_in_the_handler_is_thrown_into_the_pool_at_its_yield():
    events, handled = [], []

    def handle(value):
        handled.append(value)
        if value == 1:
            raise KeyboardInterrupt  # Ctrl-C while the driver logs the first value

    with pytest.raises(KeyboardInterrupt):
        consume(pool_that_stops_gently(events), handle)
    assert handled == [1, "saved while stopping"]
    assert events == ["asked the workers to stop", "closed"]


def test_a_second_interrupt_while_the_pool_stops_ends_it():
    events, handled = [], []

    def handle(value):
        handled.append(value)
        raise KeyboardInterrupt  # Ctrl-C again, on what the stopping pool gave back

    with pytest.raises(KeyboardInterrupt):
        consume(pool_that_stops_gently(events), handle)
    assert handled == [1, "saved while stopping"]
    assert events == ["asked the workers to stop", "closed"]


def test_other_errors_in_the_handler_close_the_pool_without_a_stop():
    events = []

    def handle(value):
        raise ValueError("bad row")

    with pytest.raises(ValueError, match="bad row"):
        consume(pool_that_stops_gently(events), handle)
    assert events == ["closed"]


def test_without_interrupts_every_value_is_handled():
    events, handled = [], []
    consume(pool_that_stops_gently(events), handled.append)
    assert handled == [1, 2] and events == ["closed"]


def test_ctrl_c_while_the_driver_writes_a_ray_result_stops_the_other_tasks_as_ctrl_c():
    """The Ray pool (a stand-in for Ray): a Ctrl-C while the driver writes the first task's
    checkpoint stops the others as Ctrl-C does, and the one that finishes meanwhile is kept."""
    from attnbench.runtime.ray_tasks import tasks_with_one_retry
    from tests.helpers.fake_ray import StoppingRay, flaky

    ray, handled = StoppingRay(finishing=("c",)), []

    def write(end):
        handled.append(end.job)
        if end.job == "a":
            raise KeyboardInterrupt

    ends = tasks_with_one_retry(ray, flaky, ["a", "b", "c"], lambda n, a: (n, a), {})
    with pytest.raises(KeyboardInterrupt):
        consume(ends, write)
    assert handled == ["a", "c"]
    assert [(ref.value["name"], force) for ref, force in ray.cancelled] == [
        ("b", False),
        ("c", False),
        ("b", True),
    ]


# --------------------------------------------------------------------------------------------
# Worker processes
# --------------------------------------------------------------------------------------------


def test_ctrl_c_while_the_driver_handles_a_result_stops_the_running_worker_gently(tmp_path):
    from attnbench.extrapolation.training.loop import Interrupted

    jobs, handled = two_jobs(tmp_path), []

    def handle(end):
        handled.append(end)
        if len(handled) == 1:
            raise KeyboardInterrupt  # while the driver records the first result

    work = Work(finish_or_save, stops=(Interrupted, KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        run_units(jobs, work, Executor("local", at_once=2), handle)
    assert [end.job.seed for end in handled] == [0, 1]
    assert handled[0].ok and handled[0].result == "O seed 0: trained"
    stopped = handled[1]  # the second job got SIGTERM and saved: not killed
    assert stopped.stopped and isinstance(stopped.error, Interrupted)
    assert stopped.error.path == jobs[1].saved and jobs[1].saved.read_text() == "checkpoint"


def test_ctrl_c_while_a_finished_training_is_logged_lets_the_other_save(tmp_path):
    """The extrapolation run's driver: a Ctrl-C while it logs the first training's summary
    line ends as every Ctrl-C does, with the other training's checkpoint and its Interrupted."""
    from attnbench.extrapolation.experiment.units import train_in_processes
    from attnbench.extrapolation.training.loop import Interrupted

    jobs, lines = two_jobs(tmp_path), []

    def log(line: str) -> None:
        lines.append(line)
        if len(lines) == 1:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as stopped:
        try:
            train_in_processes(jobs, 2, finish_or_save, (), log)
        except KeyboardInterrupt:  # not pytest's own: fail this test, not the session
            pytest.fail("a bare KeyboardInterrupt: the other training was killed, not stopped")
    assert lines == ["O seed 0: trained"]
    assert stopped.value.path == jobs[1].saved and stopped.value.step == 3
    assert jobs[1].saved.read_text() == "checkpoint"
