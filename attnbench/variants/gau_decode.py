"""Decoding GAU and mixed chunk attention (Hua et al. 2022, "Transformer Quality in Linear
Time"; Su 2022).

* ``gau:cache``: GAU's causal row i is normalised by the keys it sees (n_i = i + 1, not the
  sequence's final length), so it decodes exactly against a K/V cache: every new row reads the
  whole cache (relu² scores times 1/(n_i s) or 1/n_i², or the softmax scorings), O(n d) a token.
* ``flash:chunk-state`` and ``mc-softmax:chunk-state``: a row's local part sees only the keys of
  its own chunk so far, and its global part the sum over the earlier, complete chunks of
  k_lin^T v, divided by their g c tokens. The state is that sum (``[s, e]`` per head) and the
  keys, values and k_lin of the current chunk, at most c of them. What a token costs depends on
  where in its chunk it falls: the a-th token of a chunk reads a + 1 cached keys (relu² or
  softmax over them) and the s x e sum; the chunk's last token also folds the chunk into the sum
  (c s e multiply-adds, once per c tokens). So the cost per token is O(c (s + e) + s e), flat in
  n, and within a chunk it grows linearly from one key to c.

Half inputs are computed in float32 (as the references are), the sums kept in float32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnbench.core.decode import DecodePath, DecodeState, KVCache, cache_traffic, new_rows_mask
from attnbench.core.precision import HALF, to_dtype
from attnbench.core.spec import Shape
from attnbench.variants.softmax_decode import grouped_scores_softmax, keys_seen_from

LOG_BASE = 512.0  # gau.LOG_BASE: softmax_plus' log base


def _work(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in HALF else dtype


def gau_prefill(q: Tensor, k: Tensor, v: Tensor, *, capacity: int) -> KVCache:
    return KVCache.prefill(k, v, capacity)


def gau_step(
    state: KVCache, q: Tensor, k: Tensor, v: Tensor, *, scoring: str, norm: str, min_n: int
) -> tuple[Tensor, KVCache]:
    """The new rows against the whole cache: relu²(q k) / (n_i s) (or / n_i²), or softmax."""
    state = state.append(k, v)
    tq, d = q.shape[2], q.shape[-1]
    start, work = state.length - tq, _work(q.dtype)
    n = keys_seen_from(start, tq, q.device)  # (Tq, 1) float64
    if scoring == "softmax":
        scale: float | Tensor = 1.0 / math.sqrt(d)
    elif scoring == "softmax_plus":
        scale = (n.clamp(min=min_n).log() / math.log(LOG_BASE) / math.sqrt(d)).to(work)
    else:
        weight = (1.0 / (n * d) if norm == "ns" else 1.0 / n**2).to(work)  # (Tq, 1)
        r = torch.relu(q.to(work) @ state.keys().to(work).transpose(-2, -1))  # (B, H, Tq, L)
        if tq > 1:
            r = r.masked_fill(~new_rows_mask(start, tq, state.length, q.device), 0.0)
        o = (r.square() * weight) @ state.values().to(work)  # (B, H, Tq, e)
        return to_dtype(o, q.dtype, "gau:cache (decode)"), state
    o = grouped_scores_softmax(q, state.keys(), state.values(), start, scale, work)
    return o, state


GAU_CACHE = DecodePath(
    "cache",
    prefill=gau_prefill,
    step=gau_step,
    traffic=cache_traffic,
    memory="K/V cache O(n (s + e))",
    note="every new row reads the whole cache; row i normalised by its own n_i = i + 1",
)


# --------------------------------------------------------------------------------------------
# FLASH and MC-TFM: the sum over complete chunks, and the current chunk's keys
# --------------------------------------------------------------------------------------------


@dataclass
class ChunkState(DecodeState):
    """The sum of k_lin^T v over the complete chunks ``[B, H, s, e]`` and the current chunk's
    k, v and k_lin (a cache of capacity c)."""

    total: Tensor
    chunk: KVCache


def _empty_chunk(k: Tensor, v: Tensor, k_lin: Tensor, c: int) -> KVCache:
    none = slice(0, 0)
    return KVCache.prefill(k[:, :, none], v[:, :, none], c, k_lin[:, :, none])


def chunk_prefill(
    q: Tensor, k: Tensor, v: Tensor, *, chunk: int, q_lin: Tensor, k_lin: Tensor
) -> ChunkState:
    """The sum over the n // c complete chunks, and the rest of the n tokens as the chunk."""
    n, work = k.shape[2], _work(v.dtype)
    done = (n // chunk) * chunk
    total = k_lin[:, :, :done].to(work).transpose(-2, -1) @ v[:, :, :done].to(work)  # (B,H,s,e)
    rest = slice(done, n)
    current = KVCache.prefill(k[:, :, rest], v[:, :, rest], chunk, k_lin[:, :, rest])
    return ChunkState(n, total, current)


def _local(q: Tensor, chunk: KVCache, relu2: bool, norm: str, work: torch.dtype) -> Tensor:
    """One new row (``[B, H, 1, s]``) against the m keys of its chunk so far (itself the last):
    relu²(q k) / (m s) (or / m²) times v, or softmax(q k / sqrt(s)) v."""
    keys, values = chunk.keys().to(work), chunk.values().to(work)
    m, s = keys.shape[2], q.shape[-1]
    scores = q.to(work) @ keys.transpose(-2, -1)  # (B, H, 1, m)
    if relu2:
        weight = 1.0 / (m * s) if norm == "ns" else 1.0 / m**2
        return (torch.relu(scores).square() * weight) @ values
    return torch.softmax(scores / math.sqrt(s), dim=-1) @ values


def chunk_step(relu2: bool):
    def step(
        state: ChunkState,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        chunk: int,
        q_lin: Tensor,
        k_lin: Tensor,
        norm: str = "ns",
    ) -> tuple[Tensor, ChunkState]:
        work = _work(q.dtype)
        total, current, outs = state.total, state.chunk, []
        for a in range(q.shape[2]):
            at = slice(a, a + 1)
            current = current.append(k[:, :, at], v[:, :, at], k_lin[:, :, at])
            o = _local(q[:, :, at], current, relu2, norm, work)  # (B, H, 1, e)
            earlier = (state.length + a) // chunk  # complete chunks before this token's
            if earlier:
                o = o + (q_lin[:, :, at].to(work) @ total) / (earlier * chunk)
            outs.append(o)
            if current.length == chunk:  # the chunk is complete: into the sum
                k_l, v_c = current.extra[0][:, :, :chunk].to(work), current.values().to(work)
                total = total + k_l.transpose(-2, -1) @ v_c
                current = _empty_chunk(k, v, k_lin, chunk)
        out = torch.cat(outs, dim=2)
        new = ChunkState(state.length + q.shape[2], total, current)
        return to_dtype(out, q.dtype, "flash:chunk-state (decode)"), new

    return step


def chunk_traffic(shape: Shape, params: Mapping[str, Any], itemsize: int) -> tuple[int, int]:
    """Read: the s x e sum, and the keys and values of the chunk positions the new tokens see
    (from the current chunk's start on), with k_lin too for a chunk that completes. Written:
    the new tokens' k, v, k_lin, and the sum when a chunk completes."""
    c, bh, s, e = params["chunk"], shape.batch * shape.heads, shape.head_dim, shape.dv
    n, tq = shape.seq_len, shape.query_len or 0
    total = bh * s * e * max(itemsize, 4)
    seen = n + tq - (n // c) * c  # positions from the current chunk's start to the last new
    completed = (n + tq) // c - n // c
    read = total + seen * bh * (s + e) * itemsize + completed * c * bh * s * itemsize
    written = tq * bh * (2 * s + e) * itemsize + (total if completed else 0)
    return read, written


def chunk_flops(shape: Shape, params: Mapping[str, Any]) -> int:
    """Per new token: q k and a v over the chunk's keys so far, q_lin times the sum; a chunk's
    last token also k_lin^T v over the chunk (2 per multiply-add)."""
    c, bh, s, e = params["chunk"], shape.batch * shape.heads, shape.head_dim, shape.dv
    flops = 0
    for i in range(shape.query_len or 0):
        inside = (shape.seq_len + i) % c + 1
        flops += 2 * inside * (s + e) + (2 * s * e if shape.seq_len + i >= c else 0)
        flops += 2 * c * s * e if inside == c else 0
    return bh * flops


def chunk_form(relu2: bool) -> DecodePath:
    local = "relu²" if relu2 else "softmax"
    return DecodePath(
        "chunk-state",
        prefill=chunk_prefill,
        step=chunk_step(relu2),
        traffic=chunk_traffic,
        flops=chunk_flops,
        memory="O(c (s + e) + s e): the current chunk's keys and the sum over earlier chunks",
        note=f"{local} over the current chunk's keys so far + q_lin times the sum of the "
        "complete chunks' k_lin^T v; a token's cost grows with its place in its chunk",
    )


FLASH_CHUNK = chunk_form(relu2=True)
MC_CHUNK = chunk_form(relu2=False)
