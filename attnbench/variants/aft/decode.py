"""Decoding AFT (Zhai et al. 2021, "An Attention Free Transformer") with running sums.

Every AFT output is a per-feature weighted average over the keys a query sees, held as exactly
stabilised partial sums (m, num, den) (:mod:`attnbench.variants.aft.softmax_sums`), so what a new
query needs depends on where its bias is zero:

* ``aft-simple:running``: no bias at all: the whole prefix is one running partial sum per
  feature, merged with each new key (O(d) state, whatever n).
* ``aft-local:window``: the bias lives only within s of the query; keys further back count with
  bias 0, so they too are one running sum. The state is that sum (over keys <= n - s) and the
  last s - 1 keys and values (O(s d), whatever n); a new query reads its window densely.
* ``aft-full:cache``: the learned bias w[t, t'] couples every query to every key, so no sum can
  be shared between queries: a K/V cache, and each new query reads all of it with its own bias
  row (O(n d) per token, as softmax). Each (row, feature) is stabilised by its own maximum, so
  nothing underflows and no certificate is needed.

Half inputs are summed in float32 and the output cast back, as every AFT path does; the running
sums are float32 state, the window and the cache keep the input dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnbench.core.decode import DecodePath, DecodeState, KVCache, cache_traffic
from attnbench.core.precision import HALF
from attnbench.core.spec import Shape
from attnbench.variants.aft.softmax_sums import Partial, average, dense, merge

FLOAT32 = 4


def _work(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in HALF else dtype


def _empty(k: Tensor) -> Partial:
    """The partial sums of no key: (-inf, 0, 0), each ``[B, H, D]`` in the working dtype."""
    b, h, _, d = k.shape
    work = _work(k.dtype)
    zero = k.new_zeros(b, h, d, dtype=work)
    return torch.full_like(zero, float("-inf")), zero, zero


def _over(k: Tensor, v: Tensor, bias: Tensor | None = None) -> Partial:
    """The partial sums of the keys ``k``, ``v`` (``[B, H, L, D]``, L >= 1) with ``bias``
    (``[L]``, None: 0), each ``[B, H, D]``, each feature stabilised by its own maximum."""
    work = _work(k.dtype)
    logits = k.to(work) if bias is None else k.to(work) + bias.to(work)[:, None]
    return dense(logits, v.to(work), dim=2)


def _out(q: Tensor, part: Partial) -> Tensor:
    """sigmoid(q) * num / den for one new row: q ``[B, H, D]`` -> ``[B, H, 1, D]``."""
    return (torch.sigmoid(q.to(part[1].dtype)) * average(part))[:, :, None].to(q.dtype)


@dataclass
class RunningState(DecodeState):
    """aft-simple: (m, num, den) over every key so far, each ``[B, H, D]``."""

    part: Partial


def simple_prefill(q: Tensor, k: Tensor, v: Tensor) -> RunningState:
    return RunningState(k.shape[2], _over(k, v) if k.shape[2] else _empty(k))


def simple_step(state: RunningState, q: Tensor, k: Tensor, v: Tensor):
    """Each new key merged into the running sum, then the row read off it."""
    part, outs = state.part, []
    for a in range(q.shape[2]):
        part = merge(part, _over(k[:, :, a : a + 1], v[:, :, a : a + 1]))
        outs.append(_out(q[:, :, a], part))
    return torch.cat(outs, dim=2), RunningState(state.length + q.shape[2], part)


def running_traffic(shape: Shape, params: Mapping[str, Any], itemsize: int) -> tuple[int, int]:
    """Three float32 (or float64) numbers per (batch, head, feature), read and written."""
    size = 3 * shape.batch * shape.heads * shape.head_dim * max(itemsize, FLOAT32)
    return size, size


SIMPLE = DecodePath(
    "running",
    prefill=simple_prefill,
    step=simple_step,
    traffic=running_traffic,
    flops=lambda shape, params: (
        4 * shape.batch * shape.heads * shape.head_dim * (shape.query_len or 0)
    ),
    memory="O(d) running sums, whatever n",
    note="one exactly stabilised running softmax sum per feature, merged with each new key",
)


# --------------------------------------------------------------------------------------------
# aft-local: a window of s - 1 keys and a running sum of the keys before it
# --------------------------------------------------------------------------------------------


@dataclass
class WindowState(DecodeState):
    """aft-local: the sums over keys <= length - s, and the keys and values after them."""

    part: Partial
    k: Tensor  # (B, H, W, D), W = min(s - 1, length)
    v: Tensor


def local_prefill(q: Tensor, k: Tensor, v: Tensor, *, s: int) -> WindowState:
    n = k.shape[2]
    kept = min(s - 1, n)
    part = _over(k[:, :, : n - kept], v[:, :, : n - kept]) if n > kept else _empty(k)
    return WindowState(n, part, k[:, :, n - kept :], v[:, :, n - kept :])


def local_step(state: WindowState, q: Tensor, k: Tensor, v: Tensor, *, s: int, w: Tensor):
    """Each new row: its window (and the keys between the window and the running sum, bias 0)
    densely, merged with the running sum; then the keys that left the window are merged in."""
    n, tq = state.length, q.shape[2]
    kk, vv = torch.cat((state.k, k), dim=2), torch.cat((state.v, v), dim=2)
    first = n - state.k.shape[2]  # the position of kk[:, :, 0]
    pos = torch.arange(first, n + tq, device=q.device)
    outs = []
    for a in range(tq):
        t, upto = n + a, state.k.shape[2] + a + 1  # keys first .. t
        offset = pos[:upto] - t  # <= 0
        inside = offset > -s
        bias = torch.where(inside, w[t, (offset + s - 1).clamp(min=0)], 0.0)  # (upto,)
        part = merge(state.part, _over(kk[:, :, :upto], vv[:, :, :upto], bias))
        outs.append(_out(q[:, :, a], part))
    kept = min(s - 1, n + tq)
    leaving = kk.shape[2] - kept
    part = state.part
    if leaving:
        part = merge(part, _over(kk[:, :, :leaving], vv[:, :, :leaving]))
    new = WindowState(n + tq, part, kk[:, :, leaving:], vv[:, :, leaving:])
    return torch.cat(outs, dim=2), new


def window_traffic(shape: Shape, params: Mapping[str, Any], itemsize: int) -> tuple[int, int]:
    """The window (s - 1 keys and values) and the running sums, read and written anew."""
    s, n = params["s"], shape.seq_len
    window = min(s - 1, n) * shape.batch * shape.heads * (shape.head_dim + shape.dv) * itemsize
    read, written = running_traffic(shape, params, itemsize)
    return read + window, written + window


def local_flops(shape: Shape, params: Mapping[str, Any]) -> int:
    """4 per (new row, key it reads densely, feature), 4 per key merged into the running sum."""
    n, tq, s = shape.seq_len, shape.query_len or 0, params["s"]
    window = min(s - 1, n)
    dense_terms = sum(window + a + 1 for a in range(tq))
    merged = window + tq - min(s - 1, n + tq)
    return 4 * shape.batch * shape.heads * shape.head_dim * (dense_terms + merged)


LOCAL = DecodePath(
    "window",
    prefill=local_prefill,
    step=local_step,
    traffic=window_traffic,
    flops=local_flops,
    memory="O(s d): the last s - 1 keys and values, and a running sum",
    note="the window densely with its bias; keys that left it in one running sum (bias 0)",
)


# --------------------------------------------------------------------------------------------
# aft-full: a K/V cache read whole by each new row
# --------------------------------------------------------------------------------------------


def full_prefill(q: Tensor, k: Tensor, v: Tensor, *, capacity: int) -> KVCache:
    return KVCache.prefill(k, v, capacity)


def full_step(
    state: KVCache,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    factorized: bool,
    w: Tensor | None = None,
    w_u: Tensor | None = None,
    w_v: Tensor | None = None,
):
    """Each new row t: softmax over keys t' <= t of K[t'] + w[t, t'] per feature, times V."""
    state = state.append(k, v)
    n = state.length - q.shape[2]
    keys, values = state.keys(), state.values()
    outs = []
    for a in range(q.shape[2]):
        t = n + a
        bias = w_u[t] @ w_v[: t + 1].transpose(0, 1) if factorized else w[t, : t + 1]  # (t+1,)
        part = _over(keys[:, :, : t + 1], values[:, :, : t + 1], bias)
        outs.append(_out(q[:, :, a], part))
    return torch.cat(outs, dim=2), state


def full_flops(shape: Shape, params: Mapping[str, Any]) -> int:
    """4 per (new row, key, feature) (aft.common), plus 2 rank per bias entry when factorised."""
    n, tq = shape.seq_len, shape.query_len or 0
    pairs = sum(n + a + 1 for a in range(tq))
    feats = shape.batch * shape.heads * shape.head_dim
    return 4 * feats * pairs + (2 * pairs * params["rank"] if params["factorized"] else 0)


FULL = DecodePath(
    "cache",
    prefill=full_prefill,
    step=full_step,
    traffic=cache_traffic,
    flops=full_flops,
    memory="K/V cache O(n d)",
    note="the bias w[t, t'] ties each row to every key: the whole cache, per-row maxima",
)
