"""The run's trainings: one :class:`TrainJob` per (variant, seed), run here, as units of the
runtime (:func:`attnbench.extrapolation.experiment.units.run_trainings`: worker processes on a
CPU, where a process that dies takes down only its own training, which is retried once from its
checkpoint; or Ray tasks with ``--executor ray``), or data-parallel under torchrun; and the
training curves, gathered into ``<out>/curves.csv`` as the trainings finish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.experiment import units
from attnbench.extrapolation.experiment.config import ExtrapConfig, TrainedVariant
from attnbench.extrapolation.experiment.plan import (
    Plan,
    RunOptions,
    parallel_layout,
    threads_per_process,
)
from attnbench.extrapolation.model.encoder import build_model
from attnbench.extrapolation.training import curves
from attnbench.extrapolation.training.batches import HeldoutProbe
from attnbench.extrapolation.training.checkpoints import check_key, load_checkpoint
from attnbench.extrapolation.training.loop import train
from attnbench.runtime.execute import Executor, Work
from attnbench.runtime.progress import LogLines, Progress, Silent


def train_in_parallel(cfg, opts, plan, train_stream, device) -> set[Path]:
    """The plan's unfinished trainings as units of the runtime: as Ray tasks with ``--executor
    ray`` (one GPU each, or ``--threads`` CPUs each, default 1), else ``workers`` processes at
    once here, each with ``threads`` torch threads (CPU only; see RunConfig.parallel). Returns the
    checkpoints they wrote (none when one process at a time is the layout: the caller trains
    then). A training that fails twice raises here; the finished ones stay."""
    todo = [(v, seed, path, key, ckpt) for v, seed, path, key, ckpt in plan.entries
            if ckpt is None or not ckpt["done"]]  # fmt: skip
    if opts.executor == "ray":
        threads = (cfg.run.threads or 1) if device.type == "cpu" else threads_per_process(cfg)
        resources = {"num_gpus": 1, "num_cpus": 1} if device.type == "cuda" else {
            "num_cpus": threads, "num_gpus": 0}  # fmt: skip
        executor = Executor("ray", ray_address=opts.ray_address, resources=resources)
    else:
        workers, threads = parallel_layout(cfg, device, len(todo), opts)
        if workers < 2:
            return set()
        names = ", ".join(f"{v.label} seed {seed}" for v, seed, *_ in todo)
        opts.log(f"training {names}: {workers} at once, {threads} thread{'s' * (threads > 1)} "
                 "each")  # fmt: skip
        executor = Executor("local", at_once=workers)
    jobs = [TrainJob(cfg, v, seed, path, key, ckpt if opts.resume else None, str(device),
                     opts.log_every, opts.tensorboard, plan.probe)
            for v, seed, path, key, ckpt in todo]  # fmt: skip
    if executor.kind == "ray":
        opts.log(f"{len(jobs)} trainings as Ray tasks")
    work = Work(_train, (train_stream, threads, time.time()), remote_fn=_train_remote)
    return units.run_trainings(jobs, work, executor, opts.log)


def train_only(cfg, opts, plan, train_stream, device, dist) -> None:
    """``--train-only``: every planned training to its end (worker processes on a CPU as
    usual, data-parallel under torchrun), the curves, then where the checkpoints are."""
    if dist is None:
        plan.reload(train_in_parallel(cfg, opts, plan, train_stream, device))
    for v, seed, path, key, ckpt in plan.entries:
        ckpt, _ = train_or_load(cfg, opts, v, seed, path, key, ckpt, train_stream, device, dist,
                                plan.probe)  # fmt: skip
        if dist is None or dist.is_main:
            gather_curves(plan, opts)
        opts.log(
            f"{v.label} seed {seed}: checkpoint {path} ({ckpt['step']} steps, final loss "
            f"{ckpt['final_loss']:.4f})"
        )
    count = len(plan.entries)
    opts.log(
        f"trained {count} checkpoint{'s' * (count > 1)} in {opts.ckpt_dir}; evaluate them later "
        f"in a single process with the same options and --eval-only: {_eval_command(opts.argv)}"
    )


def _eval_command(argv: list[str]) -> str:
    """The command that evaluates what a --train-only command trained: the same options with
    --eval-only (which excludes --resume and --overwrite), in one process."""
    dropped = {"--train-only", "--resume", "--overwrite"}
    kept, args = [], iter(argv[1:])
    for a in args:
        if a == "--shard":  # every shard's checkpoints are evaluated together
            next(args, None)
        elif a not in dropped and not a.startswith("--shard="):
            kept.append(a)
    return shlex.join(["attnbench", *kept, "--eval-only"])


def train_or_load(cfg, opts, v, seed, path, key, ckpt, train_stream, device, dist=None,
                  probe=None):  # fmt: skip
    """Train (from scratch or from ``ckpt``; data-parallel with ``dist``) unless ``ckpt`` is
    finished; returns the finished checkpoint and a summary for the sidecar."""
    if ckpt is not None and ckpt["done"]:
        if not opts.train_only:
            opts.log(f"{v.label} seed {seed}: trained ({ckpt['step']} steps), loading {path}")
        if dist is None or dist.is_main:
            _curve_from_history(cfg, v, seed, path, ckpt, opts)
    else:
        if opts.eval_only:  # Plan rules this out; kept as a guard
            raise AttnbenchError(f"{path} is not finished")
        hook = None
        if opts.on_step is not None:

            def hook(step: int, label=v.label) -> None:
                opts.on_step(label, seed, step)

        job = TrainJob(cfg, v, seed, path, key, ckpt if opts.resume else None, str(device),
                       opts.log_every, opts.tensorboard, probe)  # fmt: skip
        opts.log(job.run(train_stream, opts.progress(), hook, dist))
        ckpt = load_checkpoint(path)  # under torchrun, rank 0 wrote it before train returned
    steps = max(1, ckpt["step"])
    info = {
        "variant": v.label,
        "seed": seed,
        "steps": ckpt["step"],
        "train_time_s": round(ckpt["train_time_s"], 2),
        "ms_per_step": round(1000 * ckpt["train_time_s"] / steps, 1),
        "final_loss": ckpt["final_loss"],
        "model_params": build_model(cfg.model, v.mixer).num_params(),
        "checkpoint": str(path),
    }
    return ckpt, info


def _curve_from_history(cfg, v, seed, path, ckpt, opts: RunOptions) -> None:
    """A finished checkpoint whose curve file is missing (trained before the curves existed, or
    the file was removed) gets it back from its history (:func:`curve_file` says where)."""
    target = curve_file(path, opts)
    if not target.exists():
        points = curves.history_points(ckpt.get("history", []), cfg.train)
        curves.write_curve(target, v.label, seed, points)


def curve_file(checkpoint: Path, opts: RunOptions) -> Path:
    """A training's curve file: beside its checkpoint (:func:`curves.curve_path`), except when
    --eval-only finds none there. An evaluation writes nothing into the checkpoint folder (it
    may be a committed weights folder, or another run's), so the curve it recovers from the
    checkpoint's history goes to ``<out>/curves/``."""
    beside = curves.curve_path(checkpoint)
    if beside.exists() or not opts.eval_only:
        return beside
    return opts.out / curves.CURVES_DIR / beside.name


def gather_curves(plan: Plan, opts: RunOptions) -> Path | None:
    """Every training's curve file so far, in one tidy ``<out>/curves.csv``."""
    files = [curve_file(path, opts) for _, _, path, _, _ in plan.entries]
    return curves.combine(files, opts.out / curves.COMBINED_NAME)


@dataclass
class TrainJob:
    """One (variant, seed) training, runnable here or in a worker process (picklable)."""

    cfg: ExtrapConfig
    variant: TrainedVariant
    seed: int
    path: Path
    key: dict
    resume: dict | None
    device: str
    log_every: int
    tensorboard: Path | None
    heldout: HeldoutProbe | None = None  # the held-out loss measured during training

    @property
    def unit_id(self) -> str:
        return units.training_unit_id(self.variant.file_stem, self.seed)

    def after_crash(self, since: float | None) -> TrainJob:
        """This job, or for the retry of a crashed attempt (``since``: when the run started)
        the job continuing from the checkpoint that attempt left, if it wrote one (never from an
        older file: an --overwrite run must not pick one up)."""
        if since is None or not self.path.exists() or self.path.stat().st_mtime < since:
            return self
        ckpt = load_checkpoint(self.path)
        check_key(ckpt, self.key, self.path)
        return dataclasses.replace(self, resume=ckpt)

    def run(self, train_stream: Tensor, progress: Progress, on_step=None, dist=None) -> str:
        """Train to the end, checkpoints as it goes; returns the one-line summary. ``dist``: a
        :class:`~.distributed.DataParallel` to train over torchrun's processes."""
        v, seed, cfg = self.variant, self.seed, self.cfg
        torch.manual_seed(seed)  # the same seed on every rank: the same initial weights
        random.seed(seed)
        device = dist.device if dist is not None else self.device
        model = build_model(cfg.model, v.mixer).to(device)
        history = curves.history_points(self.resume["history"], cfg.train) if self.resume else []
        curve = None
        if dist is None or dist.is_main:  # under torchrun, rank 0 alone writes the curve
            curve = curves.CurveLog(curves.curve_path(self.path), v.label, seed, history,
                                    self.tensorboard)  # fmt: skip
        with curve if curve is not None else contextlib.nullcontext():
            outcome = train(
                model,
                train_stream,
                cfg.train,
                train_len=cfg.model.train_len,
                seed=seed,
                path=self.path,
                key=self.key,
                ckpt_every=cfg.run.ckpt_every,
                resume=self.resume,
                progress=progress,
                title=f"{v.label} seed {seed}",
                on_step=on_step,
                on_log=curve.log if curve is not None else None,
                log_every=self.log_every,
                dist=dist,
                heldout=self.heldout,
                causal=cfg.model.causal,
            )
        return (
            f"{v.label} seed {seed}: trained {outcome.steps} steps in {outcome.train_time_s:.0f}s"
            f" ({outcome.tokens_per_s:,.0f} tok/s), final loss {outcome.final_loss:.3f}"
        )


def _train(job: TrainJob, attempt: int, train_stream: Tensor, threads: int,
           started: float) -> str:  # fmt: skip
    """A worker process's unit: its thread count, then one training; the retry of a crashed
    attempt continues from the checkpoint that attempt wrote during this run (``started``)."""
    torch.set_num_threads(threads)
    since = None if attempt == 1 else started
    return job.after_crash(since).run(train_stream, LogLines(lines=10))


def _train_remote(job: TrainJob, attempt: int, train_stream: Tensor, threads: int,
                  started: float):  # fmt: skip
    """A Ray task's unit: one training (its checkpoints written as it goes, where the driver
    said); returns the summary line and the finished checkpoint's and curve's bytes, which the
    driver writes where they belong when its node does not see them (no shared file system)."""
    torch.set_num_threads(threads)
    since = None if attempt == 1 else started
    line = job.after_crash(since).run(train_stream, Silent())
    curve = curves.curve_path(job.path)
    return line, job.path.read_bytes(), curve.read_bytes() if curve.exists() else None
