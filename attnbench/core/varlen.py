"""Packed batches: sequences of different lengths end to end, attention kept inside each.

Training stacks concatenate a batch's sequences instead of padding them to the longest: q, k, v
``[1, H, T, D]`` with T the sum of the lengths and ``offsets`` = [0, L1, L1 + L2, ..., T]
(flash-attention's ``cu_seqlens``). A path runs a packed batch through its own entry
(``PathSpec.varlen``: a block-diagonal mask, a kernel's variable-length form) or, without one,
as a loop over the sequences: correct, slow, and labelled so in the results (``packing =
packed-loop``). An extra input is cut at the sequences' boundaries along every dimension its
declared shape takes from the sequence length (a per-token activation along the sequence, a
position bias along its rows and columns), so each sequence sees the block of the packed
batch's tensor that belongs to it.

A packed batch is given by its lengths, or drawn: ``tokens=T,count=N,seed=S`` cuts T tokens at
N - 1 places drawn with seed S (:func:`draw_lengths`), so the lengths add up to exactly T and
the same text gives the same batch on every machine.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Mechanism, PathSpec, Shape, declared_keywords

DRAWN = re.compile(r"^\s*tokens\s*=\s*(\d+)\s*,\s*count\s*=\s*(\d+)\s*,\s*seed\s*=\s*(\d+)\s*$")
ACCEPTED = 'a list of lengths >= 1, "L1,L2,...", or "tokens=T,count=N,seed=S" (1 <= N <= T)'


def draw_lengths(tokens: int, count: int, seed: int) -> tuple[int, ...]:
    """``count`` lengths >= 1 adding up to exactly ``tokens``: the token range cut at
    ``count - 1`` distinct places drawn uniformly with ``random.Random(seed)``."""
    if not 1 <= count <= tokens:
        raise ValueError(f"count={count} for tokens={tokens}; accepted: 1 <= count <= tokens")
    cuts = sorted(random.Random(seed).sample(range(1, tokens), count - 1))
    edges = [0, *cuts, tokens]
    return tuple(b - a for a, b in zip(edges, edges[1:], strict=False))


def parse_varlen(value: Any) -> tuple[int, ...] | None:
    """A suite's ``varlen`` as lengths (None when it is empty); ValueError for anything else."""
    if value in ("", None) or value == () or value == []:
        return None
    if isinstance(value, str):
        drawn = DRAWN.match(value)
        if drawn:
            return draw_lengths(*(int(g) for g in drawn.groups()))
        items = [t.strip() for t in value.strip().strip("[]").split(",") if t.strip()]
        value = [int(t) for t in items]  # ValueError for a non-integer
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(value)
    if any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in value):
        raise ValueError(value)
    return tuple(value)


def valid_varlen(value: Any) -> bool:
    """Whether a suite's ``varlen`` value is accepted (see :data:`ACCEPTED`)."""
    try:
        parse_varlen(value)
    except (ValueError, TypeError):
        return False
    return True


def lengths_text(lengths: tuple[int, ...]) -> str:
    """``700+300+24``: the results' ``varlen`` column (the lengths, in order)."""
    return "+".join(map(str, lengths))


def offsets(lengths: tuple[int, ...], device: torch.device | str = "cpu") -> Tensor:
    """[0, L1, L1 + L2, ..., T] as int64 (flash-attention's ``cu_seqlens``, in int64)."""
    edges = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    return edges.to(device)


def padded_shape(shape: Shape) -> Shape:
    """The padded batch of the same sequences: one row per sequence, each the longest one."""
    lengths = shape.varlen or (shape.seq_len,)
    return replace(shape, batch=len(lengths), seq_len=max(lengths))


def packed_shape(shape: Shape) -> Shape:
    """The packed batch: one row of all the tokens."""
    lengths = shape.varlen or (shape.seq_len,)
    return replace(shape, batch=1, seq_len=sum(lengths))


def varlen_flops(mech: Mechanism, shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
    """The useful FLOPs of a packed batch: each sequence's own, no pair across sequences (and
    none of a padded batch's padding)."""
    lengths = shape.varlen or (shape.seq_len,)
    one = replace(shape, batch=1, varlen=None)
    return sum(mech.forward_flops(replace(one, seq_len=n), causal, params) for n in lengths)


def length_dims(mech: Mechanism, shape: Shape, params: Mapping[str, Any]) -> dict[str, list[int]]:
    """For each extra input, the dimensions whose size is the sequence length (read off its
    declared shape at two lengths): where a packed batch's tensor is cut per sequence."""
    out = {}
    for e in mech.extras_for(params):
        at = e.shape(shape, params)
        longer = e.shape(replace(shape, seq_len=shape.seq_len + 1), params)
        out[e.name] = [i for i, (a, b) in enumerate(zip(at, longer, strict=True)) if a != b]
    return out


def _cut(t: Tensor, dims: list[int], start: int, end: int) -> Tensor:
    index = [slice(None)] * t.dim()
    for d in dims:
        index[d] = slice(start, end)
    return t[tuple(index)]


def run_packed(
    mech: Mechanism,
    path: PathSpec,
    inputs: Mapping[str, Tensor],
    lengths: tuple[int, ...],
    *,
    causal: bool,
    params: Mapping[str, Any],
) -> Tensor:
    """The packed batch ``inputs`` (q, k, v ``[1, H, T, D]`` and the extra inputs) through
    ``path``: its own ``varlen`` entry, or a loop over the sequences."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    total = q.shape[2]
    if sum(lengths) != total or q.shape[0] != 1:
        raise AttnbenchError(
            f"a packed batch is one row of the sequences' tokens: lengths add up to "
            f"{sum(lengths)}, q has {q.shape[0]} rows of {total}"
        )
    extras = {name: t for name, t in inputs.items() if name not in ("q", "k", "v")}
    if path.varlen is not None:
        kwargs = {"causal": causal, "offsets": offsets(lengths, q.device), **params, **extras}
        return path.varlen(q, k, v, **path_keywords(path.varlen, kwargs))
    shape = Shape(1, q.shape[1], total, q.shape[3], kv_heads=k.shape[1], value_dim=v.shape[3])
    dims = length_dims(mech, shape, params)
    outs, start = [], 0
    for n in lengths:
        end = start + n
        piece = {name: _cut(t, dims.get(name, []), start, end) for name, t in extras.items()}
        outs.append(path(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end],
                         causal=causal, **params, **piece))  # fmt: skip
        start = end
    return torch.cat(outs, dim=2)


def path_keywords(fn: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords among ``kwargs`` that ``fn`` declares (all of them for ``**kwargs``)."""
    accepted = declared_keywords(fn)
    return dict(kwargs) if accepted is None else {k: v for k, v in kwargs.items() if k in accepted}


def packing_of(path: PathSpec) -> str:
    """How ``path`` runs a packed batch: ``packed`` (its own entry) or ``packed-loop``."""
    return "packed" if path.varlen is not None else "packed-loop"


def block_diagonal(lengths_or_offsets: Tensor, causal: bool) -> Tensor:
    """Boolean ``[T, T]``: True where query i and key j are in one sequence (and j <= i when
    causal). ``offsets`` as :func:`offsets` gives them."""
    edges = lengths_or_offsets
    total = int(edges[-1])
    pos = torch.arange(total, device=edges.device)
    doc = torch.searchsorted(edges[1:], pos, right=True)  # the sequence of each position
    mask = doc[:, None] == doc[None, :]
    return mask & (pos[None, :] <= pos[:, None]) if causal else mask
