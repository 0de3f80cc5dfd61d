"""Work in spawned processes on this machine, for both experiments: a crash (a segfault, a sticky
CUDA error, an ``exit``) fails only the job its process was running, and the driver notices.

:class:`WorkerProcess` runs ``fn(job, *args)`` for each job sent to it, one after another, and
sends back ``("ok", result)`` or ``("error", exception)``; its death reads as ``("died", exit
code)``. The speed sweep keeps one worker for unit after unit (a fresh one after a failure);
:func:`run_each_in_a_process` gives every job its own process, several at once (the trainings of
an extrapolation run); :func:`map_in_workers` shares jobs out among a few long-lived workers and
gives the results back in order (its evaluations). No torch here.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing import connection
from typing import Any

from attnbench.core.errors import AttnbenchError
from attnbench.runtime import logs
from attnbench.runtime.engines import died_reason

#: What a job ended as: ("ok", result), ("error", exception) or ("died", exit code).
Outcome = tuple[str, Any]


def _serve(conn, fn: Callable[..., Any], args: tuple, ignore_sigint: bool, report: type) -> None:
    """A worker process: run the jobs it is sent until it is sent None. An exception of type
    ``report`` goes back to the driver; any other ends the process (a death the driver sees).
    attnbench's log messages show on this process's standard error, as in the driver's."""
    logs.show_on_stderr()
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides what Ctrl-C stops
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            reply: Outcome = ("ok", fn(job, *args))
        except report as e:
            reply = ("error", _picklable(e))
        conn.send(reply)


def _picklable(e: BaseException) -> BaseException:
    try:
        pickle.dumps(e)
    except Exception:
        return AttnbenchError(f"{type(e).__name__}: {e}")
    return e


class WorkerProcess:
    """One spawned process that runs ``fn(job, *args)`` for each job it is sent.

    ``ignore_sigint``: the worker ignores Ctrl-C and the driver decides (the speed sweep); else it
    gets Ctrl-C with the driver (a training writes its checkpoint and stops). ``report``: the
    exceptions sent back as ``("error", e)``; any other (``SystemExit``, say) ends the process.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        *,
        ignore_sigint: bool = False,
        report: type[BaseException] = BaseException,
    ):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        work = (child, fn, args, ignore_sigint, report)
        self.proc = ctx.Process(target=_serve, args=work, daemon=True)
        self.proc.start()
        child.close()
        self.job: Any = None

    def send(self, job: Any) -> None:
        """Start ``job`` (the previous one must have ended)."""
        self.job = job
        self.conn.send(job)

    def outcome(self, wait_s: float = 0.0) -> Outcome | None:
        """How the job sent last ended, or None while it runs (waiting up to ``wait_s``)."""
        try:
            if self.conn.poll(wait_s):
                return self.conn.recv()
        except (EOFError, OSError):  # the worker died mid-reply, or before (reset pipe)
            pass
        if self.proc.is_alive():
            return None
        self.proc.join()
        return ("died", self.proc.exitcode)

    def run(self, job: Any) -> Outcome:
        """Send ``job`` and wait for its outcome."""
        self.send(job)
        while (found := self.outcome()) is None:
            wait_for_any([self])
        return found

    def stop(self, wait_s: float = 10.0, kill: bool = False) -> None:
        """Ask the worker to end (unless ``kill``), wait up to ``wait_s``, then kill it."""
        if self.proc.is_alive() and not kill:
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.proc.join(timeout=wait_s)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


def wait_for_any(workers: Iterable[WorkerProcess]) -> None:
    """Block until one of ``workers`` has something to say: a reply, or its end."""
    connection.wait([x for w in workers for x in (w.conn, w.proc.sentinel)])


def run_each_in_a_process(
    jobs: Sequence[Any],
    fn: Callable[..., Any],
    args: tuple = (),
    *,
    at_once: int = 1,
    stop_wait_s: float = 60.0,
) -> Iterator[tuple[Any, Outcome]]:
    """``fn(job, *args)`` for every job, ``at_once`` at a time, each in a fresh spawned process;
    yields ``(job, outcome)`` as each ends. On Ctrl-C the workers (which got it too) are given
    ``stop_wait_s`` to finish what they write, then killed; on any other exception, or when
    the caller stops iterating, they are terminated at once."""
    queue, running = list(jobs), []
    try:
        while queue or running:
            while queue and len(running) < at_once:
                worker = WorkerProcess(fn, args)
                worker.send(queue.pop(0))
                running.append(worker)
            wait_for_any(running)
            for worker in list(running):
                found = worker.outcome()
                if found is None:
                    continue
                running.remove(worker)
                worker.stop(wait_s=1.0)
                yield worker.job, found
    except KeyboardInterrupt:
        for worker in running:  # they got the Ctrl-C too: let them write what they write
            worker.proc.join(stop_wait_s)
        raise
    finally:
        for worker in running:
            worker.stop(wait_s=0.0, kill=True)


def map_in_workers(
    jobs: Sequence[Any], fn: Callable[..., Any], args: tuple = (), *, workers: int
) -> Iterator[Any]:
    """``fn(job, *args)`` for every job on ``workers`` long-lived worker processes (each receives
    ``args`` once, when it starts), the results yielded in the order of ``jobs``. A job that
    raises, or a worker that dies, raises here once every worker is stopped (Ctrl-C too)."""
    jobs = list(jobs)
    pool = [WorkerProcess(fn, args) for _ in range(min(workers, len(jobs)))]
    busy: dict[WorkerProcess, int] = {}
    finished: dict[int, Any] = {}
    sent = given = 0
    try:
        while given < len(jobs):
            for worker in pool:
                if worker not in busy and sent < len(jobs):
                    worker.send(jobs[sent])
                    busy[worker], sent = sent, sent + 1
            if busy:
                wait_for_any(busy)
            for worker, index in list(busy.items()):
                found = worker.outcome()
                if found is not None:
                    del busy[worker]
                    finished[index] = _result(found)
            while given in finished:
                yield finished.pop(given)
                given += 1
    finally:
        for worker in pool:
            worker.stop(wait_s=10.0, kill=given < len(jobs))


def _result(outcome: Outcome) -> Any:
    kind, value = outcome
    if kind == "error":
        raise value
    if kind == "died":
        raise AttnbenchError(died_reason(value, "running a job of the pool"))
    return value
