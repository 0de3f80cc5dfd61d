"""How to train (:class:`TrainConfig`, a preset's ``[train]``): the optimiser's settings and
schedule (:func:`lr_at`: linear warm-up, then cosine), the masking rate, and the options that train
for lengths beyond the training length L, checked against L and the model before any training
(:func:`check_training_options`).

Two training options, both off by default, which leaves every batch as it was: ``window_lengths``
draws each step's window length from a list (windows of every length hold the same ``batch *
train_len`` tokens), and ``random_positions`` gives each training window sorted random rotary
positions (Ruoss et al. 2023). A closing masking phase (``final_mask_prob`` for the last
``final_mask_steps`` steps) trains the end at another masking rate; ``copy_share`` plants copies
for the long-range span (:mod:`attnbench.extrapolation.training.copies`). How the batches draw
them: :mod:`attnbench.extrapolation.training.batches`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from attnbench.core.errors import AttnbenchError
from attnbench.runtime.schema import (
    Checked,
    above,
    above_up_to,
    at_least,
    finite,
    inside,
    setting,
    within,
)


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
    #: inf trains to NaN, NaN crashes, 1e308 overflows float32: all refused (above 1: diverges).
    lr: float = setting(1e-3, "peak learning rate (AdamW)", valid=above_up_to(0, 1))
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
