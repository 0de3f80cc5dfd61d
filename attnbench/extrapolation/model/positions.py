"""Position encodings beyond the plain 0..n-1 of a window: the randomized positions of Ruoss et al.
2023 (training draws them, :func:`sorted_random_positions`; evaluation draws them as the paper's
reference code does, :class:`EvalPositions`), and the rotary rotation at given angles
(:func:`rotate`) that the evaluation-time tricks apply by hand.

Ruoss, Delétang, Genewein, Grau-Moya, Csordás, Bennani, Legg, Veness, "Randomized Positional
Encodings Boost Length Generalization of Transformers", ACL 2023,
https://arxiv.org/abs/2305.16843.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def sorted_random_positions(windows: int, length: int, span: int, gen: torch.Generator) -> Tensor:
    """``windows`` rows of ``length`` distinct positions from 0..span-1, each sorted: the indices
    of the ``length`` largest of ``span`` uniform draws, a uniform random subset (the randomized
    positions of Ruoss et al. 2023). [windows, length] long."""
    keys = torch.rand((windows, span), generator=gen, dtype=torch.float64)  # (W, P)
    return keys.topk(length, dim=1).indices.sort(dim=1).values


@dataclass(frozen=True)
class EvalPositions:
    """The rotary positions of evaluation windows for a model trained with randomized positions
    (``train.random_positions`` = ``span``): as the reference code of Ruoss et al. 2023 does at
    test time, each window of length n < span gets sorted distinct ids drawn from 0..span-1
    (seeded by ``seed`` and n: the same draw for every row and training seed); n >= span: the
    plain 0..n-1 (None)."""

    span: int
    seed: int

    def draw(self, windows: int, length: int) -> Tensor | None:
        if length >= self.span:
            return None
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + length) % 2**63)
        return sorted_random_positions(windows, length, self.span, gen)


def rotate(x: Tensor, angles: Tensor) -> Tensor:
    """Rotary rotation of x [B, H, T, D] by angles [T, D/2] (or [1, D/2]), in Rotary's layout:
    pairs (x[..., i], x[..., i + D/2])."""
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)  # (T, D/2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, H, T, D)
