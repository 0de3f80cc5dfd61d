"""The plan of an extrapolation run, settled before any work: its options
(:class:`RunOptions`), what it reads and resolves (:class:`RunInputs`: the corpus, its split, the
evaluation span, the variants, the seeds, the device), which (variant, seed) to train, resume or
only evaluate (:class:`Plan`: each with its checkpoint and the key that checkpoint must match),
and how many processes, with how many threads each, do the work (:func:`parallel_layout`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from attnbench.core.errors import AttnbenchError
from attnbench.data import Corpus, load_corpus
from attnbench.data.corpus import Split
from attnbench.extrapolation.evaluation.evaluate import EvalStream, make_eval_stream
from attnbench.extrapolation.experiment import units
from attnbench.extrapolation.experiment.config import (
    EvalTimeVariant,
    ExtrapConfig,
    TrainedVariant,
    resolve_eval_time,
    resolve_variants,
)
from attnbench.extrapolation.model.encoder import build_model
from attnbench.extrapolation.training import distributed
from attnbench.extrapolation.training.batches import HeldoutProbe
from attnbench.extrapolation.training.checkpoints import check_key, load_checkpoint
from attnbench.extrapolation.training.curves import HISTORY_EVERY
from attnbench.extrapolation.training.options import check_training_options
from attnbench.measure import machine
from attnbench.runtime import engines, logs
from attnbench.runtime.progress import Progress, Silent
from attnbench.runtime.units import Unit

#: How the corpus is cut into training and held-out text (part of every checkpoint's key: the
#: byte-fraction cut of earlier versions put the opening of the first held-out play in training).
SPLIT_RULE = "at the start of the work nearest the holdout fraction"


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
    progress: Callable[[], Progress] = Silent
    log: Callable[[str], None] = logs.info
    #: Called after every training step with (variant, seed, step): tests interrupt through it.
    on_step: Callable[[str, int, int], None] | None = None
    #: Steps between the points of the training curves (and of the checkpoint's history).
    log_every: int = HISTORY_EVERY
    #: Variants whose finished checkpoints are also kept as float16 weights in OUT/weights
    #: (:mod:`attnbench.extrapolation.training.weights`).
    keep_weights: list[str] = field(default_factory=list)
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
class RunInputs:
    """What a run reads and resolves before any training (a mistake in any of it shows first)."""

    corpus: Corpus
    split: Split  # the training text and the held-out works
    stream: EvalStream  # the held-out span every row is evaluated on, with its fixed masks
    variants: list[TrainedVariant]
    eval_rows: list[EvalTimeVariant]  # eval-time tricks on the trained O
    notes: list[str]  # what was skipped or adjusted, and why (logged, and in the sidecar)
    seeds: list[int]
    device: torch.device


def read_inputs(cfg: ExtrapConfig, opts: RunOptions) -> RunInputs:
    """The corpus and its split, the evaluation span, the variants (each model built once, so
    that a bad layer fails before any training), the seeds and the device (TF32 matmuls on a
    GPU)."""
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
        cfg.eval_mask_prob,
        cfg.eval.seed,
    )
    variants, notes = resolve_variants(cfg, opts.impls, opts.impl_params)
    eval_rows, more = resolve_eval_time(cfg, variants)
    notes += more
    for note in notes:
        opts.log(f"note: {note}")
    for v in variants:  # build each model once now: a bad layer, or a training option it
        torch.manual_seed(0)  # cannot take (random positions), fails before any training
        check_training_options(
            cfg.train, cfg.model.train_len, build_model(cfg.model, v.mixer), v.label
        )
    seeds = list(range(cfg.run.seed_start, cfg.run.seed_start + cfg.run.seeds))
    device = machine.resolve_device(cfg.run.device, "run.device (--device)")
    if device.type == "cuda":
        # Training in float32 with TF32 matmuls (10-bit mantissa products, float32 sums) on the
        # GPU: the usual setting for training, several times faster than IEEE float32 matmuls.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        opts.log("note: CUDA float32 matmuls run as TF32 (torch.backends.cuda.matmul.allow_tf32)")
    return RunInputs(corpus, split, stream, variants, eval_rows, notes, seeds, device)


#: Training options added after checkpoints existed, and the value that is the old behaviour: at
#: that value they are left out of the key, so a checkpoint from before still resumes.
LATER_TRAIN_OPTIONS = {"window_lengths": (), "random_positions": 0, "copy_share": 0.0,
                       "copy_length": 64, "final_mask_prob": 0.0,
                       "final_mask_steps": 0, "copy_weight": 1.0}  # fmt: skip
#: The same for the model's shape (the position encoding is the variant's own, when it sets one).
LATER_MODEL_OPTIONS = {"ffn": "gelu", "position": "rope", "objective": "mlm", "d_head": 0}
#: Model options that matter only with one position encoding (out of the key otherwise).
POSITION_OPTIONS = {"t5_buckets": "t5", "t5_max_distance": "t5"}


def checkpoint_key(cfg: ExtrapConfig, variant: TrainedVariant, seed: int, corpus_sha: str) -> dict:
    """Everything that changes the trained weights (and nothing that only changes evaluation)."""
    train = asdict(cfg.train)
    off = cfg.train.copy_share == 0  # copy_length matters only with copies on
    for name, old in LATER_TRAIN_OPTIONS.items():
        if train[name] == old or (name == "copy_length" and off):
            del train[name]
    model = asdict(cfg.model) | {"position": variant.spec.position or cfg.model.position}
    if model["d_head"] * model["heads"] == model["d_model"]:
        model["d_head"] = 0  # set to d_model / heads: the same model as its default
    for name, only in POSITION_OPTIONS.items():
        if model["position"] != only:
            del model[name]
    for name, old in LATER_MODEL_OPTIONS.items():
        if model[name] == old:
            del model[name]
    mixer = variant.spec.plain()
    mixer.pop("position", None)  # in the model's part: the same key however it was set
    return {
        "model": model,
        "train": train,
        "mixer": mixer,
        "seed": seed,
        "corpus_sha256": corpus_sha,
        "holdout": cfg.run.holdout,
        "split": SPLIT_RULE,
    }


def threads_per_process(cfg: ExtrapConfig, local_processes: int = 1) -> int:
    """Torch threads of one process; ``local_processes`` torchrun processes share the cores."""
    return cfg.run.threads or max(1, machine.usable_cores() // local_processes)


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


def parallel_layout(cfg, device, pending: int, opts) -> tuple[int, int]:
    """(processes, threads each) for ``pending`` trainings: one process on a GPU, with hooks
    (tests) or when asked for; else up to RunConfig.parallel (0: the thread budget), each with
    an equal share of the threads."""
    budget = threads_per_process(cfg)
    if device.type != "cpu" or opts.on_step is not None or pending < 2:
        return 1, budget
    wanted = cfg.run.parallel or budget
    workers = max(1, min(wanted, pending, budget))
    return workers, max(1, budget // workers)


def list_units(cfg: ExtrapConfig, opts: RunOptions) -> list[Unit]:
    """``--list-units``: the run's trainings (whether its checkpoint is finished; under --shard,
    only that shard's) and its evaluation unit."""
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
    return [u for u in units.unit_list(entries) if u.kind == "evaluation" or u.in_shard(opts.shard)]
