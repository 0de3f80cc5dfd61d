"""Random inputs for any mechanism, built from its declaration (tests and benchmarks share this)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnbench.core.spec import Mechanism, Shape


def make_inputs(
    mech: Mechanism,
    shape: Shape,
    params: Mapping[str, Any],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    requires_grad: bool = False,
) -> dict[str, Tensor]:
    """q, k, v and every extra input the mechanism declares for these params, drawn from N(0, 1)
    (extra inputs scaled by their ``init_std``). ``shape`` should already be ``mech.shape_for``'d.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def draw(dims: tuple[int, ...], std: float = 1.0) -> Tensor:
        t = (torch.randn(dims, generator=gen, dtype=torch.float64) * std).to(dtype).to(device)
        return t.requires_grad_(requires_grad)

    B, T = shape.batch, shape.seq_len
    tensors = {
        "q": draw((B, shape.heads, T, shape.head_dim)),
        "k": draw((B, shape.hkv, T, shape.head_dim)),
        "v": draw((B, shape.hkv, T, shape.dv)),
    }
    for spec in mech.extras_for(params):
        tensors[spec.name] = draw(tuple(spec.shape(shape, params)), spec.init_std)
    return tensors


def input_elements(mech: Mechanism, shape: Shape, params: Mapping[str, Any]) -> int:
    """How many numbers :func:`make_inputs` draws for this shape and these params (q, k, v and
    every extra input), counted without making a tensor: what a caller checks against the memory
    it has before asking for them."""
    dims = [
        (shape.batch, shape.heads, shape.seq_len, shape.head_dim),
        (shape.batch, shape.hkv, shape.seq_len, shape.head_dim),
        (shape.batch, shape.hkv, shape.seq_len, shape.dv),
    ]
    dims += [tuple(spec.shape(shape, params)) for spec in mech.extras_for(params)]
    return sum(math.prod(d) for d in dims)
