"""Ray tasks for both experiments: one task per job, and a job that fails is tried once more in a
fresh worker process.

:func:`tasks_with_one_retry` submits ``fn(*args_of(job, attempt))`` for every job, with the
job's resources, and yields each job's final :class:`TaskEnd` as it ends. A task fails when it
raises, when its process dies (Ray's ``WorkerCrashedError``), or when ``failed(result)`` names a
reason; the retry runs with ``max_calls=1``, so it starts in a process of its own. Ctrl-C (or
SIGTERM, which the CLI turns into it) stops the tasks still running as Ctrl-C stops a job here: a
training checkpoints and stops. Starting Ray and checking that a task fits a node:
:mod:`attnbench.runtime.engines`. No torch here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class TaskEnd:
    """How a job's last attempt ended: its result, or the exception that ended it."""

    job: Any
    attempt: int
    result: Any = None
    error: BaseException | None = None
    pending: int = 0  # tasks still running when this one ended


def error_reason(e: BaseException) -> str:
    """One line for a failed task: a dead process said as such, else the error's first line."""
    name = type(e).__name__
    if "WorkerCrashed" in name or "ActorDied" in name or "NodeDied" in name:
        return f"the process running it died ({name})"
    text = str(e).strip()
    return f"{name}: {text.splitlines()[0][:200]}" if text else name


def tasks_with_one_retry(
    ray,
    fn: Callable[..., Any],
    jobs: Sequence[Any],
    args_of: Callable[[Any, int], tuple],
    resources: dict[str, float],
    *,
    failed: Callable[[Any], str | None] = lambda result: None,
    on_retry: Callable[[Any, str], None] = lambda job, reason: None,
    stop_wait_s: float = 60.0,
) -> Iterator[TaskEnd]:
    """Run every job as a Ray task, retrying a failed one once in a fresh process; yield each
    job's final outcome as it ends (in the order they end). On Ctrl-C the tasks are stopped
    (:func:`stop_tasks`) and KeyboardInterrupt raised."""
    first = ray.remote(max_retries=0, **resources)(fn)
    again = ray.remote(max_retries=0, max_calls=1, **resources)(fn)
    pending = {first.remote(*args_of(job, 1)): (job, 1) for job in jobs}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            job, attempt = pending.pop(ready[0])
            end = TaskEnd(job, attempt)
            try:
                end.result = ray.get(ready[0])
            except Exception as e:  # the process died (WorkerCrashedError) or the task raised
                end.error = e
            reason = error_reason(end.error) if end.error is not None else failed(end.result)
            if reason and attempt == 1:
                on_retry(job, reason)
                pending[again.remote(*args_of(job, 2))] = (job, 2)
                continue
            end.pending = len(pending)
            yield end
    except KeyboardInterrupt:
        refs = list(pending)
        finished = stop_tasks(ray, refs, stop_wait_s)
        # A task that completed its job while the others stopped: its result is kept (the
        # driver writes it, as it would have), not thrown away with the interrupted ones.
        for ref in finished:
            job, attempt = pending.pop(ref)
            try:
                result = ray.get(ref)
            except Exception:  # cancelled, or stopped by the interrupt: nothing to keep
                continue
            yield TaskEnd(job, attempt, result=result, pending=len(pending))
        raise


def stop_tasks(ray, refs: list, wait_s: float) -> list:
    """Stop ``refs``' tasks as Ctrl-C stops a job: Ray raises KeyboardInterrupt in each running
    task (through its SIGINT handler: a training writes its checkpoint and stops) and drops the
    pending ones; those still running after ``wait_s`` (or a second Ctrl-C) are killed. Returns
    the refs that ended within the wait (their results may be whole)."""
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=False)
    ended: list = []
    try:
        if refs:
            ended, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
    finally:
        for ref in refs:
            if ref not in ended:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
    return list(ended)
