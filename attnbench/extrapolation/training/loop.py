"""Training the MLM encoder, at one length by default, with checkpoints that resume bit for bit.

Masking scheme (training and evaluation alike): every position is replaced by the [MASK] id
independently with probability ``mask_prob`` (15 %); the loss and the accuracy are over the masked
positions only. Batches are ``batch`` windows of ``train_len`` bytes starting at uniformly random
offsets of the training stream. Offsets and masks come from one ``torch.Generator`` seeded by the
run's seed (not by the variant), so every variant of a seed sees the same batches in the same order.

Two training options (:class:`TrainConfig`, both off by default, which leaves every batch as it
was): ``window_lengths`` draws each step's window length from a list (windows of every length hold
the same ``batch * train_len`` tokens), and ``random_positions`` gives each training window sorted
random rotary positions (Ruoss et al. 2023). Each draws from its own generator seeded from the
run's seed (:class:`TrainingBatches`), so turning one on leaves the other draws as they were (with
random positions alone, every step's windows and masks are the default run's). A closing
masking phase (``final_mask_prob`` for the last ``final_mask_steps`` steps) changes only the
threshold the masks' uniform draws are compared with: every draw stays where it was, and a
lower final rate keeps a subset of the plain run's masks.

A checkpoint holds the model, the optimiser, the step, the training time so far, and every random
state that the rest of training depends on (the sampler's generators, torch's and Python's global
generators), so ``--resume`` ends with the same numbers as an uninterrupted run. Ctrl-C or SIGTERM
finishes the current step, writes a checkpoint and raises :class:`Interrupted`; a checkpoint is also
written every ``ckpt_every`` steps (what survives a SIGKILL). Files are written atomically.

Under torchrun (:mod:`attnbench.extrapolation.training.distributed`) every process draws the same
full batch and trains on its own contiguous share of the windows: its loss is the summed
cross-entropy of its masked tokens over the whole batch's masked-token count, and the gradients are
summed over the processes, so each holds the single-process gradient (up to float reassociation) and
takes the same optimiser step. Rank 0 alone writes the checkpoints.

Every ``log_every`` steps (default HISTORY_EVERY) and at the last step, a :class:`CurvePoint`
(step, loss, learning rate, tokens per second, training time) is added to the checkpoint's
``history`` and handed to ``on_log``: the one record behind the training curves
(:mod:`attnbench.extrapolation.training.curves`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.evaluation import longrange
from attnbench.extrapolation.model.encoder import MASK_ID, sorted_random_positions
from attnbench.runtime.outputs import atomic_open, write_failed
from attnbench.runtime.progress import Progress, Silent
from attnbench.runtime.schema import Checked, above, at_least, finite, inside, setting, within

if TYPE_CHECKING:
    from attnbench.extrapolation.training.distributed import DataParallel

CHECKPOINT_FORMAT = 1
#: Steps between the points kept in a checkpoint's history (and logged to the training curves).
HISTORY_EVERY = 50


class CurvePoint(NamedTuple):
    """One logged step. A checkpoint's history holds these as plain tuples; checkpoints written
    before the curves existed hold (step, loss) pairs (see ``curves.history_points``)."""

    step: int
    loss: float  # the loss of this step's batch (not smoothed)
    lr: float  # the learning rate this step used
    tokens_per_s: float  # training tokens per second since the previous logged point
    train_time_s: float  # training time up to this step, earlier runs of a resumed one included
    #: Mean masked-token loss on the fixed held-out probe (:class:`HeldoutProbe`); NaN at the
    #: steps where it was not measured (and in checkpoints from before it existed).
    heldout_loss: float = math.nan


@dataclass(frozen=True)
class TrainConfig(Checked):
    """How to train (every field changes the trained weights, so it is part of the checkpoint
    key); a preset's ``[train]``.

    ``window_lengths`` and ``random_positions`` are the two ways to train for lengths beyond
    ``model.train_len`` L (checked against L and the mechanism by :func:`check_training_options`,
    before any training):

    - ``window_lengths`` (e.g. ``[16, 32, 64]``): each step trains at a length drawn from the list,
      L the longest. Variant E scales by log_512 n with n each window's own length (Su Jianlin,
      "Looking at attention's scale operation from entropy invariance", 2021,
      https://kexue.fm/archives/8823); trained at one length its factor is a constant, trained
      from scratch on varying lengths it varies with n, as its derivation assumes.
    - ``random_positions`` P: the rotary positions of each training window are sorted distinct
      ids drawn from 0..P-1 instead of 0..L-1, so training sees the relative distances of
      evaluation up to P (Ruoss, Delétang, Genewein, Grau-Moya, Csordás, Bennani, Legg, Veness,
      "Randomized Positional Encodings Boost Length Generalization of Transformers", ACL 2023,
      https://arxiv.org/abs/2305.16843). Evaluation always uses 0..n-1.

    A ``[variants.NAME]`` table names a mechanism, not a training: a row trained with these
    options is a run of its own, with ``--set train.window_lengths=16,32,64`` or ``--set
    train.random_positions=1024`` (or a preset's ``[train]``) and its own ``--out``.
    """

    batch: int = setting(64, "windows per step", valid=at_least(1))
    steps: int = setting(3000, "optimiser steps", valid=at_least(1))
    #: inf trains to NaN, NaN crashes: both refused.
    lr: float = setting(1e-3, "peak learning rate (AdamW)", valid=finite(above(0)))
    warmup: int = setting(200, "linear warm-up steps, then cosine decay", valid=at_least(0))
    min_lr_ratio: float = setting(0.1, "the cosine ends at lr * min_lr_ratio", valid=within(0, 1))
    weight_decay: float = setting(
        0.01, "AdamW decay on matrices (not on biases, norms)", valid=finite(at_least(0))
    )
    grad_clip: float = setting(1.0, "max global grad norm (0: off)", valid=finite(at_least(0)))
    mask_prob: float = setting(
        0.15, "each position masked independently with this probability", valid=inside(0, 1)
    )
    window_lengths: tuple[int, ...] = setting(
        (),
        "train at varying lengths: each step draws one of these (uniformly over the list, so a "
        "length listed twice comes twice as often) and trains on batch * train_len / length "
        "windows of it, the same tokens every step; each must divide model.train_len; empty: "
        "every step at train_len",
        valid=at_least(1),
    )
    random_positions: int = setting(
        0,
        "randomized positions (Ruoss et al. 2023): each training window's rotary positions are "
        "distinct ids drawn uniformly from 0..P-1 and sorted; P >= model.train_len, typically the "
        "longest evaluation length; evaluation always uses 0..n-1; 0: off",
        valid=at_least(0),
    )
    copy_share: float = setting(
        0.0,
        "share of training windows given a verbatim copy of their own earlier bytes at a distance "
        "below L, so that the model learns to copy (the long-range span measures whether it still "
        "can beyond L: attnbench.extrapolation.evaluation.longrange); 0: off, the published "
        "experiment",
        valid=within(0, 1),
    )
    copy_length: int = setting(
        64, "bytes copied per window when copy_share > 0 (at most L - distance)", valid=at_least(1)
    )
    copy_weight: float = setting(
        1.0,
        "weight, in the training loss, of the masked bytes of a planted copy whose source byte is "
        "visible (those the long-range span scores; the loss is the weighted mean over the masked "
        "bytes; the training curve and the final loss are this weighted loss, not comparable "
        "with a run at 1; the held-out probe's loss stays unweighted), so "
        "that copying carries more of the gradient; needs copy_share > 0; 1: every masked byte "
        "counts the same",
        valid=finite(above(0)),
    )
    final_mask_prob: float = setting(
        0.0,
        "masking probability of the last final_mask_steps steps: a closing phase at another rate "
        "(e.g. the evaluation's) after training at mask_prob; 0: off, every step at mask_prob",
        valid=within(0, 1),
    )
    final_mask_steps: int = setting(
        0, "steps at the end trained at final_mask_prob (with it > 0)", valid=at_least(0)
    )

    def mask_prob_at(self, step: int) -> float:
        """The masking probability of step ``step`` (0-based): mask_prob, or final_mask_prob
        in the last final_mask_steps steps when that phase is on."""
        final = self.final_mask_prob and step >= self.steps - self.final_mask_steps
        return self.final_mask_prob if final else self.mask_prob

    def masked_share(self) -> float:
        """The masking probability averaged over the steps (what a step masks on average)."""
        if not self.final_mask_prob:
            return self.mask_prob
        final = min(self.final_mask_steps, self.steps)
        return ((self.steps - final) * self.mask_prob + final * self.final_mask_prob) / self.steps


def check_training_options(
    cfg: TrainConfig, train_len: int, model: nn.Module | None = None, variant: str = ""
) -> None:
    """Refuse what the training options cannot do, before any training (errors name the
    setting): a window length that does not divide ``train_len`` (L stays the longest length
    trained, and every step holds batch * L tokens), ``random_positions`` below L (a window
    needs L distinct positions), and random positions for a ``model`` (of ``variant``) whose
    mixers do not all apply rotary embedding at explicit positions."""
    bad = [n for n in cfg.window_lengths if n > train_len or train_len % n]
    if bad:
        divisors = ", ".join(str(d) for d in range(1, train_len + 1) if train_len % d == 0)
        raise AttnbenchError(
            f"train.window_lengths = {list(cfg.window_lengths)} is not accepted: "
            f"{', '.join(map(str, bad))} {'does' if len(bad) == 1 else 'do'} not divide "
            f"model.train_len = {train_len}; accepted: lengths dividing train_len ({divisors}): "
            "train_len is the longest length trained, and every step holds batch * train_len "
            "tokens"
        )
    if 0 < cfg.random_positions < train_len:
        raise AttnbenchError(
            f"train.random_positions = {cfg.random_positions} is not accepted: a window needs "
            f"model.train_len = {train_len} distinct positions; accepted: 0 (off) or an integer "
            f">= {train_len}, typically the longest evaluation length"
        )
    if bool(cfg.final_mask_prob) != bool(cfg.final_mask_steps) or (
        cfg.final_mask_prob and not 0 < cfg.final_mask_prob < 1
    ):
        raise AttnbenchError(
            f"train.final_mask_prob = {cfg.final_mask_prob:g} with train.final_mask_steps = "
            f"{cfg.final_mask_steps} is not accepted: the closing phase needs both, a rate "
            "strictly between 0 and 1 and a number of steps >= 1; accepted: both set (e.g. "
            "final_mask_prob=0.15, final_mask_steps=1000) or both 0 (off)"
        )
    if cfg.copy_weight != 1 and not cfg.copy_share:
        raise AttnbenchError(
            f"train.copy_weight = {cfg.copy_weight:g} is not accepted without copies: it weights "
            "the bytes of planted copies, and train.copy_share = 0 plants none; accepted: "
            "copy_weight = 1 (off), or copy_share > 0 beside it"
        )
    if cfg.final_mask_steps > cfg.steps:
        raise AttnbenchError(
            f"train.final_mask_steps = {cfg.final_mask_steps} is not accepted: training has "
            f"train.steps = {cfg.steps}; accepted: 0..{cfg.steps}"
        )
    if cfg.random_positions and model is not None and not _takes_positions(model):
        who = f"variant {variant}" if variant else "this model"
        raise AttnbenchError(
            f"train.random_positions = {cfg.random_positions} is not accepted for {who}: its "
            "layers have no rotary embedding, or do not take explicit positions (only the "
            "generic attention layer does); accepted for it: 0 (train it without, in another "
            "--out)"
        )


def _takes_positions(model: nn.Module) -> bool:
    """Whether ``model`` (an :class:`~attnbench.extrapolation.model.encoder.MLMEncoder`) takes
    rotary positions in every layer; a model without the method takes none."""
    return bool(getattr(model, "takes_positions", lambda: False)())


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of step ``step`` (0-based): linear warm-up, then cosine to min_lr_ratio."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    t = min(1.0, (step - cfg.warmup) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * t))


class BatchSampler:
    """Random training windows and their masks from a uint8 stream, vectorised.

    ``next()`` returns inputs ``[B, L]`` (long, masked positions set to MASK_ID), the targets of
    the masked positions ``[N]`` (long) and the mask ``[B, L]`` (bool); ``next(length)`` the
    same for windows of a shorter ``length`` dividing L, B * L / length of them;
    ``next(length, mask_prob)`` masks at another rate than the sampler's own.
    """

    def __init__(self, stream: Tensor, length: int, batch: int, mask_prob: float, seed: int):
        if stream.numel() < length:
            raise AttnbenchError(
                f"training stream has {stream.numel()} tokens, fewer than one window of "
                f"train_len={length}; use a larger corpus"
            )
        self.stream, self.length, self.batch, self.mask_prob = stream, length, batch, mask_prob
        self.gen = torch.Generator().manual_seed(seed)
        self.offsets = torch.arange(length)  # (L,)

    def next(
        self, length: int | None = None, mask_prob: float | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        length = self.length if length is None else length
        mask_prob = self.mask_prob if mask_prob is None else mask_prob
        if not 1 <= length <= self.length or self.length % length:
            raise AttnbenchError(f"window length {length} does not divide {self.length}")
        count = self.batch * self.length // length  # W windows: the tokens of B windows of L
        offsets = self.offsets if length == self.length else torch.arange(length)  # (l,)
        starts = torch.randint(
            0, self.stream.numel() - length + 1, (count,), generator=self.gen
        )  # (W,)
        tokens = self.stream[starts[:, None] + offsets].long()  # (W, l)
        mask = torch.rand(tokens.shape, generator=self.gen) < mask_prob  # (W, l)
        return tokens.masked_fill(mask, MASK_ID), tokens[mask], mask

    def state(self) -> Tensor:
        return self.gen.get_state()

    def set_state(self, state: Tensor) -> None:
        self.gen.set_state(state)


class Batch(NamedTuple):
    """One training step's batch: W windows of one length l, W * l = batch * train_len."""

    inputs: Tensor  # (W, l) long, masked positions set to MASK_ID
    targets: Tensor  # (N,) the masked tokens, in row-major order
    mask: Tensor  # (W, l) bool
    positions: Tensor | None  # (W, l) long: each window's rotary positions; None: 0..l-1
    weights: Tensor | None = None  # (N,) float: each masked token's weight in the loss; None: 1


class TrainingBatches:
    """Each step's :class:`Batch` under the training options of ``cfg`` (see
    :class:`TrainConfig`): the windows and masks from a :class:`BatchSampler` seeded by ``seed``
    (the default run's, draw for draw, when both options are off), the step's length
    (``window_lengths``) and the windows' positions (``random_positions``) each from a generator
    of its own, seeded from ``seed`` and its purpose. Every generator's state is in the
    checkpoint (:meth:`state`), so a resumed run draws what an uninterrupted one would. The
    masking rate is the step's (:meth:`TrainConfig.mask_prob_at`): the batches count the steps
    they have drawn (``drawn``; a resumed run sets it to the checkpoint's step)."""

    def __init__(self, stream: Tensor, cfg: TrainConfig, train_len: int, seed: int):
        check_training_options(cfg, train_len)
        self.cfg, self.drawn = cfg, 0
        self.windows = BatchSampler(stream, train_len, cfg.batch, cfg.mask_prob, seed)
        self.train_len, self.lengths, self.span = (
            train_len,
            cfg.window_lengths,
            cfg.random_positions,
        )
        self.generators: dict[str, torch.Generator] = {}
        if self.lengths:
            self.generators["lengths"] = _own_generator(seed, "lengths")
        if self.span:
            self.generators["positions"] = _own_generator(seed, "positions")
        self.copy_share, self.copy_length = cfg.copy_share, cfg.copy_length
        self.copy_weight = cfg.copy_weight
        if self.copy_share:
            self.generators["copies"] = _own_generator(seed, "copies")

    def next(self) -> Batch:
        length = self._length()
        mask_prob = self.cfg.mask_prob_at(self.drawn)
        self.drawn += 1
        inputs, targets, mask = self.windows.next(length, mask_prob)  # (W, l), (N,), (W, l)
        weights = None
        if self.copy_share:
            inputs, targets, weights = self._with_copies(inputs, targets, mask)
        return Batch(inputs, targets, mask, self._positions(len(inputs), length), weights)

    def _with_copies(
        self, inputs: Tensor, targets: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """The windows with copies planted (:func:`longrange.plant_training_copies`) under the
        same masks (the masks do not depend on the text, so they stay as drawn), and the masked
        tokens' loss weights (:func:`longrange.copy_weights`; None when copy_weight is 1)."""
        tokens = inputs.masked_scatter(mask, targets)  # (W, l) the unmasked text
        gen = self.generators["copies"]
        tokens, sources = longrange.plant_training_copies(
            tokens, self.copy_share, self.copy_length, gen
        )
        weights = None
        if self.copy_weight != 1:
            weights = longrange.copy_weights(sources, mask, self.copy_weight)  # (N,)
        return tokens.masked_fill(mask, MASK_ID), tokens[mask], weights

    def _length(self) -> int:
        """This step's window length: one of ``window_lengths``, uniformly; else train_len."""
        if not self.lengths:
            return self.train_len
        pick = torch.randint(len(self.lengths), (1,), generator=self.generators["lengths"])
        return self.lengths[int(pick)]

    def _positions(self, windows: int, length: int) -> Tensor | None:
        """``windows`` rows of ``length`` distinct positions from 0..P-1, each sorted (the
        indices of the ``length`` largest of P uniform draws: a uniform random subset), or None
        when random positions are off."""
        if not self.span:
            return None
        return sorted_random_positions(windows, length, self.span, self.generators["positions"])

    def state(self) -> dict[str, Tensor]:
        """The generators' states: ``windows`` (the sampler's) and those of the options on."""
        own = {name: gen.get_state() for name, gen in self.generators.items()}
        return {"windows": self.windows.state(), **own}

    def set_state(self, state: Mapping[str, Tensor], drawn: int = 0) -> None:
        """The generators' states of :meth:`state`, after ``drawn`` steps."""
        self.drawn = drawn
        self.windows.set_state(state["windows"])
        for name, gen in self.generators.items():
            gen.set_state(state[name])


def _own_generator(seed: int, purpose: str) -> torch.Generator:
    """A generator for one kind of draw, seeded from the run's ``seed`` and ``purpose`` (a hash:
    no two purposes or seeds share a stream)."""
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


@dataclass(frozen=True)
class HeldoutProbe:
    """A fixed batch of held-out windows at the training length, masked once by its own seed:
    its loss, measured every ``every`` steps during training, is the held-out curve beside the
    training loss (converging, or over-fitting the training text?). Measuring it draws no
    random number and changes no weight: the trained model is the same with or without it."""

    inputs: Tensor  # (W, L) long, masked positions set to MASK_ID
    targets: Tensor  # (N,) the masked tokens
    mask: Tensor  # (W, L) bool
    every: int  # steps between measurements (the last step is always measured)

    @classmethod
    def from_stream(
        cls, stream: Tensor, length: int, windows: int, mask_prob: float, seed: int, every: int
    ) -> HeldoutProbe | None:
        """``windows`` windows of ``length`` spread evenly over the held-out ``stream``; None
        when ``every`` is 0 or the stream holds no window."""
        windows = min(windows, stream.numel() // length)
        if every < 1 or windows < 1:
            return None
        span = stream.numel() - length  # integer spacing: exact for any stream size
        starts = torch.arange(windows) * span // max(windows - 1, 1)  # (W,)
        tokens = stream[starts[:, None] + torch.arange(length)].long()  # (W, L)
        mask = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(seed)) < mask_prob
        if not mask.any():
            mask[0, 0] = True
        return cls(tokens.masked_fill(mask, MASK_ID), tokens[mask], mask, every)

    def loss(self, model: nn.Module, device: torch.device, windows: int = 64) -> float:
        """Mean cross-entropy over the probe's masked tokens, ``windows`` windows at a time (at
        most the memory of a training batch's forward)."""
        was_training = model.training
        model.eval()
        batch = (self.inputs, self.targets, self.mask)
        step = max(1, windows)
        try:
            with torch.no_grad():  # each slice's share of the mean, as a rank's under torchrun
                return sum(
                    share_loss(model, batch, slice(i, i + step), device).item()
                    for i in range(0, len(self.inputs), step)
                )
        finally:
            model.train(was_training)


def masked_loss(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    mask: Tensor,
    positions: Tensor | None = None,
    weights: Tensor | None = None,
) -> Tensor:
    """Mean cross-entropy over the masked positions; only those go through the last FFN and the
    classifier (``MLMEncoder.hidden_at``). ``positions``: the windows' rotary positions [B, L]
    (None: 0..L-1). ``weights`` [N]: each masked token's weight, the loss their weighted mean
    (None: the plain mean)."""
    if positions is None:  # a model whose mixers take no positions is called as before
        hidden = model.hidden_at(inputs, mask)  # (N, C)
    else:
        hidden = model.hidden_at(inputs, mask, positions)  # (N, C)
    logits = model.logits(hidden)  # (N, 256)
    if weights is None:
        return F.cross_entropy(logits, targets)
    return (F.cross_entropy(logits, targets, reduction="none") * weights).sum() / weights.sum()


def share_loss(
    model: nn.Module,
    batch: tuple[Tensor, Tensor, Tensor],
    share: slice,
    device: torch.device,
    positions: Tensor | None = None,
    weights: Tensor | None = None,
) -> Tensor:
    """One rank's part of the batch's :func:`masked_loss`: the summed cross-entropy of the masked
    tokens in its windows ``share``, over the masked-token count (with weights, the total weight)
    of the WHOLE batch (known to every rank, since every rank draws the whole batch). Summed over
    the ranks, these losses and their gradients are the whole batch's (weighted) mean, whatever
    the split. ``positions``: the whole
    batch's rotary positions [B, L] (None: 0..L-1). ``weights``: the whole batch's loss weights
    [N] (None: 1 each); the sums are then weighted and over the whole batch's total weight."""
    inputs, targets, mask = batch  # (B, L), (N,), (B, L) on the CPU
    first = int(mask[: share.start].sum())  # targets are the masked tokens in row-major order
    count = int(mask[share].sum())
    inputs = inputs[share].to(device, non_blocking=True)  # (b, L)
    mask = mask[share].to(device, non_blocking=True)  # (b, L)
    targets = targets[first : first + count].to(device, non_blocking=True)  # (n,)
    if positions is None:
        hidden = model.hidden_at(inputs, mask)  # (n, C)
    else:
        hidden = model.hidden_at(inputs, mask, positions[share].to(device, non_blocking=True))
    logits = model.logits(hidden)  # (n, 256)
    if weights is None:  # N: the whole batch's masked tokens
        return F.cross_entropy(logits, targets, reduction="sum") / len(batch[1])
    mine = weights[first : first + count].to(device, non_blocking=True)  # (n,)
    summed = (F.cross_entropy(logits, targets, reduction="none") * mine).sum()
    return summed / float(weights.sum())


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8)


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------


def key_hash(key: Mapping[str, Any]) -> str:
    """A short stable hash of a checkpoint key (plain JSON data)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def atomic_save(obj: Any, path: Path) -> None:
    """Save whole or not at all: a temporary file, renamed when complete, removed on failure (a
    full disk leaves the previous checkpoint and no temporary file, and says so in one line
    naming the checkpoint: :class:`~attnbench.runtime.outputs.WriteFailed`). torch.save is
    given the open file, not its name: writing to a name, a full disk is a RuntimeError from
    its zip writer (``enforce fail at inline_container.cc``) that names neither file nor cause;
    writing to a file, the OSError of the write comes first, and the RuntimeError of closing
    the archive follows it (it is found there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    try:
        with atomic_open(path, "wb", what="checkpoint") as f:
            torch.save(obj, f)
    except RuntimeError as e:
        cause = _os_error_behind(e)
        if cause is None and "inline_container" not in str(e):
            raise
        failed = cause or OSError(None, "the write failed (a full disk?)")
        raise write_failed(path, failed, "checkpoint", existed) from None


def _os_error_behind(e: BaseException | None) -> OSError | None:
    """The OSError a RuntimeError was raised while handling, if any (torch's zip writer)."""
    while e is not None and not isinstance(e, OSError):
        e = e.__context__
    return e


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a torn or foreign file: say which, in one line
        raise AttnbenchError(f"cannot read checkpoint {path}: {type(e).__name__}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise AttnbenchError(f"{path} is not an attnbench extrapolation checkpoint")
    return ckpt


def key_difference(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> str:
    """'steps 3000 -> 100, heads 2 -> 4': what differs between two flat-ish keys."""
    diffs = []
    for name in sorted(set(saved) | set(wanted)):
        a, b = saved.get(name), wanted.get(name)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            inner = key_difference(a, b)
            diffs.append(inner)
        else:
            diffs.append(f"{name} {a!r} -> {b!r}")
    return ", ".join(diffs)


def check_key(ckpt: Mapping[str, Any], key: Mapping[str, Any], path: Path) -> None:
    if ckpt.get("key_hash") != key_hash(key):
        diff = key_difference(ckpt.get("key", {}), key) or "unknown fields"
        raise AttnbenchError(
            f"checkpoint {path} was trained with another config ({diff}); use the same options, "
            "another --out, or --overwrite"
        )


# --------------------------------------------------------------------------------------------
# Interruption
# --------------------------------------------------------------------------------------------


class Interrupted(Exception):
    """Training stopped by Ctrl-C or SIGTERM after writing a checkpoint."""

    def __init__(self, path: Path, step: int, total: int):
        super().__init__(f"interrupted at step {step}/{total}; checkpoint {path}")
        self.path, self.step, self.total = path, step, total

    def __reduce__(self):  # crosses from a worker process to the run intact
        return (Interrupted, (self.path, self.step, self.total))


class StopFlag:
    """Set by SIGINT/SIGTERM: the loop finishes its step, saves and stops. A second Ctrl-C
    raises KeyboardInterrupt at once (and the last periodic checkpoint remains)."""

    def __init__(self) -> None:
        self.set = False

    def _handler(self, signum, frame) -> None:
        if self.set and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.set = True

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        old = {}
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                old[sig] = signal.signal(sig, self._handler)
        except ValueError:  # not the main thread: no handlers, periodic checkpoints only
            pass
        try:
            yield self
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


@dataclass
class TrainOutcome:
    steps: int
    train_time_s: float
    final_loss: float
    tokens_per_s: float
    resumed_from: int


def train(
    model: nn.Module,
    stream: Tensor,
    cfg: TrainConfig,
    *,
    train_len: int,
    seed: int,
    path: Path,
    key: Mapping[str, Any],
    ckpt_every: int = 500,
    resume: dict[str, Any] | None = None,
    progress: Progress | None = None,
    title: str = "",
    on_step: Callable[[int], None] | None = None,
    on_log: Callable[[CurvePoint], None] | None = None,
    log_every: int = HISTORY_EVERY,
    dist: DataParallel | None = None,
    heldout: HeldoutProbe | None = None,
) -> TrainOutcome:
    """Train ``model`` in place (its weights already initialised from ``seed``, on the device
    it is on; batches are drawn on the CPU, so the data order is the same on every device).

    ``resume``: a loaded checkpoint of the same key to continue from. ``on_step(step)`` is called
    after every completed step (tests use it to deliver a signal mid-run). ``on_log(point)`` is
    called with every point added to the history (every ``log_every`` steps and the last one).
    ``dist``: train data-parallel over torchrun's processes (see the module docstring); only its
    rank 0 writes ``path``, and every rank returns once the file is there. ``heldout``: measure
    its loss at the first logged step at or past each multiple of ``heldout.every`` and at the
    last step (into the point's ``heldout_loss``; its time is not counted as training time).
    """
    if log_every < 1:
        raise AttnbenchError(f"invalid log_every={log_every}; accepted: >= 1")
    check_training_options(cfg, train_len, model)
    progress = progress or Silent()
    sampler = TrainingBatches(stream, cfg, train_len, seed)
    device = next(model.parameters()).device
    opt = make_optimizer(model, cfg)
    start, elapsed, history = _restore(resume, model, opt, sampler)

    def save(step: int, done: bool, loss: float) -> None:  # under torchrun, rank 0 alone writes
        if dist is None or dist.is_main:
            seconds = elapsed + (time.perf_counter() - t0)  # t0: moved on by the held-out probe
            state = _checkpoint(key, step, done, model, opt, sampler, seconds, loss, history)
            atomic_save(state, path)

    model.train()
    tokens_per_step = cfg.batch * train_len
    t0 = time.perf_counter()
    step, loss_value, smooth = start, float("nan"), None
    recorder = _CurveRecorder(history, heldout, on_log, tokens_per_step, start, t0, cfg)
    progress.start(title, cfg.steps, start)
    try:
        with StopFlag().installed() as stop:
            while step < cfg.steps:
                loss_value = _train_step(model, opt, sampler, cfg, step, device, dist)
                step += 1
                smooth = loss_value if smooth is None else 0.98 * smooth + 0.02 * loss_value
                run_s = time.perf_counter() - t0
                if step % log_every == 0 or step == cfg.steps:
                    lr = opt.param_groups[0]["lr"]
                    t0 += recorder.record(step, loss_value, lr, t0 + run_s, elapsed + run_s, model)
                rate = (step - start) * tokens_per_step / max(run_s, 1e-9)
                progress.advance(step, loss=smooth, tokens_per_s=rate)
                if on_step is not None:
                    on_step(step)
                if step == cfg.steps:
                    break
                if stop.set if dist is None else dist.any(stop.set):
                    save(step, False, loss_value)
                    _wait_for_main(dist)
                    raise Interrupted(path, step, cfg.steps)
                if ckpt_every and step % ckpt_every == 0:
                    save(step, False, loss_value)
            save(step, True, loss_value)
            _wait_for_main(dist)
    finally:
        progress.finish()
    run_s = time.perf_counter() - t0
    rate = (step - start) * tokens_per_step / max(run_s, 1e-9)
    return TrainOutcome(step, elapsed + run_s, loss_value, tokens_per_s=rate, resumed_from=start)


def _restore(
    resume: dict[str, Any] | None,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    sampler: TrainingBatches,
) -> tuple[int, float, list]:
    """Load ``resume`` (a checkpoint, or None to start afresh) into the model, the optimiser,
    the sampler and the global generators; returns (step, training time so far, history)."""
    if resume is None:
        return 0, 0.0, []
    model.load_state_dict(resume["model"])
    opt.load_state_dict(resume["optim"])
    rng = resume["rng"]
    sampler.set_state({"windows": rng["sampler"], **rng.get("options", {})}, resume["step"])
    torch.set_rng_state(rng["torch"])
    random.setstate(_python_state(rng["python"]))
    return resume["step"], resume["train_time_s"], list(resume["history"])


def _checkpoint(key, step, done, model, opt, sampler, train_time_s, loss, history) -> dict:
    """Everything a checkpoint holds (see the module docstring)."""
    state = sampler.state()
    return {
        "format": CHECKPOINT_FORMAT,
        "key": dict(key),
        "key_hash": key_hash(key),
        "step": step,
        "done": done,
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "rng": {  # "sampler": the windows' generator; "options": those of the options on
            "sampler": state.pop("windows"),
            "options": state,
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
        },
        "train_time_s": train_time_s,
        "final_loss": loss,
        "history": history,
    }


def _train_step(
    model, opt, sampler: TrainingBatches, cfg: TrainConfig, step: int, device, dist
) -> float:
    """Optimiser step ``step`` (0-based) on the next batch (this rank's share of its windows
    under torchrun); returns the batch's loss (the whole batch's, summed over the ranks)."""
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg)
    batch = sampler.next()
    if dist is None:
        loss = masked_loss(model, *(_to(t, device) for t in batch))
    else:  # every rank draws the whole batch: the sampler stays in step everywhere
        share = dist.share(len(batch.inputs))  # this rank's windows (W depends on the length)
        loss = share_loss(model, batch[:3], share, device, batch.positions, batch.weights)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if dist is not None:
        dist.all_reduce_gradients(model)  # now the whole batch's gradient
    if cfg.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    if dist is None:
        return loss.item()
    return dist.all_reduce_sum(loss.detach().clone()).item()


class _CurveRecorder:
    """The points of one training's history (shared with its checkpoints), each handed to
    ``on_log``; the held-out probe measured at the first logged step at or past each multiple
    of its ``every`` (continuing a resumed history's count) and at the last step."""

    def __init__(self, history: list, heldout: HeldoutProbe | None, on_log, tokens_per_step: int,
                 start: int, started_at: float, cfg: TrainConfig) -> None:  # fmt: skip
        self.history, self.heldout, self.on_log = history, heldout, on_log
        self.tokens_per_step, self.cfg = tokens_per_step, cfg
        self.logged_step, self.logged_at = start, started_at
        self.next_probe = None
        if heldout is not None:  # the first multiple of ``every`` not yet measured (also on resume)
            measured = [p[0] for p in history if len(p) > 5 and not math.isnan(p[5])]
            every = heldout.every
            self.next_probe = ((measured[-1] if measured else 0) // every + 1) * every

    def record(self, step: int, loss_value: float, lr: float, now: float, train_time_s: float,
               model: nn.Module) -> float:  # fmt: skip
        """Add the point of ``step`` (``now``: its clock time); returns the seconds the held-out
        probe took (not training time: the caller moves its clock on by as much)."""
        rate = (step - self.logged_step) * self.tokens_per_step / max(now - self.logged_at, 1e-9)
        heldout_loss, probe_s = math.nan, 0.0
        if self.next_probe is not None and (step >= self.next_probe or step == self.cfg.steps):
            device = next(model.parameters()).device
            heldout_loss = self.heldout.loss(model, device, self.cfg.batch)
            self.next_probe = (step // self.heldout.every + 1) * self.heldout.every
            probe_s = time.perf_counter() - now
        point = CurvePoint(step, loss_value, lr, rate, train_time_s, heldout_loss)
        self.history.append(tuple(point))
        self.logged_step, self.logged_at = step, now + probe_s
        if self.on_log is not None:
            self.on_log(point)
        return probe_s


def _to(tensor: Tensor | None, device: torch.device) -> Tensor | None:
    return None if tensor is None else tensor.to(device, non_blocking=True)


def _wait_for_main(dist: DataParallel | None) -> None:
    """Under torchrun, every rank waits until rank 0 has written the checkpoint (they read it
    next)."""
    if dist is not None:
        dist.barrier()


def _python_state(state: Any) -> tuple:
    """random.setstate wants tuples; a checkpoint may hand back lists."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def plain(obj: Any) -> Any:
    """Dataclass -> dict, for checkpoint keys and sidecars."""
    return asdict(obj)
