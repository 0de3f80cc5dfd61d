"""Work in spawned processes on this machine, for both experiments: a crash (a segfault, a sticky
CUDA error, an ``exit``) fails only the job its process was running, and the driver notices.

:class:`WorkerProcess` runs ``fn(job, *args)`` for each job sent to it, one after another, and
sends back ``("ok", result)`` or ``("error", exception)``; its death reads as ``("died", exit
code)``. How units are shared out among such workers (one each, or a few long-lived ones),
retried and stopped is :mod:`attnbench.runtime.execute`'s. No torch here.

A worker dies with the process that started it (``kill -9`` of the driver: no orphan runs on
and later fails on the closed pipe); what a killed worker left half-written (a unit's staging
folder, a temporary file) is removed by the next run (:func:`attnbench.runtime.outputs.
remove_stale`). Ctrl-C, or SIGTERM sent to the driver alone, stops the workers the same way: each
is sent SIGTERM (a training checkpoints and stops, as on Ctrl-C) and given time to end. A driver
reads such a pool's outcomes with :func:`consume`, so that this holds for the whole time the
workers run, its own work on each outcome (a log line, a file written) included.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable
from multiprocessing import connection
from typing import Any, TypeVar

from attnbench.core.errors import AttnbenchError
from attnbench.runtime import logs

#: What a job ended as: ("ok", result), ("error", exception) or ("died", exit code).
Outcome = tuple[str, Any]
T = TypeVar("T")


#: prctl(2)'s option: the signal this process gets when the thread that started it ends.
PR_SET_PDEATHSIG = 1
#: How often a worker without prctl (not Linux) looks whether its driver still runs.
WATCH_PARENT_S = 1.0


def _serve(conn, fn: Callable[..., Any], args: tuple, ignore_sigint: bool, report: type,
           parent: int) -> None:  # fmt: skip
    """A worker process: run the jobs it is sent until it is sent None, or its driver (process
    ``parent``) is gone. An exception of type ``report`` goes back to the driver; any other ends
    the process (a death the driver sees). attnbench's log messages show on this process's
    standard error, as in the driver's."""
    die_with_parent(parent)
    logs.show_on_stderr()
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides what Ctrl-C stops
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the driver closed the pipe, or died
            return
        if job is None:
            return
        try:
            reply: Outcome = ("ok", fn(job, *args))
        except report as e:
            reply = ("error", _picklable(e))
        try:
            conn.send(reply)
        except OSError:  # BrokenPipeError: the driver is gone, nobody to tell; end quietly
            return


def die_with_parent(parent: int) -> None:
    """End this process when process ``parent`` ends, however it ends (a ``kill -9`` runs no
    cleanup there): on Linux the kernel sends SIGKILL (prctl PR_SET_PDEATHSIG); elsewhere a
    thread looks every WATCH_PARENT_S. The kernel's signal comes when the *thread* that started
    this process ends: workers are started from the driver's main thread."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0:
                if os.getppid() != parent:  # it died before prctl took effect
                    os._exit(1)
                return
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_PARENT_S)
    os._exit(1)


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
        work = (child, fn, args, ignore_sigint, report, os.getpid())
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

    def interrupt(self) -> None:
        """Ask the job to stop as Ctrl-C stops it, when only the driver got the signal (SIGTERM
        to the driver, or Ctrl-C where the workers were not in the terminal's process group): a
        training checkpoints and raises Interrupted; a worker with no handler for it ends."""
        if self.proc.is_alive() and self.proc.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid, signal.SIGTERM)

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


def consume(ends: Generator[T, None, Any], handle: Callable[[T], Any]) -> None:
    """``handle(value)`` for each value ``ends`` yields (a pool of worker processes' ends,
    :func:`attnbench.runtime.ray_tasks.tasks_with_one_retry`'s task ends).

    Why not a ``for`` loop: such a pool stops its workers gracefully on a Ctrl-C that lands
    inside it, while it waits; one that lands in the loop's body (the driver logging a result,
    writing a file) would close the pool and its workers would be killed with what they had not
    saved. Here a KeyboardInterrupt raised while ``ends`` is paused (in ``handle`` or between
    two values) is thrown into ``ends`` at its ``yield``, as if it had come while it waited: it
    asks its workers to stop, what it yields while they stop goes to ``handle`` too, and the
    interrupt comes out here once ``ends`` has ended with it. Any other exception from
    ``handle`` closes ``ends`` (its workers are killed) and comes out here."""
    advance: Callable[[], T] = ends.__next__
    with contextlib.closing(ends):
        while True:
            try:
                try:
                    value = advance()
                except StopIteration:
                    return
                advance = ends.__next__
                handle(value)
            except KeyboardInterrupt as e:
                if inspect.getgeneratorstate(ends) == inspect.GEN_CLOSED:
                    raise  # it came out of ``ends``: the pool has stopped
                advance = functools.partial(ends.throw, e)
