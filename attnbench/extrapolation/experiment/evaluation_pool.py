"""Evaluation tasks run here, or in a pool of worker processes.

The whole interface is :func:`evaluate_tasks`. It takes any picklable task with a
``run(stream, train_stream, log) -> list[dict]`` method (:class:`Task`; the run's are
:class:`attnbench.extrapolation.experiment.evaluations.EvalTask`) and yields each task's rows
in the order of the tasks:

- ``layout = (processes, threads)`` with fewer than two processes (or fewer than two tasks): each
  task runs here, in this process, as the caller iterates;
- otherwise ``min(processes, len(tasks))`` worker processes are spawned
  (:func:`attnbench.runtime.processes.map_in_workers`), each started once with the evaluation
  span, the training text (the count baseline needs it) and ``threads`` torch threads; the tasks
  go to them in order.

A task that raises, or a worker that dies, makes the iteration raise (the workers are stopped
first); so does Ctrl-C.
Workers log through :mod:`attnbench.runtime.logs`; ``log`` is called in this process only: the
line saying how many processes run, or the log of the tasks run here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from attnbench.extrapolation.evaluation.evaluate import EvalStream
from attnbench.runtime import logs
from attnbench.runtime.processes import map_in_workers

#: What a task gives back: its rows (one dict per row).
Rows = list[dict[str, Any]]


class Task(Protocol):
    """One evaluation the pool can run (picklable, so a worker process can receive it)."""

    def run(self, stream: EvalStream, train_stream: Tensor, log: Callable[[str], None]) -> Rows: ...


def _eval_in_worker(task: Task, stream: EvalStream, train_stream: Tensor, threads: int) -> Rows:
    torch.set_num_threads(threads)
    return task.run(stream, train_stream, logs.info)


def evaluate_tasks(
    tasks: Sequence[Task],
    stream: EvalStream,
    train_stream: Tensor,
    layout: tuple[int, int],
    log: Callable[[str], None],
) -> Iterator[Rows]:
    """Each task's rows, in the order of ``tasks``: here, or with ``layout`` = (processes,
    threads each) of two or more, in that many worker processes at once (spawned; each gets
    the evaluation span and the training text once). A failed evaluation raises here."""
    workers, threads = layout
    workers = min(workers, len(tasks))
    if workers < 2:
        for task in tasks:
            yield task.run(stream, train_stream, log)
        return
    log(f"evaluating {len(tasks)} models, eval-time rows and baselines: {workers} at once, "
        f"{threads} thread{'s' * (threads > 1)} each")  # fmt: skip
    yield from map_in_workers(
        tasks, _eval_in_worker, (stream, train_stream, threads), workers=workers
    )
