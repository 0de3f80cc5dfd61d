"""Verbatim copies planted in windows of text: the long-range span's copies
(:mod:`attnbench.extrapolation.evaluation.longrange`, where the method is described) and the
training option that plants the same kind of copy in a share of the training windows
(``train.copy_share``, :func:`plant_training_copies`), with the loss weights of their bytes
(``train.copy_weight``, :func:`copy_weights`).

A copy of the m bytes ``distance`` back is written over a window's own text; the control swaps the
two pieces (the same bytes at the copy, nothing to copy from). GAP bytes are left between the
source piece and the copy, so that the copy's nearest left neighbours are the same text in the
copy window and in its control.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: The shortest copy worth scoring.
MIN_COPY = 16


#: Bytes left between the source piece and the copy: the copy's nearest left neighbours are the
#: same text in the copy window and in its control (module docstring).
GAP = 4


@dataclass(frozen=True)
class Copies:
    """Windows with a planted copy: ``tokens`` [W, n] (the copy in place), ``control`` [W, n]
    (the two pieces swapped: the same bytes at the copy, nothing to copy from), ``region``
    [W, n] (bool, the copied bytes), the distance and the copy length."""

    tokens: Tensor
    control: Tensor
    region: Tensor
    distance: int
    length: int


def plant(tokens: Tensor, distance: int, length: int, gen: torch.Generator) -> Copies:
    """Copy, in every window of ``tokens`` [W, n], the m = min(length, distance - GAP,
    n - distance) bytes ``distance`` back to a start drawn from ``gen`` (module docstring); the
    control swaps the two pieces."""
    W, n = tokens.shape
    m = min(length, distance - GAP, n - distance)
    if distance < 1 or m < 1:
        raise ValueError(f"no room for a copy at distance {distance} in windows of {n}")
    starts = torch.randint(distance, n - m + 1, (W,), generator=gen)  # (W,)
    at = starts[:, None] + torch.arange(m)  # (W, m) the copy's places
    source = tokens.gather(1, at - distance)  # (W, m)
    copied, control = tokens.clone(), tokens.clone()
    copied.scatter_(1, at, source)
    control.scatter_(1, at, source)
    control.scatter_(1, at - distance, tokens.gather(1, at))
    region = torch.zeros_like(tokens, dtype=torch.bool).scatter_(1, at, True)
    return Copies(copied, control, region, distance, m)


def plant_training_copies(
    tokens: Tensor, share: float, length: int, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Training windows [B, L] with, in each window chosen with probability ``share``, a copy
    (:func:`plant`) at a distance drawn uniformly from MIN_COPY // 2 .. L - MIN_COPY // 2 (every
    distance below L the evaluation scores there); the rest unchanged. Unmasked tokens in,
    unmasked tokens out (masks do not depend on the text: the caller keeps its own), with the
    sources [B, L] (long): for each copied byte the position it repeats, -1 elsewhere."""
    B, L = tokens.shape
    sources = torch.full(tokens.shape, -1, dtype=torch.long)  # (B, L)
    lo, hi = max(GAP + 1, MIN_COPY // 2), L - MIN_COPY // 2
    if share <= 0 or hi <= lo:
        return tokens, sources
    chosen = torch.rand(B, generator=gen) < share  # (B,)
    dist = torch.randint(lo, hi + 1, (B,), generator=gen)  # (B,)
    out = tokens.clone()
    for d in dist[chosen].unique().tolist():
        rows = torch.nonzero(chosen & (dist == d)).flatten()
        copies = plant(out[rows], d, length, gen)
        out[rows] = copies.tokens
        sources[rows] = torch.where(copies.region, torch.arange(L) - d, -1)
    return out, sources


def copy_weights(sources: Tensor, mask: Tensor, weight: float) -> Tensor:
    """[N] float, one per masked byte in row-major order: ``weight`` for the recoverable bytes of
    a planted copy (masked, their source visible: what the long-range span scores), 1 for the
    others. ``sources`` [B, L] as :func:`plant_training_copies` returns them, ``mask`` [B, L]."""
    copied = sources >= 0
    source_visible = ~mask.gather(1, sources.clamp(min=0))  # (B, L)
    recoverable = mask & copied & source_visible  # (B, L)
    return torch.where(recoverable, weight, 1.0)[mask].float()  # (N,)
