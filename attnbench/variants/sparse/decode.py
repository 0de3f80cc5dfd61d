"""Decoding the sparse patterns: a new query reads only the keys its pattern keeps.

A causal pattern whose row i does not depend on the sequence's final length decodes exactly:
the new query at position i gathers the keys of its row from the K/V cache (``gather``), O(keys
per query) bytes instead of softmax's O(n). Each pattern lists its row in closed form
(``keys(positions, params)`` -> ``[Tq, M]`` key positions, -1 where a row has fewer than M), the
same rule as its ``visible``:

* local: i - window .. i (Su 2019; Beltagy et al. 2020)
* atrous: i, i - r, i - 2r, ... (Su 2019)
* sparse: i - window .. i, then every r-th key beyond (Su 2019; Child et al. 2019)
* strided: i - s + 1 .. i, then every s-th key beyond (Child et al. 2019)
* fixed: the own block up to i, and the last c positions of every earlier block (Child et al.)
* longnet: for every branch (w, r) that keeps i, the kept keys of i's segment up to i (Ding et
  al. 2023); a key kept by m branches is listed m times, which is exactly the mechanism's weight
  m (its reference repeats the keys once per branch)

BigBird has no decode form: its global key blocks are the first and last blocks of the whole
sequence and its random blocks are drawn per sequence length, so row i changes as the sequence
grows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from attnbench.core.decode import DecodePath, KVCache, positions
from attnbench.core.spec import Shape

#: keys(positions [Tq], params) -> key positions [Tq, M], -1 for none.
Keys = Callable[[Tensor, Mapping[str, Any]], Tensor]

NO_DECODE_BIGBIRD = (
    "bigbird has no causal decode form: its global key blocks are the last blocks of the whole "
    "sequence and its random blocks are drawn per sequence length, so a row's keys change as "
    "the sequence grows"
)


def _columns(count: int, device: torch.device) -> Tensor:
    return torch.arange(max(count, 0), device=device)


def local_keys(pos: Tensor, params: Mapping[str, Any]) -> Tensor:
    """i - window .. i."""
    idx = pos[:, None] - _columns(params["window"] + 1, pos.device)[None, :]
    return torch.where(idx >= 0, idx, -1)


def residue_keys(pos: Tensor, r: int, beyond: int) -> Tensor:
    """i - m r for m > beyond // r ... (the keys of i's residue class mod r further back than
    ``beyond``) down to 0; -1 pads the rows with fewer."""
    first = beyond // r + 1  # the smallest m with m r > beyond
    most = int(pos.max()) // r + 1 - first if pos.numel() else 0
    idx = pos[:, None] - r * (first + _columns(most, pos.device))[None, :]
    return torch.where(idx >= 0, idx, -1)


def atrous_keys(pos: Tensor, params: Mapping[str, Any]) -> Tensor:
    """i, i - r, i - 2r, ... >= 0."""
    return residue_keys(pos, params["r"], -1)


def band_and_residue(pos: Tensor, reach: int, r: int) -> Tensor:
    band = pos[:, None] - _columns(reach + 1, pos.device)[None, :]
    band = torch.where(band >= 0, band, -1)
    return torch.cat((band, residue_keys(pos, r, reach)), dim=1)


def sparse_keys(pos: Tensor, params: Mapping[str, Any]) -> Tensor:
    """|i - j| <= window, or i - j a multiple of r (j <= i)."""
    return band_and_residue(pos, params["window"], params["r"])


def strided_keys(pos: Tensor, params: Mapping[str, Any]) -> Tensor:
    """i - j < s, or i - j a multiple of s (j <= i)."""
    return band_and_residue(pos, params["s"] - 1, params["s"])


def fixed_keys(pos: Tensor, params: Mapping[str, Any]) -> Tensor:
    """The own block of s up to i, and the last c positions of every earlier block."""
    s, c = params["s"], params["c"]
    start = (pos // s) * s
    own = start[:, None] + _columns(s, pos.device)[None, :]
    own = torch.where(own <= pos[:, None], own, -1)
    blocks = int(pos.max()) // s if pos.numel() else 0
    summary = (_columns(blocks, pos.device)[:, None] * s + (s - c)) + _columns(c, pos.device)
    summary = summary.reshape(1, -1).expand(len(pos), -1)  # (Tq, blocks c)
    return torch.cat((own, torch.where(summary < start[:, None], summary, -1)), dim=1)


def prefill(q: Tensor, k: Tensor, v: Tensor, *, capacity: int) -> KVCache:
    return KVCache.prefill(k, v, capacity)


def compact(idx: Tensor) -> Tensor:
    """Each row's keys first, its -1 padding after, cut to the longest row: a pattern's closed
    form pads rows to the most keys any position could have (a LongNet branch lists its whole
    segment), and a gather must read the keys the rows have, not that bound."""
    valid = idx >= 0
    width = int(valid.sum(-1).max()) if idx.numel() else 0
    if width == idx.shape[-1]:
        return idx
    order = torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)[:, :width]
    return idx.gather(-1, order)


def gather_step(keys: Keys) -> Callable[..., Any]:
    """A step that gathers each new row's keys and values from the cache and attends to them
    (rows with no key give zeros, as the reference does)."""

    def step(state: KVCache, q: Tensor, k: Tensor, v: Tensor, **params: Any):
        state = state.append(k, v)
        tq = q.shape[2]
        idx = compact(keys(positions(state.length - tq, tq, q.device), params))  # (Tq, M)
        valid = idx >= 0
        at = idx.clamp(min=0).reshape(-1)  # index_select: 5-7x faster than x[:, :, idx] here
        b, h, m = q.shape[0], state.k.shape[1], idx.shape[1]
        kg = state.k.index_select(2, at).view(b, h, tq, m, -1)  # only the kept keys are read
        vg = state.v.index_select(2, at).view(b, h, tq, m, -1)  # (B, H, Tq, M, Dv)
        scores = (kg @ q[..., :, None]).squeeze(-1) / math.sqrt(q.shape[-1])  # (B, H, Tq, M)
        scores = scores.masked_fill(~valid, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = torch.where(valid.any(-1, keepdim=True), probs, torch.zeros((), dtype=q.dtype))
        return (probs[..., None, :] @ vg).squeeze(-2), state  # (B, H, Tq, Dv)

    return step


def kept(keys: Keys, shape: Shape, params: Mapping[str, Any]) -> tuple[int, int]:
    """(the (row, key) pairs the new rows attend, the distinct keys among them): a key two rows
    read is two pairs' work and one read of the cache."""
    tq = shape.query_len or 0
    idx = keys(positions(shape.seq_len, tq, "cpu"), params)
    valid = idx[idx >= 0]
    return int(valid.numel()), int(torch.unique(valid).numel())


def gather_form(keys: Keys) -> DecodePath:
    """The ``gather`` decode form of a pattern whose rows ``keys`` lists."""

    def traffic(shape: Shape, params: Mapping[str, Any], itemsize: int) -> tuple[int, int]:
        per_key = shape.batch * shape.hkv * (shape.head_dim + shape.dv) * itemsize
        return kept(keys, shape, params)[1] * per_key, (shape.query_len or 0) * per_key

    def flops(shape: Shape, params: Mapping[str, Any]) -> int:
        pairs = kept(keys, shape, params)[0]
        return 2 * shape.batch * shape.heads * pairs * (shape.head_dim + shape.dv)

    return DecodePath(
        "gather",
        prefill=prefill,
        step=gather_step(keys),
        traffic=traffic,
        flops=flops,
        memory="K/V cache O(n d); reads the kept keys only",
        note="each new row gathers the keys its pattern keeps from the cache",
    )
