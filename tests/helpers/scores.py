"""Inputs whose attention scores reach a chosen size (issue 64: saturated softmax rows)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Mechanism, Shape


def largest_score(q: Tensor, k: Tensor) -> float:
    """S = max |q_i . k_j| / sqrt(D) over every (query, key) pair of every head (keys shared by
    several query heads, as in MQA/GQA, repeated to match)."""
    q, k = q.double(), k.double()
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return (q @ k.transpose(-2, -1)).abs().max().item() / math.sqrt(q.shape[-1])


def inputs_at_scores(
    mech: Mechanism,
    shape: Shape,
    params: Mapping[str, Any],
    scores: float,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    exact: bool = False,
) -> dict[str, Tensor]:
    """:func:`make_inputs` drawn in float64 with q scaled so that :func:`largest_score` is about
    ``scores``, every input then rounded to ``dtype`` once.

    ``exact``: q and k rounded to integers (k to -4..4), with a head dim that is a power of 4, so
    that every score q.k / sqrt(D) is exact in float32 whatever the order of the sum (integers
    below 2^24, times a power of two). At large scores a rounded score moves the softmax by
    eps * S, so two valid orders of the same sum give different answers at rows whose top
    scores are close; with exact scores a comparison measures the path's own numerics (its
    exponentials, sums, merges and backward), not that conditioning."""
    x = make_inputs(mech, mech.shape_for(shape, params), params, dtype=torch.float64, seed=seed)
    if exact:
        if math.log(shape.head_dim, 4) % 1:
            raise ValueError("exact scores need a head dim that is a power of 4")
        x["k"] = (x["k"] * 2).round().clamp(-4, 4)
        x["q"] = (x["q"] * (scores / largest_score(x["q"], x["k"]))).round()
    else:
        x["q"] = x["q"] * (scores / largest_score(x["q"], x["k"]))
    return {name: t.to(dtype) for name, t in x.items()}
