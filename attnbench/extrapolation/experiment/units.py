"""An extrapolation run as units (:class:`attnbench.runtime.units.Unit`, as the speed sweep's,
:mod:`attnbench.bench.units`): one unit per (variant, seed) training, in plan order (seed by seed,
variant by variant), each one its checkpoint; then one evaluation unit, which needs them all.

``--shard I/N`` trains the trainings whose unit number is I mod N into a checkpoint folder every
shard sees; the evaluation unit is ``--eval-only`` with the same options, once every shard is done.
``--executor ray`` runs each training as a Ray task (:func:`train_on_ray`), then evaluates here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError
from attnbench.runtime.engines import (
    check_fits,
    died_reason,
    inject_fault,
    ray_session,
)
from attnbench.runtime.outputs import write_bytes_once
from attnbench.runtime.processes import consume, run_each_in_a_process
from attnbench.runtime.ray_tasks import error_reason, tasks_with_one_retry
from attnbench.runtime.units import Unit


@dataclass(frozen=True)
class TrainingUnit(Unit):
    """One (variant, seed) training, into its checkpoint."""

    variant: str  # its label
    seed: int
    checkpoint: str
    kind: str = field(default="training", kw_only=True)

    def details(self) -> dict[str, Any]:
        return {"variant": self.variant, "seed": self.seed, "checkpoint": self.checkpoint}


def training_unit_id(file_stem: str, seed: int) -> str:
    """``train-O-seed0``: a training's unit id (its checkpoint is ``O-seed0.pt``)."""
    return f"train-{file_stem}-seed{seed}"


def unit_list(entries: Sequence[tuple]) -> list[Unit]:
    """The run's units (``--list-units``): its trainings, then the evaluation, which needs them
    all. ``entries``: the plan's (variant, seed, checkpoint path, key, checkpoint or None)."""
    units: list[Unit] = [
        TrainingUnit(
            i,
            training_unit_id(v.file_stem, seed),
            v.label,
            seed,
            str(path),
            done=bool(ckpt is not None and ckpt.get("done")),
        )
        for i, (v, seed, path, _key, ckpt) in enumerate(entries)
    ]
    needs = tuple(u.id for u in units)
    return [*units, Unit(len(units), "evaluate", kind="evaluation", needs=needs, done=False)]


# --------------------------------------------------------------------------------------------
# Worker processes on this machine
# --------------------------------------------------------------------------------------------


def train_in_processes(jobs, workers: int, fn, args: tuple, log) -> list:
    """``fn(job, *args)`` for every job, ``workers`` at once, each in its own spawned process (a
    segfault or an exit fails only its own job); logs each result. Returns the jobs whose process
    died. A job that raises makes this raise (the others are killed).

    Ctrl-C, or SIGTERM to this process alone, stops every running training as Ctrl-C stops one
    run here, wherever it lands while they run (logging a result too: :func:`consume`): each
    writes its checkpoint and stops; the others' are logged and the last one is raised
    (:class:`~attnbench.extrapolation.training.loop.Interrupted`, as a training here raises it),
    else KeyboardInterrupt."""
    from attnbench.extrapolation.training.loop import Interrupted

    died, interrupted = [], []
    stopping = False  # a worker was stopped by the signal: the others are stopping too

    def by_the_signal(outcome) -> bool:  # a worker's own Ctrl-C before its training began
        return isinstance(outcome[1], (Interrupted, KeyboardInterrupt))

    def record(end) -> None:
        nonlocal stopping
        job, (kind, value) = end
        name = f"{job.variant.label} seed {job.seed}"
        if kind == "ok":
            log(value)
        elif kind == "died":
            log(f"{name}: {_died(value)}")
            died.append(job)
        elif isinstance(value, Interrupted):
            interrupted.append((job, value))
            stopping = True
        elif isinstance(value, KeyboardInterrupt):
            log(f"{name}: stopped before its first checkpoint")
            stopping = True
        elif stopping:  # raising now would kill the workers still saving
            log(f"{name}: failed while the run stopped ({value})")
        else:
            raise value

    try:
        consume(run_each_in_a_process(jobs, fn, args, at_once=workers, stopped=by_the_signal),
                record)  # fmt: skip
    except KeyboardInterrupt:
        if not interrupted:
            raise
        for job, e in interrupted[:-1]:
            log(f"{job.variant.label} seed {job.seed}: {e}")
        raise interrupted[-1][1] from None
    return sorted(died, key=jobs.index)


def _stopped_trainings(jobs, since: float) -> list:
    """(job, Interrupted) for each of ``jobs`` that Ctrl-C stopped after it wrote a checkpoint
    during this run, where this process sees it (a Ray task writes its checkpoints where the
    driver said: here, or on a file system the nodes share): what to continue with --resume."""
    from attnbench.extrapolation.training.checkpoints import load_checkpoint
    from attnbench.extrapolation.training.loop import Interrupted

    found = []
    for job in jobs:
        if job.path.exists() and job.path.stat().st_mtime >= since:
            with contextlib.suppress(AttnbenchError):
                step = load_checkpoint(job.path)["step"]
                found.append((job, Interrupted(job.path, step, job.cfg.train.steps)))
    return found


def _died(exit_code: int | None) -> str:
    return died_reason(exit_code, "training it")


# --------------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------------


def _train_task(job, train_stream: Tensor, threads: int, retry_since: float | None):
    """A Ray task: one training (its checkpoints written as it goes, where the driver said);
    returns the summary line and the finished checkpoint's and curve's bytes, which the driver
    writes where they belong when its node does not see them (no shared file system).

    ``retry_since``: this is the retry of a training whose process died; continue from the
    checkpoint it left if that was written during this run (never from an older file)."""
    from attnbench.extrapolation.training import curves
    from attnbench.runtime.progress import Silent

    torch.set_num_threads(threads)
    inject_fault(job.unit_id, retry_since is None)
    line = job.after_crash(retry_since).run(train_stream, Silent())
    curve = curves.curve_path(job.path)
    return line, job.path.read_bytes(), curve.read_bytes() if curve.exists() else None


def train_on_ray(jobs, train_stream: Tensor, threads: int, device: torch.device,
                 address: str | None, log: Callable[[str], None]) -> set[Path]:  # fmt: skip
    """Each training a Ray task (one GPU each on a GPU; ``threads`` CPUs each on a CPU). A task
    whose process dies is retried once in a fresh process, from its last checkpoint; a training
    that fails twice fails alone, and is reported once the others are done."""
    with ray_session(address, log) as ray:
        log(f"{len(jobs)} trainings as Ray tasks")
        return _train_tasks(ray, jobs, train_stream, threads, device, log)


def _train_tasks(ray, jobs, train_stream, threads, device, log) -> set[Path]:
    from attnbench.extrapolation.training import curves

    if device.type == "cuda":
        resources = {"num_gpus": 1, "num_cpus": 1}
    else:
        resources = {"num_cpus": threads, "num_gpus": 0}
    check_fits(ray, resources)
    stream = ray.put(train_stream)
    started = time.time()
    ends = tasks_with_one_retry(
        ray,
        _train_task,
        jobs,
        lambda job, attempt: (job, stream, threads, None if attempt == 1 else started),
        resources,
        on_retry=lambda job, why: log(
            f"{job.variant.label} seed {job.seed}: {why}; retrying once in a fresh process"
        ),
    )
    failed, written = [], set()

    def record(end) -> None:  # writing a checkpoint here: Ctrl-C still stops the tasks gently
        job = end.job
        name = f"{job.variant.label} seed {job.seed}"
        if end.error is not None:
            failed.append(f"{name} ({error_reason(end.error)})")
            line = f"{name}: FAILED twice"
        else:
            line, ckpt_bytes, curve_bytes = end.result
            write_bytes_once(job.path, ckpt_bytes)
            write_bytes_once(curves.curve_path(job.path), curve_bytes)
            written.add(job.path)
        log(f"[{len(written)} done, {end.pending} running, {len(failed)} failed of {len(jobs)}] "
            f"{line}")  # fmt: skip

    try:
        consume(ends, record)
    except KeyboardInterrupt:
        stopped = _stopped_trainings([j for j in jobs if j.path not in written], started)
        if not stopped:
            raise
        for job, e in stopped[:-1]:
            log(f"{job.variant.label} seed {job.seed}: {e}")
        raise stopped[-1][1] from None
    if failed:
        raise AttnbenchError(
            f"{len(failed)} of {len(jobs)} trainings failed twice: {'; '.join(failed)}; the "
            "others are saved: run again with --resume"
        )
    return written
