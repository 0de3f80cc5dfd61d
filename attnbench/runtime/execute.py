"""One way to run units, for both experiments: :func:`run_units`.

An experiment supplies what one unit does (:class:`Work`: a module-level function of the unit,
its attempt and the run's shared arguments, and how to read its result) and what it makes of each
unit's end (``handle``: a record written, a row kept, a line logged); this module does the rest:

- **where**: :class:`Executor` ``local`` runs each unit in a worker process on this machine,
  ``at_once`` at a time (:class:`~attnbench.runtime.processes.WorkerProcess`; a crash fails only
  its unit), either a fresh process per unit or, with ``keep_workers``, a few long-lived ones
  (fresh after a failure); ``ray`` runs each as a Ray task with the given resources (one GPU
  each on a GPU), after checking that a node can hold it (:mod:`attnbench.runtime.engines`);
- **retries**: a unit whose process dies, that raises, or whose result :attr:`Work.failed` says
  failed is tried once more in a fresh process (``on_retry`` is told why); its second end is
  final, failed or not;
- **progress**: every end comes with the counts so far (:meth:`UnitEnd.tally`: ``[3 done, 1
  running, 0 failed of 4]``);
- **Ctrl-C** (or SIGTERM, which the command line turns into it), wherever it lands while units
  run, the handler's own work included (:func:`~attnbench.runtime.processes.consume`): no unit
  starts any more, the running ones are asked to stop as Ctrl-C stops one here (SIGTERM to a
  worker process, KeyboardInterrupt in a Ray task: a training writes its checkpoint) and given
  ``stop_wait_s``; the ends of those that finish in time are handed over, then KeyboardInterrupt
  is raised. A unit whose end is one of :attr:`Work.stops` (a worker that got Ctrl-C itself)
  stops the run the same way.

Fault injection for the tests of crash isolation (``ATTNBENCH_FAULT``,
:func:`attnbench.runtime.engines.inject_fault`) happens here, in the worker, before the unit
runs. No torch here.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing import connection
from typing import Any, NamedTuple

from attnbench.runtime.engines import (
    check_executor,
    check_fits,
    died_reason,
    inject_fault,
    ray_session,
)
from attnbench.runtime.processes import WorkerProcess, consume, wait_for_any
from attnbench.runtime.ray_tasks import error_reason, tasks_with_one_retry


def _never(result: Any) -> str | None:
    return None


@dataclass(frozen=True)
class Work:
    """What one unit does, supplied by the experiment.

    ``fn(job, attempt, *args)`` runs the unit in a worker process (``attempt`` 1, or 2 for the
    retry); it and ``args`` are sent to each worker once, so they must pickle (a module-level
    function). ``remote_fn``, the same on a Ray node, which may not share this file system (it
    returns what the handler writes here); None: ``fn``.
    """

    fn: Callable[..., Any]
    args: tuple = ()
    remote_fn: Callable[..., Any] | None = None
    #: A result that says its unit failed: the reason (the unit is retried), or None.
    failed: Callable[[Any], str | None] = _never
    #: Errors that mean the unit was stopped by Ctrl-C (not retried; they stop the run).
    stops: tuple[type[BaseException], ...] = ()
    #: A unit's id, stable across runs (log lines, fault injection).
    unit_id: Callable[[Any], str] = str
    #: How a raised error reads in a reason (default: its type and first line).
    reason_of: Callable[[BaseException], str] = error_reason
    #: How a process that ran the unit and died reads in a reason (its exit code, or None).
    died: Callable[[int | None], str] = died_reason


@dataclass(frozen=True)
class Executor:
    """Where units run: ``local`` (worker processes here) or ``ray`` (a Ray task each)."""

    kind: str = "local"
    #: local: units at once, each in its own worker process.
    at_once: int = 1
    #: local: a worker runs unit after unit (fresh after a failure) instead of one unit each.
    keep_workers: bool = False
    #: local: workers ignore Ctrl-C and the driver decides (else they get it too, with the
    #: driver, and stop as a unit here would).
    driver_stops: bool = False
    #: local: the exceptions a worker sends back as the unit's error; any other ends its process.
    report: type[BaseException] = BaseException
    #: ray: the cluster to join (None: a Ray instance started here).
    ray_address: str | None = None
    #: ray: what one task needs (``num_cpus``, ``num_gpus``).
    resources: Mapping[str, float] = field(default_factory=dict)
    #: Seconds the running units are given to stop after Ctrl-C.
    stop_wait_s: float = 60.0


@dataclass
class UnitEnd:
    """How a unit ended: its job (``index`` in the list run), its last attempt, the result or
    the error it raised, and why it failed ("" when it did not)."""

    job: Any
    index: int
    attempt: int
    result: Any = None
    error: BaseException | None = None
    reason: str = ""
    died: bool = False  # its process died (the reason says how)
    exit_code: int | None = None  # of the process that died
    stopped: bool = False  # it was stopped by Ctrl-C (its error is one of Work.stops)
    done: int = 0  # the counts once this end is counted
    failed: int = 0
    running: int = 0
    total: int = 0

    @property
    def ok(self) -> bool:
        return not self.reason and self.error is None

    def tally(self) -> str:
        """``[3 done, 1 running, 0 failed of 4]``."""
        return (f"[{self.done} done, {self.running} running, {self.failed} failed of "
                f"{self.total}]")  # fmt: skip


def run_units(
    jobs: Sequence[Any],
    work: Work,
    executor: Executor,
    handle: Callable[[UnitEnd], Any],
    *,
    on_retry: Callable[[UnitEnd], Any] = lambda end: None,
    log: Callable[[str], None] = lambda line: None,
) -> None:
    """Run every job as a unit (see the module docstring), ``handle(end)`` for each final end as
    it comes. A handler that raises stops the run (its workers killed) and the error comes out
    here; so does KeyboardInterrupt, once the running units have stopped."""
    check_executor(executor.kind)
    if not jobs:
        return
    tally = _Tally(len(jobs))
    if executor.kind == "ray":
        with ray_session(executor.ray_address, log) as ray:
            check_fits(ray, dict(executor.resources))
            consume(_ray_ends(ray, jobs, work, executor, tally, on_retry), handle)
    else:
        consume(_local_ends(jobs, work, executor, tally, on_retry), handle)


class _Tally:
    """The counts of the ends so far."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.failed = total, 0, 0

    def count(self, end: UnitEnd, running: int) -> UnitEnd:
        if end.ok:
            self.done += 1
        elif not end.stopped:
            self.failed += 1
        end.done, end.failed, end.running, end.total = self.done, self.failed, running, self.total
        return end


# --------------------------------------------------------------------------------------------
# Worker processes on this machine
# --------------------------------------------------------------------------------------------


class _Sent(NamedTuple):
    """What a worker process is sent: one attempt of one unit."""

    job: Any
    index: int
    attempt: int
    unit_id: str


def _attempt(sent: _Sent, fn: Callable[..., Any], *args: Any) -> Any:
    """A worker's job: one attempt of one unit (the fault injection of the tests first)."""
    inject_fault(sent.unit_id, sent.attempt == 1)
    return fn(sent.job, sent.attempt, *args)


def _end(sent: _Sent, outcome: tuple[str, Any], work: Work) -> UnitEnd:
    """A worker's outcome (``("ok", result)``, ``("error", e)``, ``("died", code)``) as an end."""
    kind, value = outcome
    end = UnitEnd(sent.job, sent.index, sent.attempt)
    if kind == "died":
        end.reason, end.died, end.exit_code = work.died(value), True, value
    elif kind == "error":
        end.error, end.stopped = value, isinstance(value, work.stops)
        end.reason = work.reason_of(value)
    else:
        end.result, end.reason = value, work.failed(value) or ""
    return end


def _local_ends(jobs, work: Work, ex: Executor, tally: _Tally, on_retry) -> Iterator[UnitEnd]:
    queue = collections.deque((job, i, 1) for i, job in enumerate(jobs))
    idle: list[WorkerProcess] = []
    running: list[WorkerProcess] = []
    try:
        while queue or running:
            while queue and len(running) < max(1, ex.at_once):
                job, index, attempt = queue.popleft()
                worker = idle.pop() if idle else WorkerProcess(
                    _attempt, (work.fn, *work.args), ignore_sigint=ex.driver_stops,
                    report=ex.report,
                )  # fmt: skip
                worker.send(_Sent(job, index, attempt, work.unit_id(job)))
                running.append(worker)
            wait_for_any(running)
            for worker, found in _ended(running):
                end = _end(worker.job, found, work)
                if end.ok and ex.keep_workers:
                    idle.append(worker)
                else:  # one unit each, or a fresh process after a failure
                    worker.stop(wait_s=1.0, kill=not end.ok)
                if end.reason and not end.stopped and end.attempt == 1:
                    on_retry(end)
                    queue.appendleft((end.job, end.index, 2))
                    continue
                yield tally.count(end, len(running))
                if end.stopped:
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        yield from _stop_all(running, work, ex.stop_wait_s, tally)
        raise
    finally:
        for worker in running:
            worker.stop(wait_s=0.0, kill=True)
        for worker in idle:
            worker.stop()


def _ended(running: list[WorkerProcess]) -> Iterator[tuple[WorkerProcess, tuple[str, Any]]]:
    """The workers of ``running`` whose unit has ended, with its outcome (each taken out)."""
    for worker in list(running):
        found = worker.outcome()
        if found is not None:
            running.remove(worker)
            yield worker, found


def _stop_all(running: list[WorkerProcess], work: Work, wait_s: float,
              tally: _Tally) -> Iterator[UnitEnd]:  # fmt: skip
    """Ask the running units to stop as Ctrl-C does (SIGTERM to each worker) and hand over the
    ends of those that finish within ``wait_s`` (not those the signal killed); a second Ctrl-C
    ends the wait."""
    for worker in running:
        worker.interrupt()
    deadline = time.monotonic() + wait_s
    while running and (left := deadline - time.monotonic()) > 0:
        connection.wait([x for w in running for x in (w.conn, w.proc.sentinel)], timeout=left)
        for worker, found in _ended(running):
            worker.stop(wait_s=1.0)
            if found[0] != "died":
                yield tally.count(_end(worker.job, found, work), len(running))


# --------------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------------


def _attempt_task(job: Any, attempt: int, unit_id: str, fn: Callable[..., Any], *args: Any):
    """A Ray task: one attempt of one unit (the fault injection of the tests first)."""
    inject_fault(unit_id, attempt == 1)
    return fn(job, attempt, *args)


def _ray_ends(ray, jobs, work: Work, ex: Executor, tally: _Tally, on_retry) -> Iterator[UnitEnd]:
    fn = work.remote_fn or work.fn
    shared = [ray.put(a) for a in work.args]  # each sent once to the object store
    indexed = list(enumerate(jobs))

    def retried(pair, reason: str) -> None:
        index, job = pair
        on_retry(UnitEnd(job, index, 1, reason=reason, died=_crashed(reason)))

    ends = tasks_with_one_retry(
        ray,
        _attempt_task,
        indexed,
        lambda pair, attempt: (pair[1], attempt, work.unit_id(pair[1]), fn, *shared),
        dict(ex.resources),
        failed=work.failed,
        on_retry=retried,
        stop_wait_s=ex.stop_wait_s,
    )
    for task in ends:
        index, job = task.job
        end = UnitEnd(job, index, task.attempt)
        if task.error is not None:
            end.error, end.reason = task.error, work.reason_of(task.error)
            end.died = _crashed(error_reason(task.error))
        else:
            end.result, end.reason = task.result, work.failed(task.result) or ""
        yield tally.count(end, task.pending)


def _crashed(reason: str) -> bool:
    """Whether a Ray task's reason (:func:`error_reason`) says its process died."""
    return reason.startswith("the process running it died")
