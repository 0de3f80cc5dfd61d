"""An extrapolation run as units (:class:`attnbench.runtime.units.Unit`, as the speed sweep's,
:mod:`attnbench.bench.units`): one unit per (variant, seed) training, in plan order (seed by seed,
variant by variant), each one its checkpoint; then one evaluation unit, which needs them all.

``--shard I/N`` trains the trainings whose unit number is I mod N into a checkpoint folder every
shard sees; the evaluation unit is ``--eval-only`` with the same options, once every shard is done.
The trainings run as units of the runtime (:func:`run_trainings`: worker processes here, or a Ray
task each with ``--executor ray``), then the evaluation here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attnbench.core.errors import AttnbenchError
from attnbench.runtime.engines import died_reason
from attnbench.runtime.execute import Executor, UnitEnd, Work, run_units
from attnbench.runtime.outputs import write_bytes_once
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
# The trainings as units of the runtime
# --------------------------------------------------------------------------------------------


def train_in_processes(jobs, workers: int, fn, args: tuple, log) -> set[Path]:
    """``fn(job, attempt, *args)`` for every training job, ``workers`` at once, each in its own
    spawned process on this machine (:func:`run_trainings`)."""
    return run_trainings(jobs, Work(fn, args), Executor("local", at_once=workers), log)


def run_trainings(jobs, work: Work, executor: Executor, log) -> set[Path]:
    """The trainings ``jobs`` (each with ``variant``, ``seed`` and ``path``, its checkpoint) as
    units of the runtime (:func:`attnbench.runtime.execute.run_units`), with ``work``'s function
    and arguments, where ``executor`` says; returns the checkpoints written. A training whose
    process dies, or that fails, is retried once in a fresh process (from the checkpoint it
    wrote in this run); one that fails twice fails alone, reported once the others are done.

    Ctrl-C, or SIGTERM to this process alone, stops every running training as Ctrl-C stops one
    run here, wherever it lands while they run (logging a result too): each writes its
    checkpoint and stops; the others' are logged and the last one is raised
    (:class:`~attnbench.extrapolation.training.loop.Interrupted`, as a training here raises it),
    else KeyboardInterrupt."""
    from attnbench.extrapolation.training.loop import Interrupted

    trainings = _Trainings(jobs, executor.kind == "ray", log)
    work = replace(work, stops=(Interrupted, KeyboardInterrupt), unit_id=_unit_id,
                   died=_died)  # fmt: skip
    try:
        run_units(jobs, work, executor, trainings.end, on_retry=trainings.retry, log=log)
    except KeyboardInterrupt:
        trainings.stopped(executor.kind == "ray")
    if trainings.failures:
        raise AttnbenchError(
            f"{'; '.join(trainings.failures)}; the other trainings are saved: run again with "
            "--resume"
        )
    return trainings.written


def _unit_id(job) -> str:
    return job.unit_id


def _died(exit_code: int | None) -> str:
    return died_reason(exit_code, "training it")


def _name(job) -> str:
    return f"{job.variant.label} seed {job.seed}"


class _Trainings:
    """What the run makes of its trainings' ends: the checkpoints written (a Ray task's bytes
    written here), a line each, the trainings stopped by Ctrl-C and those that failed twice."""

    def __init__(self, jobs, remote: bool, log) -> None:
        self.jobs, self.remote, self.log = jobs, remote, log
        self.written: set[Path] = set()
        self.interrupted: list = []  # (job, Interrupted)
        self.failures: list[str] = []
        self.stopping = False  # a training was stopped by Ctrl-C: the others are stopping too
        self.started = time.time()

    def retry(self, end: UnitEnd) -> None:
        what = "a worker process died" if end.died else end.reason
        self.log(f"{_name(end.job)}: {what}; retrying once in a fresh process, from the "
                 "checkpoint this run wrote")  # fmt: skip

    def end(self, end: UnitEnd) -> None:
        from attnbench.extrapolation.training import curves

        job, name = end.job, _name(end.job)
        if end.stopped:
            self.stopping = True
            if isinstance(end.error, KeyboardInterrupt):
                self.log(f"{name}: stopped before its first checkpoint")
            else:
                self.interrupted.append((job, end.error))
        elif not end.ok:
            if self.stopping:  # the run stops: it failed while stopping, nothing to retry
                self.log(f"{name}: failed while the run stopped ({end.reason})")
                return
            self.failures.append(f"training {name} {'died' if end.died else 'failed'} twice "
                                 f"({end.reason})")  # fmt: skip
            self.log(f"{end.tally()} {name}: FAILED twice")
        elif self.remote:  # writing a checkpoint here: Ctrl-C still stops the tasks gently
            line, ckpt_bytes, curve_bytes = end.result
            write_bytes_once(job.path, ckpt_bytes)
            write_bytes_once(curves.curve_path(job.path), curve_bytes)
            self.written.add(job.path)
            self.log(f"{end.tally()} {line}")
        else:
            self.written.add(job.path)
            self.log(end.result)

    def stopped(self, remote: bool) -> None:
        """After Ctrl-C: the trainings stopped with a checkpoint are logged, the last one
        raised (a Ray task's, found by the checkpoint it wrote during this run)."""
        stopped = self.interrupted
        if not stopped and remote:
            stopped = _stopped_trainings([j for j in self.jobs if j.path not in self.written],
                                         self.started)  # fmt: skip
        if not stopped:
            raise KeyboardInterrupt
        for job, e in stopped[:-1]:
            self.log(f"{_name(job)}: {e}")
        raise stopped[-1][1] from None


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
