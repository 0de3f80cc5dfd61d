"""``attnbench run extrapolate``: train at one length, evaluate at longer ones (Su 2021).

For every seed and every trained variant: build the encoder (:mod:`.model`), train it at L
(:mod:`.train`, checkpointed), evaluate masked-token accuracy at every evaluation length on the
same held-out span with the same masks (:mod:`.evaluate`). ``--train-only`` stops after the
training (evaluate later with ``--eval-only``); it is the one mode torchrun may start, each
training then data-parallel over its processes (:mod:`.distributed`).
The trained O model is also evaluated with each evaluation-time trick
(:mod:`.tricks`) loaded into the same weights. Results: one tidy CSV row per
(variant, seed, length), a JSON sidecar, a Markdown table (mean ± std over seeds, Su 2021's
published rows beside ours) and a figure.

What silently breaks such experiments, and what this module does about it: n is the
real length (no padding exists); the scaling lives in the mechanism, so training and evaluation
use the same code; one held-out stream, contiguous windows, masks fixed by a seed; a length guard
at every layer; several seeds; the chunk-L floor as a row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import random
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError
from attnbench.data import load_corpus
from attnbench.extrapolation import baseline, curves, distributed, report, units
from attnbench.extrapolation.config import (
    EvalTimeVariant,
    ExtrapConfig,
    TrainedVariant,
    resolve_eval_time,
    resolve_variants,
    spec_json,
)
from attnbench.extrapolation.evaluate import EvalStream, evaluate, make_eval_stream
from attnbench.extrapolation.model import MLMEncoder, build_model
from attnbench.extrapolation.progress import LineProgress, NoProgress, TrainProgress
from attnbench.extrapolation.train import (
    HISTORY_EVERY,
    HeldoutProbe,
    check_key,
    load_checkpoint,
    train,
)
from attnbench.extrapolation.tricks import TrickMixer
from attnbench.measure import machine
from attnbench.runtime import engines
from attnbench.runtime.outputs import ensure_dir

MASKING = (
    "each position replaced by the [MASK] id independently with probability {p} (training and "
    "evaluation alike); loss and accuracy over masked positions only; evaluation masks drawn once "
    "over the held-out span (seed {seed}), the same for every variant, seed and length"
)

#: How the corpus is cut into training and held-out text (part of every checkpoint's key: the
#: byte-fraction cut of earlier versions put the opening of the first held-out play in training).
SPLIT_RULE = "at the start of the work nearest the holdout fraction"

#: The row key holding a row's per-piece (masked, correct) counts, written to PIECES_NAME.
PIECES = "_pieces"
PIECES_NAME = "pieces.csv"

CSV_NAME, SIDECAR_NAME, TABLE_NAME, FIGURE_NAME = (
    "extrapolate.csv",
    "extrapolate.json",
    "table.md",
    "accuracy_vs_length.png",
)


@dataclass
class RunOptions:
    out: Path
    checkpoints: Path | None = None  # default: out / "checkpoints"
    resume: bool = False
    eval_only: bool = False
    #: Train (or resume) every planned checkpoint and stop: no evaluation, no table. The one
    #: mode torchrun may start (evaluate afterwards, in one process, with eval_only).
    train_only: bool = False
    overwrite: bool = False
    impls: list[str] = field(default_factory=list)
    impl_params: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    progress: Callable[[], TrainProgress] = NoProgress
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)
    #: Called after every training step with (variant, seed, step): tests interrupt through it.
    on_step: Callable[[str, int, int], None] | None = None
    #: Steps between the points of the training curves (and of the checkpoint's history).
    log_every: int = HISTORY_EVERY
    #: A TensorBoard log folder for the training curves (needs the tensorboard package).
    tensorboard: Path | None = None
    #: Where the trainings run: "local" (worker processes here) or "ray" (a Ray task each).
    executor: str = "local"
    ray_address: str | None = None
    #: (I, N): only the trainings whose unit number is I mod N (implies train_only).
    shard: tuple[int, int] | None = None

    @property
    def ckpt_dir(self) -> Path:
        return self.checkpoints or self.out / "checkpoints"

    def check(self) -> None:
        """Refuse modes that exclude each other, before any work."""
        engines.check_executor(self.executor)
        if self.ray_address is not None and self.executor != "ray":
            raise AttnbenchError("--ray-address needs --executor ray")
        if self.executor == "ray" and distributed.torchrun_world_size() > 1:
            raise AttnbenchError(
                "--executor ray under torchrun: choose one (torchrun: one training over several "
                "processes; Ray: many trainings as tasks)"
            )
        if self.shard is not None and self.eval_only:
            raise AttnbenchError(
                "--shard trains a share of the checkpoints; --eval-only (without --shard) "
                "evaluates them all once every shard is done"
            )
        if self.train_only and self.eval_only:
            raise AttnbenchError(
                "--train-only and --eval-only exclude each other; train with --train-only, "
                "then evaluate with --eval-only"
            )
        world = distributed.torchrun_world_size()
        if world > 1 and not self.train_only:
            raise AttnbenchError(
                f"under torchrun ({world} processes) run extrapolate only trains: add "
                "--train-only, then evaluate the checkpoints in a single process (no torchrun) "
                "with --eval-only"
            )


@dataclass
class RunResult:
    rows: list[dict[str, Any]]
    out: Path
    table: str
    notes: list[str]


def checkpoint_key(cfg: ExtrapConfig, variant: TrainedVariant, seed: int, corpus_sha: str) -> dict:
    """Everything that changes the trained weights (and nothing that only changes evaluation)."""
    from dataclasses import asdict

    return {
        "model": asdict(cfg.model),
        "train": asdict(cfg.train),
        "mixer": variant.spec.plain(),
        "seed": seed,
        "corpus_sha256": corpus_sha,
        "holdout": cfg.run.holdout,
        "split": SPLIT_RULE,
    }


def _threads(cfg: ExtrapConfig, local_processes: int = 1) -> int:
    """Torch threads of one process; ``local_processes`` torchrun processes share the cores."""
    return cfg.run.threads or max(1, machine.usable_cores() // local_processes)


def _quiet(msg: str) -> None:
    """The log of torchrun's ranks other than 0 (rank 0 says it all once)."""


class Plan:
    """Which (variant, seed) to train, resume or only evaluate, decided before any work."""

    def __init__(self, cfg, variants, seeds, corpus_sha, opts: RunOptions,
                 probe: HeldoutProbe | None = None):  # fmt: skip
        self.probe = probe  # the held-out loss of the training curves
        self.entries: list[tuple[TrainedVariant, int, Path, dict, dict | None]] = []
        existing = []
        for index, (seed, v) in enumerate((s, v) for s in seeds for v in variants):
            if not engines.in_shard(index, opts.shard):  # another shard's training
                continue
            path = opts.ckpt_dir / f"{v.file_stem}-seed{seed}.pt"
            key = checkpoint_key(cfg, v, seed, corpus_sha)
            ckpt = None
            if path.exists() and not opts.overwrite:
                ckpt = load_checkpoint(path)
                existing.append(path)
                if opts.resume or opts.eval_only:
                    check_key(ckpt, key, path)
            if opts.eval_only:
                if ckpt is None:
                    raise AttnbenchError(
                        f"--eval-only: no checkpoint for {v.label} seed {seed} at {path}; "
                        "train it first (run without --eval-only)"
                    )
                if not ckpt["done"]:
                    raise AttnbenchError(
                        f"--eval-only: checkpoint {path} is unfinished (step {ckpt['step']}/"
                        f"{cfg.train.steps}); continue it with --resume"
                    )
            self.entries.append((v, seed, path, key, ckpt))
        if existing and not (opts.resume or opts.eval_only):
            names = ", ".join(p.name for p in existing[:3]) + (" ..." if len(existing) > 3 else "")
            raise AttnbenchError(
                f"checkpoints already exist in {opts.ckpt_dir} ({names}); pass --resume to "
                "continue them, --eval-only to re-evaluate them, or --overwrite to start over"
            )

    def reload(self, trained: set[Path]) -> None:
        """Read again the checkpoints workers have just trained (``trained``); every other
        entry stays as planned (an --overwrite run never picks up an old file)."""
        self.entries = [
            (v, seed, path, key, load_checkpoint(path) if path in trained else ckpt)
            for v, seed, path, key, ckpt in self.entries
        ]


def run_extrapolate(cfg: ExtrapConfig, opts: RunOptions) -> RunResult:
    """Train (or resume, or load) every variant and seed, evaluate, write the outputs (with
    ``opts.train_only``: train and stop, data-parallel when torchrun started this process)."""
    cfg.check()
    opts.check()
    world = distributed.torchrun_world_size()
    if world > 1:
        distributed.shares(cfg.train.batch, world)  # a batch too small to split: refused now
        if not distributed.torchrun_is_main():
            opts = dataclasses.replace(opts, log=_quiet, progress=NoProgress)
    if opts.tensorboard is not None:
        curves.require_tensorboard()
    ensure_dir(opts.out, "--out folder", create=False)  # a mistake shows before any work
    ensure_dir(opts.ckpt_dir, "checkpoint folder", create=False)
    if cfg.train.steps < cfg.train.warmup:
        opts.log(
            f"warning: train.steps={cfg.train.steps} is below the learning-rate warm-up "
            f"(train.warmup={cfg.train.warmup}): the run never reaches the peak learning rate; "
            "fine for a smoke test, not for a result"
        )
    started = dt.datetime.now(dt.timezone.utc)
    corpus = load_corpus(cfg.run.corpus or None)
    split = corpus.split(cfg.run.holdout)
    train_stream, heldout = split.train, split.heldout
    if train_stream.numel() < cfg.model.train_len:
        raise AttnbenchError(
            f"corpus too short: training needs at least train_len={cfg.model.train_len} tokens, "
            f"the training part has {train_stream.numel()}"
        )
    stream = make_eval_stream(
        heldout,
        split.works,
        cfg.eval.lengths,
        cfg.eval.tokens,
        cfg.eval.piece(),
        cfg.train.mask_prob,
        cfg.eval.seed,
    )
    variants, notes = resolve_variants(cfg, opts.impls, opts.impl_params)
    eval_rows, more = resolve_eval_time(cfg, variants)
    notes += more
    for note in notes:
        opts.log(f"note: {note}")
    for v in variants:  # build each model once now: a bad layer fails before any training
        torch.manual_seed(0)
        build_model(cfg.model, v.spec)
    seeds = list(range(cfg.run.seed_start, cfg.run.seed_start + cfg.run.seeds))
    device = machine.resolve_device(cfg.run.device, "run.device (--device)")
    if device.type == "cuda":
        # Training in float32 with TF32 matmuls (10-bit mantissa products, float32 sums) on the
        # GPU: the usual setting for training, several times faster than IEEE float32 matmuls.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        opts.log("note: CUDA float32 matmuls run as TF32 (torch.backends.cuda.matmul.allow_tf32)")
    probe = HeldoutProbe.from_stream(
        heldout,
        cfg.model.train_len,
        cfg.run.heldout_windows,
        cfg.train.mask_prob,
        cfg.eval.seed,
        cfg.run.heldout_every,
    )
    plan = Plan(cfg, variants, seeds, corpus.sha256, opts, probe)

    ensure_dir(opts.out, "--out folder")
    dist = distributed.start(device) if world > 1 else None  # waits for every rank
    local_processes = 1
    if dist is not None:
        device, local_processes = dist.device, dist.local_world_size
        opts.log(f"data-parallel training over {dist.world_size} torchrun processes on {device}")
    threads = _threads(cfg, local_processes)
    if too_many := machine.oversubscribed(threads * local_processes):
        opts.log(f"warning: {too_many}")
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows: list[dict[str, Any]] = []
    curves_csv: Path | None = None
    trainings: list[dict[str, Any]] = []
    try:
        if opts.train_only:
            _train_only(cfg, opts, plan, train_stream, device, dist)
            return RunResult([], opts.out, "", notes)
        if not opts.eval_only:
            plan.reload(train_in_parallel(cfg, opts, plan, train_stream, device))
        tasks: list[EvalTask] = []
        layout = parallel_layout(cfg, device, eval_task_count(plan, eval_rows), opts)
        for v, seed, path, key, ckpt in plan.entries:
            ckpt, info = _train_or_load(cfg, opts, v, seed, path, key, ckpt, train_stream, device,
                                        probe=plan.probe)  # fmt: skip
            trainings.append(info)
            curves_csv = _gather_curves(plan, opts)
            tasks += EvalTask.for_checkpoint(cfg, v, seed, path, eval_rows, str(device))
            if layout[0] < 2:  # one process: a checkpoint's rows as soon as it is trained
                for task_rows in evaluate_tasks(tasks, stream, train_stream, layout, opts.log):
                    rows += task_rows
                report.write_csv(rows, opts.out / CSV_NAME)
                tasks = []
        tasks.append(EvalTask(cfg, "baseline", None, None, None, "cpu"))
        # Several processes: every evaluation is queued (rows come back in plan order).
        for task_rows in evaluate_tasks(tasks, stream, train_stream, layout, opts.log):
            rows += task_rows
            report.write_csv(rows, opts.out / CSV_NAME)
    finally:
        torch.set_num_threads(old_threads)
        if dist is not None:
            dist.shutdown()
    report.write_pieces(rows, PIECES, opts.out / PIECES_NAME)

    lengths = list(cfg.eval.lengths)
    summary = report.summarise(rows)
    title = (
        f"MLM accuracy (%) vs length, trained at L={cfg.model.train_len}, preset {cfg.preset}, "
        f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
    )
    command = " ".join(["attnbench", *opts.argv[1:]]) if opts.argv else "attnbench"
    table_md = _table_markdown(cfg, rows, summary, lengths, title, command, stream)
    (opts.out / TABLE_NAME).write_text(table_md)
    report.figure(summary, lengths, cfg.model.train_len, opts.out / FIGURE_NAME, title)
    sidecar = {
        "suite": "extrapolate",
        "command": command,
        "argv": opts.argv,
        "started": started.isoformat(),
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
        "config": cfg.plain(),
        "corpus": corpus.describe() | split.describe(),
        "evaluation": {
            "span_tokens": stream.size,
            "span_masked": int(stream.mask.sum()),
            "span": stream.describe(),
            "masking": MASKING.format(p=cfg.train.mask_prob, seed=cfg.eval.seed),
            "windows": {str(n): stream.windows(n)[0].shape[0] for n in lengths},
            "entropy": f"mean attention-row entropy (nats) per layer over the first "
            f"{cfg.eval.entropy_tokens} tokens of the span (at least one window)",
        },
        "variants": [{"label": v.label, **v.spec.plain(), "kind": "trained"} for v in variants]
        + [
            {
                "label": e.label,
                "kind": "eval-time",
                "applied_to": e.base,
                "tricks": e.tricks.describe(),
            }
            for e in eval_rows
        ],
        "seeds": seeds,
        "trainings": trainings,
        "threads": _threads(cfg),
        "device": str(device),
        "versions": machine.versions(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "git": machine.git_state(),
        "notes": notes,
        "outputs": [CSV_NAME, PIECES_NAME, TABLE_NAME, FIGURE_NAME]
        + ([curves.COMBINED_NAME] if curves_csv else []),
    }
    (opts.out / SIDECAR_NAME).write_text(json.dumps(sidecar, indent=1, default=str) + "\n")
    return RunResult(rows, opts.out, table_md, notes)


def _table_markdown(cfg, rows, summary, lengths, title, command, stream: EvalStream) -> str:
    diff = report.paired_difference(rows)
    masked = {n: int(stream.windows(n)[1].sum()) for n in lengths}
    return "\n".join(
        [
            f"# {title}",
            "",
            f"Made by: `{command}`",
            "",
            "Masked-token accuracy (%), mean ± std over seeds. Eval-time rows reuse the trained O "
            "weights. `count-baseline` has "
            + baseline.describe()
            + ", on the same masked positions; read every row against it. Su 2021's rows are its "
            "published numbers (other data and model): compare shapes, not levels.",
            "",
            report.markdown_table(summary, lengths),
            "",
            "Difference to O, paired by seed (points): mean [95 % t-interval] and p of the paired "
            "t-test over seeds; bold where p < 0.05. A claim without bold is not established by "
            "these seeds.",
            "",
            report.markdown_difference(diff, lengths),
            "",
            f"Within one seed, the evaluation text's own sampling error: 95 % bootstrap interval "
            f"of variant − O over the span's {stream.pieces} pieces (resampled with replacement, "
            f"{report.BOOTSTRAP_DRAWS} draws, paired), its half-width averaged over seeds "
            "(points):",
            "",
            report.markdown_within_seed(report.within_seed(rows, PIECES), lengths),
            "",
            *(
                ["Su 2021's shape, E − O (on the mean, and its significance):", "", *checks, ""]
                if (checks := report.shape_checks(diff))
                else []
            ),
            "Training wall time per variant (this machine, threads as in the sidecar):",
            "",
            *report.training_times(rows),
            "",
            "Masking: " + MASKING.format(p=cfg.train.mask_prob, seed=cfg.eval.seed) + ".",
            "",
            "Masked tokens evaluated per length: "
            + ", ".join(f"n={n}: {masked[n]:,}" for n in lengths)
            + f" (one held-out span of {stream.size:,} tokens, the same for every row: "
            f"{stream.pieces} pieces of {stream.chunk:,} contiguous tokens spread evenly over "
            f"the {len(set(stream.works))} held-out works, "
            + ", ".join(f"{w} ({k})" for w, k in stream.describe()["pieces_per_work"].items())
            + ").",
            "",
        ]
    )


def _train_only(cfg, opts, plan, train_stream, device, dist) -> None:
    """``--train-only``: every planned training to its end (worker processes on a CPU as
    usual, data-parallel under torchrun), the curves, then where the checkpoints are."""
    if dist is None:
        plan.reload(train_in_parallel(cfg, opts, plan, train_stream, device))
    for v, seed, path, key, ckpt in plan.entries:
        ckpt, _ = _train_or_load(cfg, opts, v, seed, path, key, ckpt, train_stream, device, dist,
                                 plan.probe)  # fmt: skip
        if dist is None or dist.is_main:
            _gather_curves(plan, opts)
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


def _train_or_load(cfg, opts, v, seed, path, key, ckpt, train_stream, device, dist=None,
                   probe=None):  # fmt: skip
    """Train (from scratch or from ``ckpt``; data-parallel with ``dist``) unless ``ckpt`` is
    finished; returns the finished checkpoint and a summary for the sidecar."""
    if ckpt is not None and ckpt["done"]:
        if not opts.train_only:
            opts.log(f"{v.label} seed {seed}: trained ({ckpt['step']} steps), loading {path}")
        if dist is None or dist.is_main:
            _curve_from_history(cfg, v, seed, path, ckpt)
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
        "model_params": build_model(cfg.model, v.spec).num_params(),
        "checkpoint": str(path),
    }
    return ckpt, info


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
        return f"train-{self.variant.file_stem}-seed{self.seed}"

    def after_crash(self, since: float | None) -> TrainJob:
        """This job, or for the retry of a crashed attempt (``since``: when the run started)
        the job continuing from the checkpoint that attempt left, if it wrote one (never from an
        older file: an --overwrite run must not pick one up)."""
        if since is None or not self.path.exists() or self.path.stat().st_mtime < since:
            return self
        ckpt = load_checkpoint(self.path)
        check_key(ckpt, self.key, self.path)
        return dataclasses.replace(self, resume=ckpt)

    def run(self, train_stream: Tensor, progress: TrainProgress, on_step=None, dist=None) -> str:
        """Train to the end, checkpoints as it goes; returns the one-line summary. ``dist``: a
        :class:`~.distributed.DataParallel` to train over torchrun's processes."""
        v, seed, cfg = self.variant, self.seed, self.cfg
        torch.manual_seed(seed)  # the same seed on every rank: the same initial weights
        random.seed(seed)
        device = dist.device if dist is not None else self.device
        model = build_model(cfg.model, v.spec).to(device)
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
            )
        return (
            f"{v.label} seed {seed}: trained {outcome.steps} steps in {outcome.train_time_s:.0f}s"
            f" ({outcome.tokens_per_s:,.0f} tok/s), final loss {outcome.final_loss:.3f}"
        )


def _train_in_worker(job: TrainJob, train_stream: Tensor, threads: int,
                     retry_since: float | None = None) -> str:  # fmt: skip
    """A worker process's whole life: its thread count, then one training (a retry continues
    from the checkpoint the crashed attempt left)."""
    torch.set_num_threads(threads)
    engines.inject_fault(job.unit_id, retry_since is None)
    return job.after_crash(retry_since).run(train_stream, LineProgress(lines=10))


def train_in_parallel(cfg, opts, plan, train_stream, device) -> set[Path]:
    """The plan's unfinished trainings in ``workers`` processes at once, each with ``threads``
    torch threads (CPU only; see RunConfig.parallel); returns the checkpoints they wrote (none
    when one process at a time is the layout: the caller trains then). A failed training raises
    here; the finished ones stay."""

    todo = [(v, seed, path, key, ckpt) for v, seed, path, key, ckpt in plan.entries
            if ckpt is None or not ckpt["done"]]  # fmt: skip
    if opts.executor == "ray":
        # a task per training: one GPU each, or --threads CPUs each (default 1)
        threads = (cfg.run.threads or 1) if device.type == "cpu" else _threads(cfg)
        jobs = [TrainJob(cfg, v, seed, path, key, ckpt if opts.resume else None, str(device),
                         opts.log_every, opts.tensorboard, plan.probe)
                for v, seed, path, key, ckpt in todo]  # fmt: skip
        return units.train_on_ray(jobs, train_stream, threads, device, opts.ray_address, opts.log)
    workers, threads = parallel_layout(cfg, device, len(todo), opts)
    if workers < 2:
        return set()
    names = ", ".join(f"{v.label} seed {seed}" for v, seed, *_ in todo)
    opts.log(f"training {names}: {workers} at once, {threads} thread{'s' * (threads > 1)} each")
    jobs = [TrainJob(cfg, v, seed, path, key, ckpt if opts.resume else None, str(device),
                     opts.log_every, opts.tensorboard, plan.probe)
            for v, seed, path, key, ckpt in todo]  # fmt: skip
    started = time.time()
    crashed = _train_in_pool(jobs, workers, threads, train_stream, opts.log, None)
    if crashed:
        names = ", ".join(f"{j.variant.label} seed {j.seed}" for j in crashed)
        opts.log(f"{names}: a worker process died; retrying once in fresh processes, from the "
                 "checkpoints this run wrote")  # fmt: skip
        crashed = _train_in_pool(crashed, workers, threads, train_stream, opts.log, started)
    if crashed:
        names = ", ".join(f"{j.variant.label} seed {j.seed}" for j in crashed)
        raise AttnbenchError(
            f"the worker process training {names} died twice; the other trainings are saved: "
            "run again with --resume"
        )
    return {job.path for job in jobs}


def _train_in_pool(jobs, workers, threads, train_stream, log, retry_since) -> list[TrainJob]:
    """Train ``jobs``, ``workers`` at once, each in its own spawned process; returns the jobs
    whose process died (a crash takes down only its own training). Any other failure, or
    Ctrl-C (the workers checkpoint and stop), raises here once the running ones have stopped."""
    return units.train_in_processes(jobs, workers, _train_in_worker,
                                    (train_stream, threads, retry_since), log)  # fmt: skip


def list_units(cfg: ExtrapConfig, opts: RunOptions) -> list[dict[str, Any]]:
    """``--list-units``: the run's trainings (with the shard each belongs to, under --shard, and
    whether its checkpoint is finished) and its evaluation unit."""
    corpus = load_corpus(cfg.run.corpus or None)
    variants, _ = resolve_variants(cfg, opts.impls, opts.impl_params)
    seeds = range(cfg.run.seed_start, cfg.run.seed_start + cfg.run.seeds)
    entries = []
    for seed in seeds:
        for v in variants:
            path = opts.ckpt_dir / f"{v.file_stem}-seed{seed}.pt"
            ckpt = load_checkpoint(path) if path.exists() else None
            key = checkpoint_key(cfg, v, seed, corpus.sha256)
            done = ckpt is not None and ckpt.get("key") == key and ckpt.get("done")
            entries.append((v, seed, path, key, {"done": done}))
    listed = units.unit_list(entries, opts.shard)
    if opts.shard is None:
        return listed
    return [u for u in listed if u["kind"] == "evaluation" or u["shard"] == opts.shard[0]]


def parallel_layout(cfg, device, pending: int, opts) -> tuple[int, int]:
    """(processes, threads each) for ``pending`` trainings: one process on a GPU, with hooks
    (tests) or when asked for; else up to RunConfig.parallel (0: the thread budget), each with
    an equal share of the threads."""
    budget = _threads(cfg)
    if device.type != "cpu" or opts.on_step is not None or pending < 2:
        return 1, budget
    wanted = cfg.run.parallel or budget
    workers = max(1, min(wanted, pending, budget))
    return workers, max(1, budget // workers)


def _curve_from_history(cfg, v, seed, path, ckpt) -> None:
    """A finished checkpoint whose curve file is missing (trained before the curves existed, or
    the file was removed) gets it back from its history."""
    target = curves.curve_path(path)
    if not target.exists():
        points = curves.history_points(ckpt.get("history", []), cfg.train)
        curves.write_curve(target, v.label, seed, points)


def _gather_curves(plan: Plan, opts: RunOptions) -> Path | None:
    """Every training's curve file so far, in one tidy ``<out>/curves.csv``."""
    files = [curves.curve_path(path) for _, _, path, _, _ in plan.entries]
    return curves.combine(files, opts.out / curves.COMBINED_NAME)


def _row(cfg, label, kind, seed, res, ckpt, **extra) -> dict[str, Any]:
    row = {
        "variant": label,
        "kind": kind,
        "seed": seed,
        "train_len": cfg.model.train_len,
        "eval_len": res.n,
        "accuracy": res.accuracy,
        "loss": res.loss,
        "masked_tokens": res.masked,
        "windows": res.windows,
        "eval_tokens": res.tokens,
        "train_time_s": round(ckpt["train_time_s"], 2),
        "train_steps": ckpt["step"],
        "eval_time_s": round(res.seconds, 3),
        "status": "ok",
        "reason": "",
        **extra,
        PIECES: (res.piece_masked, res.piece_correct),  # not a CSV column: pieces.csv
    }
    for i, h in enumerate(res.entropy):
        row[f"entropy_l{i}"] = h
    return row


def baseline_rows(cfg: ExtrapConfig, train: Tensor, stream: EvalStream) -> list[dict[str, Any]]:
    """The count baseline (:mod:`attnbench.extrapolation.baseline`) at every evaluation length,
    on the same windows and masks as the models: one row per length, no seed."""
    started = time.perf_counter()
    counts = baseline.ContextCounts(train)
    rows = []
    for n in cfg.eval.lengths:
        tokens, mask = stream.windows(n)
        correct, masked = counts.accuracy(tokens, mask)
        rows.append(
            {
                "variant": baseline.LABEL,
                "kind": "baseline",
                "applied_to": "",
                "mechanism": "",
                "path": "",
                "params": "",
                "note": baseline.describe(counts.width),
                "seed": None,
                "train_len": cfg.model.train_len,
                "eval_len": n,
                "accuracy": 100.0 * correct / max(1, masked),
                "loss": None,  # a count table has no probabilities to score
                "masked_tokens": masked,
                "windows": tokens.shape[0],
                "eval_tokens": tokens.numel(),
                "eval_time_s": round(time.perf_counter() - started, 3),
                "status": "ok",
                "reason": "",
            }
        )
    return rows


def _failed_row(cfg, label, kind, seed, n, ckpt, reason, **extra) -> dict[str, Any]:
    return {
        "variant": label,
        "kind": kind,
        "seed": seed,
        "train_len": cfg.model.train_len,
        "eval_len": n,
        "train_time_s": round(ckpt["train_time_s"], 2),
        "train_steps": ckpt["step"],
        "status": "error",
        "reason": reason,
        **extra,
    }


def _eval_all(cfg, log, model, label, kind, seed, ckpt, stream, chunk=None, **extra):
    extra["model_params"] = model.num_params()
    rows = []
    for n in cfg.eval.lengths:
        try:
            res = evaluate(
                model,
                stream,
                n,
                chunk=chunk,
                batch_tokens=cfg.eval.batch_tokens,
                entropy_tokens=cfg.eval.entropy_tokens,
            )
        except (AttnbenchError, RuntimeError) as e:  # a mechanism that cannot run at this n
            reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            log(f"{label} seed {seed} n={n}: {reason}")
            rows.append(_failed_row(cfg, label, kind, seed, n, ckpt, reason, **extra))
            continue
        rows.append(_row(cfg, label, kind, seed, res, ckpt, **extra))
    accs = " ".join(f"{r['accuracy']:.1f}" if r["status"] == "ok" else "err" for r in rows)
    log(f"  {label:<14} seed {seed}: accuracy {accs}")
    return rows


def _evaluate_trained(cfg, log, v: TrainedVariant, seed, ckpt, stream, device) -> list[dict]:
    model = build_model(cfg.model, v.spec)
    model.load_state_dict(ckpt["model"])
    model.to(device)
    return _eval_all(
        cfg,
        log,
        model,
        v.label,
        "trained",
        seed,
        ckpt,
        stream,
        applied_to="",
        mechanism=v.spec.mechanism,
        path=v.spec.path or "",
        params=spec_json(v.spec),
        note="",
    )


def _evaluate_eval_time(cfg, log, ev: EvalTimeVariant, seed, ckpt, stream, device) -> list[dict]:
    tricks = ev.tricks
    model = MLMEncoder(
        cfg.model,
        lambda c, i: TrickMixer(c.d_model, c.heads, tricks, rope_base=c.rope_base),
    )
    model.load_state_dict(ckpt["model"])  # strict: the O weights, unchanged
    model.to(device)
    return _eval_all(
        cfg,
        log,
        model,
        ev.label,
        "eval-time",
        seed,
        ckpt,
        stream,
        chunk=cfg.model.train_len if tricks.chunk else None,
        applied_to=ev.base,
        mechanism="softmax",
        path="dense (eval-time)",
        params="",
        note=tricks.describe(),
    )


@dataclass
class EvalTask:
    """One evaluation of the run (picklable, so a worker process can run it): a trained
    checkpoint, an eval-time row on a trained O checkpoint, or the count baseline."""

    cfg: ExtrapConfig
    kind: str  # "trained", "eval-time" or "baseline"
    variant: TrainedVariant | EvalTimeVariant | None
    seed: int | None
    path: Path | None  # the checkpoint
    device: str

    @classmethod
    def for_checkpoint(cls, cfg, v, seed, path, eval_rows, device) -> list[EvalTask]:
        """The trained variant's own evaluation, and on O every eval-time row."""
        tasks = [cls(cfg, "trained", v, seed, path, device)]
        if v.label == "O":
            tasks += [cls(cfg, "eval-time", ev, seed, path, device) for ev in eval_rows]
        return tasks

    def run(self, stream: EvalStream, train_stream: Tensor, log) -> list[dict[str, Any]]:
        if self.kind == "baseline":
            return baseline_rows(self.cfg, train_stream, stream)
        ckpt = load_checkpoint(self.path)
        evaluate_one = _evaluate_trained if self.kind == "trained" else _evaluate_eval_time
        device = torch.device(self.device)
        return evaluate_one(self.cfg, log, self.variant, self.seed, ckpt, stream, device)


def eval_task_count(plan: Plan, eval_rows) -> int:
    return 1 + sum(1 + (len(eval_rows) if v.label == "O" else 0) for v, *_ in plan.entries)


def _log_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_WORKER_DATA: dict[str, Any] = {}


def _eval_worker_init(stream: EvalStream, train_stream: Tensor, threads: int) -> None:
    torch.set_num_threads(threads)
    _WORKER_DATA.update(stream=stream, train=train_stream)


def _eval_in_worker(task: EvalTask) -> list[dict[str, Any]]:
    return task.run(_WORKER_DATA["stream"], _WORKER_DATA["train"], _log_stderr)


def evaluate_tasks(tasks, stream, train_stream, layout, log):
    """Each task's rows, in the order of ``tasks``: here, or with ``layout`` = (processes,
    threads each) of two or more, in that many worker processes at once (spawned; each gets
    the evaluation span and the training text once). A failed evaluation raises here."""
    workers, threads = layout
    workers = min(workers, len(tasks))
    if workers < 2:
        for task in tasks:
            yield task.run(stream, train_stream, log)
        return
    import multiprocessing

    log(f"evaluating {len(tasks)} models, eval-time rows and baselines: {workers} at once, "
        f"{threads} thread{'s' * (threads > 1)} each")  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(workers, _eval_worker_init, (stream, train_stream, threads))
    try:
        yield from pool.imap(_eval_in_worker, tasks)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
