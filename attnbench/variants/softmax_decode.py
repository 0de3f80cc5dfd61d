"""Decoding softmax attention against a KV cache: softmax, softmax-logn, SSMax, MQA, GQA and
flash-tiled (:mod:`attnbench.core.decode` gives the contract).

Every new query reads the whole cache: O(n d) bytes per token, the memory-bound work that
FlashInfer, vLLM and flash-attention's ``flash_attn_with_kvcache`` time. The forms:

* ``plain``: the scores of the new queries against the cache, softmax, times V, in plain torch.
  With K/V shared by G query heads (MQA, GQA) the G heads' queries are one matrix against their
  K/V head (``[B, Hkv, G Tq, D]``), so the cache is read once per K/V head, never copied per
  query head.
* ``sdpa``: torch's ``scaled_dot_product_attention`` on the cache (``enable_gqa`` when K/V are
  shared); on a GPU its flash or memory-efficient kernel, whichever torch picks.
* ``tiled`` (flash-tiled): the cache in tiles of ``tile`` keys with an online softmax, the
  split-KV shape of Flash-Decoding (Dao, Haziza, Massa and Sizov 2023, "Flash-Decoding for
  long-context inference", https://crfm.stanford.edu/2023/10/12/flashdecoding.html), one tile
  after another in plain torch.
* ``triton-split`` (CUDA): Flash-Decoding itself, as Triton kernels
  (:func:`attnbench.kernels.decode_ops.split_softmax`): the cache cut into splits that run in
  parallel (enough programs to fill the GPU at batch 1), each an online softmax over its key
  tiles with the G query heads of a K/V head as one block of rows, then one combine. Per-row
  factors (softmax-logn, SSMax) are folded into q, as for ``sdpa``.

Several new queries at once (Tq > 1) see the keys up to their own position: the causal mask
aligned to the bottom right of the square. The per-row score factors of softmax-logn
(log_b(n_i) / sqrt(d)) and SSMax ((s_h log n_i + b_h) / sqrt(d)) use each new query's absolute
position, n_i = i + 1, so the rows equal those of the full causal forward. SSMax's paths run half
inputs in float32 (its module says why); its decode forms do too (the cache is kept in the
input dtype and read in float32).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.core.decode import DecodePath, KVCache, cache_traffic, new_rows_mask, positions
from attnbench.core.precision import HALF
from attnbench.kernels import decode_ops
from attnbench.kernels.triton_ops import REQUIRES

#: scale(q, start, **params and extra inputs) -> the score factor of the new rows: a number, or
#: a tensor broadcasting against [B, H, Tq, 1].
RowScale = Callable[..., float | Tensor]


def prefill(q: Tensor, k: Tensor, v: Tensor, *, capacity: int) -> KVCache:
    """The KV cache of the first n tokens, with room for ``capacity`` (q is not kept)."""
    return KVCache.prefill(k, v, capacity)


def inverse_sqrt_d(q: Tensor, start: int, **kwargs: Any) -> float:
    """softmax's factor: 1 / sqrt(d) for every row."""
    return 1.0 / math.sqrt(q.shape[-1])


def grouped_scores_softmax(
    q: Tensor, keys: Tensor, values: Tensor, start: int, scale: float | Tensor, work: torch.dtype
) -> Tensor:
    """softmax(scale * q k^T) v for the new rows at ``start`` .. (bottom-right causal), each K/V
    head serving its G = H / Hkv query heads as one matrix. q ``[B, H, Tq, D]``, keys ``[B, Hkv,
    L, D]``, values ``[B, Hkv, L, Dv]`` -> ``[B, H, Tq, Dv]`` in q's dtype."""
    b, h, tq, d = q.shape
    hkv, length = keys.shape[1], keys.shape[2]
    g = h // hkv
    qs = (q.to(work) * scale).reshape(b, hkv, g * tq, d)  # rows: (head in group, query)
    s = qs @ keys.to(work).transpose(-2, -1)  # (B, Hkv, G Tq, L)
    if tq > 1:
        mask = new_rows_mask(start, tq, length, q.device).repeat(g, 1)  # (G Tq, L)
        s = s.masked_fill(~mask, float("-inf"))
    o = torch.softmax(s, dim=-1) @ values.to(work)  # (B, Hkv, G Tq, Dv)
    return o.reshape(b, h, tq, -1).to(q.dtype)


def _work(dtype: torch.dtype, in_float32: bool) -> torch.dtype:
    return torch.float32 if in_float32 and dtype in HALF else dtype


def plain_step(scale: RowScale, in_float32: bool = False) -> Callable[..., Any]:
    def step(state: KVCache, q: Tensor, k: Tensor, v: Tensor, **kwargs: Any):
        state = state.append(k, v)
        start = state.length - q.shape[2]
        factor = scale(q, start, **kwargs)
        work = _work(q.dtype, in_float32)
        o = grouped_scores_softmax(q, state.keys(), state.values(), start, factor, work)
        return o, state

    return step


def sdpa_step(scale: RowScale, in_float32: bool = False) -> Callable[..., Any]:
    def step(state: KVCache, q: Tensor, k: Tensor, v: Tensor, **kwargs: Any):
        state = state.append(k, v)
        start, tq = state.length - q.shape[2], q.shape[2]
        work = _work(q.dtype, in_float32)
        factor = scale(q, start, **kwargs)
        keys, values = state.keys().to(work), state.values().to(work)
        mask = new_rows_mask(start, tq, state.length, q.device) if tq > 1 else None
        gqa = {"enable_gqa": True} if keys.shape[1] != q.shape[1] else {}
        if isinstance(factor, Tensor):  # per-row factors: folded into q, scale 1
            qs, sdpa_scale = q.to(work) * factor, 1.0
        else:
            qs, sdpa_scale = q.to(work), factor
        o = F.scaled_dot_product_attention(
            qs, keys, values, attn_mask=mask, scale=sdpa_scale, **gqa
        )  # (B, H, Tq, Dv)
        return o.to(q.dtype), state

    return step


def triton_split_step(scale: RowScale, in_float32: bool = False) -> Callable[..., Any]:
    def step(state: KVCache, q: Tensor, k: Tensor, v: Tensor, **kwargs: Any):
        state = state.append(k, v)
        start = state.length - q.shape[2]
        work = _work(q.dtype, in_float32)
        factor = scale(q, start, **kwargs)
        keys, values = state.keys(), state.values()
        if work != q.dtype:  # SSMax in float32: the cache read as float32 (copied, as sdpa)
            keys, values = keys.to(work), values.to(work)
        if isinstance(factor, Tensor):  # per-row factors: folded into q, scale 1
            qs, kernel_scale = q.to(work) * factor, 1.0
        else:
            qs, kernel_scale = q.to(work), factor
        o = decode_ops.split_softmax(qs, keys, values, start=start, scale=kernel_scale)
        return o.to(q.dtype), state

    return step


def tiled_step(state: KVCache, q: Tensor, k: Tensor, v: Tensor, *, tile: int):
    """The cache in tiles of ``tile`` keys, an online softmax (running max m, sum l) across
    them: flash-decoding's split of the cache, one tile after another."""
    state = state.append(k, v)
    b, h, tq, d = q.shape
    start, length = state.length - tq, state.length
    keys, values = state.keys(), state.values()
    hkv = keys.shape[1]
    g = h // hkv
    qs = (q / math.sqrt(d)).reshape(b, hkv, g * tq, d)
    rows = positions(start, tq, q.device).repeat(g)[:, None]  # (G Tq, 1) each row's position
    m = q.new_full((b, hkv, g * tq, 1), float("-inf"))
    l = q.new_zeros(b, hkv, g * tq, 1)  # noqa: E741
    acc = q.new_zeros(b, hkv, g * tq, values.shape[-1])
    for k0 in range(0, length, tile):
        s = qs @ keys[:, :, k0 : k0 + tile].transpose(-2, -1)  # (B, Hkv, G Tq, tile)
        cols = torch.arange(k0, min(k0 + tile, length), device=q.device)[None, :]
        s = s.masked_fill(cols > rows, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        rescale = torch.exp(m - m_new)
        l = l * rescale + p.sum(-1, keepdim=True)  # noqa: E741
        acc = acc * rescale + p @ values[:, :, k0 : k0 + tile]
        m = m_new
    return (acc / l).reshape(b, h, tq, -1), state


def cache_forms(
    scale: RowScale = inverse_sqrt_d, *, in_float32: bool = False, shared_kv: bool = False
) -> tuple[DecodePath, ...]:
    """The ``sdpa``, ``plain`` and ``triton-split`` decode forms of a softmax mechanism whose
    scores are scaled by ``scale`` (SDPA first: a decoding suite's reference when it names none);
    ``in_float32``: half inputs are computed in float32, as its paths do."""
    reads = "the K/V head of each group once" if shared_kv else "every head's K and V"
    return (
        DecodePath(
            "sdpa",
            prefill=prefill,
            step=sdpa_step(scale, in_float32),
            traffic=cache_traffic,
            memory="K/V cache O(n d)",
            note="torch SDPA on the cache" + (" (enable_gqa)" if shared_kv else ""),
        ),
        DecodePath(
            "plain",
            prefill=prefill,
            step=plain_step(scale, in_float32),
            traffic=cache_traffic,
            memory="K/V cache O(n d)",
            note=f"scores against the cache, softmax, times V; reads {reads}",
        ),
        DecodePath(
            "triton-split",
            prefill=prefill,
            step=triton_split_step(scale, in_float32),
            traffic=cache_traffic,
            memory="K/V cache O(n d)",
            requires=REQUIRES,
            note=f"Triton Flash-Decoding: the cache in parallel splits, one combine; {reads}",
        ),
    )


TILED = DecodePath(
    "tiled",
    prefill=prefill,
    step=tiled_step,
    traffic=cache_traffic,
    memory="K/V cache O(n d)",
    note="online softmax over cache tiles of `tile` keys (flash-decoding's split, in torch)",
)


# --------------------------------------------------------------------------------------------
# The per-row factors of softmax-logn and SSMax, at the new rows' absolute positions
# --------------------------------------------------------------------------------------------


def keys_seen_from(start: int, count: int, device: torch.device | str) -> Tensor:
    """n_i = i + 1, the keys row i sees (causal), for the new rows, float64 ``[Tq, 1]``."""
    return (positions(start, count, device) + 1).to(torch.float64)[:, None]


def logn_scale(q: Tensor, start: int, *, base: float, clip: bool, min_n: int, **_: Any) -> Tensor:
    """softmax-logn's log_b(max(n_i, min_n)) / sqrt(d) (at least 1 / sqrt(d) with ``clip``)."""
    n = keys_seen_from(start, q.shape[2], q.device).clamp(min=min_n)
    factor = torch.log(n) / math.log(base)
    if clip:
        factor = factor.clamp(min=1.0)
    return (factor / math.sqrt(q.shape[-1])).to(q.dtype)  # (Tq, 1)


def ssmax_scale(
    q: Tensor, start: int, *, bias: bool, s: Tensor, b: Tensor | None = None, **_: Any
) -> Tensor:
    """SSMax's (s_h log n_i + b_h) / sqrt(d) as ``[H, Tq, 1]``, in float32 for half inputs."""
    work = _work(q.dtype, True)
    log_n = torch.log(keys_seen_from(start, q.shape[2], q.device))  # (Tq, 1)
    factor = s.to(work)[:, None, None] * log_n.to(work)  # (H, Tq, 1)
    if bias and b is not None:
        factor = factor + b.to(work)[:, None, None]
    return factor / math.sqrt(q.shape[-1])
