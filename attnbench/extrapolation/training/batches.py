"""The training batches and the losses on them.

Masking scheme (training and evaluation alike): every position is replaced by the [MASK] id
independently with probability ``mask_prob`` (15 %); the loss and the accuracy are over the masked
positions only. Batches are ``batch`` windows of ``train_len`` bytes starting at uniformly random
offsets of the training stream. Offsets and masks come from one ``torch.Generator`` seeded by the
run's seed (not by the variant), so every variant of a seed sees the same batches in the same order.

The training options (:class:`~attnbench.extrapolation.training.options.TrainConfig`) each draw
from a generator of their own seeded from the run's seed (:class:`TrainingBatches`), so turning
one on leaves the other draws as they were (with random positions alone, every step's windows and
masks are the default run's). A closing masking phase (``final_mask_prob`` for the last
``final_mask_steps`` steps) changes only the threshold the masks' uniform draws are compared with:
every draw stays where it was, and a lower final rate keeps a subset of the plain run's masks.

Under torchrun every process draws the same full batch and computes the loss of its own share of
the windows (:func:`share_loss`): the summed cross-entropy of its masked tokens over the whole
batch's masked-token count, so that the shares add up to the whole batch's loss.
:class:`HeldoutProbe` is the fixed held-out batch of the training curves.

The causal objective (next-byte prediction, ``causal=True``) draws windows of L + 1 bytes from
the same generator instead, with no masks: the inputs are the first L bytes, the targets the last
L (position t predicts byte t + 1), and the batch's ``mask`` is all True, so every position is
read by the loss through the same :func:`masked_loss`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.model.encoder import MASK_ID
from attnbench.extrapolation.model.positions import sorted_random_positions
from attnbench.extrapolation.training import copies
from attnbench.extrapolation.training.options import TrainConfig, check_training_options


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

    def next_causal(self, length: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Windows for next-byte prediction: inputs [W, l] (bytes, nothing masked), targets
        [W * l] (each position's next byte, row-major) and an all-True mask [W, l]; W as
        :meth:`next`, each window drawn with one byte more than its inputs."""
        length = self.length if length is None else length
        if not 1 <= length <= self.length or self.length % length:
            raise AttnbenchError(f"window length {length} does not divide {self.length}")
        if self.stream.numel() < length + 1:
            raise AttnbenchError(
                f"training stream has {self.stream.numel()} tokens, fewer than one window of "
                f"{length} and its next byte; use a larger corpus"
            )
        count = self.batch * self.length // length
        starts = torch.randint(
            0, self.stream.numel() - length, (count,), generator=self.gen
        )  # (W,)
        tokens = self.stream[starts[:, None] + torch.arange(length + 1)].long()  # (W, l + 1)
        inputs = tokens[:, :-1]  # (W, l)
        return inputs, tokens[:, 1:].reshape(-1), torch.ones_like(inputs, dtype=torch.bool)

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
    they have drawn (``drawn``; a resumed run sets it to the checkpoint's step). ``causal``: the
    next-byte batches of the causal objective (no masks, so no copies or masking phases)."""

    def __init__(
        self, stream: Tensor, cfg: TrainConfig, train_len: int, seed: int, causal: bool = False
    ):
        check_training_options(cfg, train_len)
        if causal and (cfg.copy_share or cfg.final_mask_prob):
            raise AttnbenchError(
                "the causal objective has no masks: train.copy_share and train.final_mask_prob "
                "must be 0 with it"
            )
        self.cfg, self.drawn, self.causal = cfg, 0, causal
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
        if self.causal:
            inputs, targets, mask = self.windows.next_causal(length)  # (W, l), (W*l,), (W, l)
        else:
            inputs, targets, mask = self.windows.next(length, mask_prob)  # (W, l), (N,), (W, l)
        weights = None
        if self.copy_share:
            inputs, targets, weights = self._with_copies(inputs, targets, mask)
        return Batch(inputs, targets, mask, self._positions(len(inputs), length), weights)

    def _with_copies(
        self, inputs: Tensor, targets: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """The windows with copies planted (:func:`copies.plant_training_copies`) under the
        same masks (the masks do not depend on the text, so they stay as drawn), and the masked
        tokens' loss weights (:func:`copies.copy_weights`; None when copy_weight is 1)."""
        tokens = inputs.masked_scatter(mask, targets)  # (W, l) the unmasked text
        gen = self.generators["copies"]
        tokens, sources = copies.plant_training_copies(
            tokens, self.copy_share, self.copy_length, gen
        )
        weights = None
        if self.copy_weight != 1:
            weights = copies.copy_weights(sources, mask, self.copy_weight)  # (N,)
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
        cls,
        stream: Tensor,
        length: int,
        windows: int,
        mask_prob: float,
        seed: int,
        every: int,
        causal: bool = False,
    ) -> HeldoutProbe | None:
        """``windows`` windows of ``length`` spread evenly over the held-out ``stream``; None
        when ``every`` is 0 or the stream holds no window. ``causal``: next-byte windows (one
        byte more each, no masks: :meth:`BatchSampler.next_causal`)."""
        windows = min(windows, (stream.numel() - causal) // length)
        if every < 1 or windows < 1:
            return None
        span = stream.numel() - length - causal  # integer spacing: exact for any stream size
        starts = torch.arange(windows) * span // max(windows - 1, 1)  # (W,)
        if causal:
            tokens = stream[starts[:, None] + torch.arange(length + 1)].long()  # (W, L + 1)
            inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)
            return cls(inputs, targets, torch.ones_like(inputs, dtype=torch.bool), every)
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
