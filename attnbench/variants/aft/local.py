"""AFT-local: the learned bias kept only near the diagonal (Zhai et al. 2021).

    w_local[t, t'] = w[t, t'] if |t - t'| < s else 0

Keys outside the window still count with bias 0 (e^0 = 1), so every query keeps global
connectivity whatever s is; s >= T is AFT-full, and the paper's s = 0 is AFT-simple.

The bias is stored as the band it uses, ``w`` of shape ``[T, 2s - 1]``: ``w[t, j]`` is the bias
of the pair (t, t' = t + j - (s - 1)) (entries whose t' falls outside 0..T-1 are never read).
That is the parameter saving the paper claims for AFT-local, O(T s) instead of T^2. Causal rows
use only the columns j <= s - 1 (t' <= t).

Efficient path: the window densely (``[B, H, T, D, 2s - 1]`` logits, each row stabilised by its
own maximum), plus the keys outside it, t' <= t - s and t' >= t + s, from prefix and suffix sums
(:mod:`attnbench.variants.aft.softmax_sums`, exact per-row stabilisation): O(T s d) time and
memory, never T x T. Every partial sum is stabilised by an actual maximum of its own logits (the
window's per-row maximum, the scans' running maxima), so each denominator is >= 1 and no input
can make it 0/0. Half inputs are summed in float32 and the output cast back: with K and w of
standard deviation 20, logits w + K rounded to float16 put the output 0.9 % of its scale off the
float64 oracle, float32 sums 0.04 % (bfloat16: 7.6 % and 0.3 %).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.core import sources
from attnbench.core.precision import float32_sums
from attnbench.core.spec import ExtraInput, Mechanism, PathSpec, Shape, positive_int
from attnbench.variants.aft.common import check_elementwise
from attnbench.variants.aft.decode import LOCAL
from attnbench.variants.aft.dense import aft_dense, band_to_dense
from attnbench.variants.aft.layer import aft_layer
from attnbench.variants.aft.softmax_sums import (
    average,
    dense,
    leaves,
    merge,
    prefix_scan,
    shift,
    suffix_scan,
)


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, s: int, w: Tensor) -> Tensor:
    """Dense AFT with the band scattered into a T x T bias (0 outside |t - t'| < s).
    q, k, v: [B, H, T, D] -> [B, H, T, D]."""
    return aft_dense(q, k, v, band_to_dense(w, s), causal=causal)


@float32_sums(name="aft-local:efficient")
def banded(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, s: int, w: Tensor) -> Tensor:
    """Window densely, the rest by prefix/suffix sums. q, k, v: [B, H, T, D] -> [B, H, T, D]."""
    t = q.shape[-2]
    se = min(s, t)  # keys farther than T - 1 do not exist
    lo, hi = se - 1, 0 if causal else se - 1  # window offsets t' - t in -lo..hi
    width = lo + hi + 1
    wb = w[:, s - 1 - lo : s + hi]  # (T, width): bias of offsets -lo..hi
    kw = F.pad(k, (0, 0, lo, hi), value=float("-inf")).unfold(-2, width, 1)  # (B, H, T, D, W)
    vw = F.pad(v, (0, 0, lo, hi)).unfold(-2, width, 1)  # (B, H, T, D, W)
    logits = kw + wb[:, None, :]  # (B, H, T, D, W); -inf where t' is out of range
    part = dense(logits, vw, dim=-1)  # the window, each (B, H, T, D)
    if se < t:
        one = leaves(k, v)
        part = merge(part, shift(prefix_scan(one), se))  # keys t' <= t - s
        if not causal:
            part = merge(part, shift(suffix_scan(one), -se))  # keys t' >= t + s
    return torch.sigmoid(q) * average(part)


def flops(shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
    """4 per (query, window slot, feature) (out-of-range slots included) plus 4 per (key,
    feature) for each of the prefix and suffix sums (see aft.common)."""
    t, feats = shape.seq_len, shape.batch * shape.heads * shape.head_dim
    se = min(params["s"], t)
    width = se if causal else 2 * se - 1
    sums = 0 if se >= t else (1 if causal else 2)
    return 4 * feats * t * (width + sums)


def layer_init(params: Mapping[str, Any], heads: int, max_len: int) -> dict[str, Tensor]:
    """w = 0, as labml initialises AFT's bias."""
    return {"w": torch.zeros(max_len, 2 * params["s"] - 1)}


def layer_at_length(
    bias: dict[str, Tensor], t: int, max_len: int, params: Mapping[str, Any]
) -> dict[str, Tensor]:
    """The first T rows for T <= max_len; beyond, zero bias on rows and keys >= max_len."""
    w, s = bias["w"], params["s"]
    if t <= max_len:
        return {"w": w[:t]}
    w = F.pad(w, (0, 0, 0, t - max_len))  # (T, 2s-1): rows >= max_len are 0
    key = torch.arange(t)[:, None] + torch.arange(2 * s - 1)[None, :] - (s - 1)  # (T, 2s-1)
    return {"w": w.masked_fill(key.to(w.device) >= max_len, 0.0)}


MECHANISM = Mechanism(
    name="aft-local",
    family="aft",
    description="AFT with the learned bias kept only where |t - t'| < s (global connectivity kept)",
    sources=(sources.ZHAI_2021,),
    params=(positive_int("s", 32, "window: the bias is kept where |t - t'| < s"),),
    extra_inputs=(
        ExtraInput(
            "w",
            "learned band bias [T, 2s-1]; w[t, j] is the bias of key t + j - (s - 1)",
            shape=lambda sh, p: (sh.seq_len, 2 * p["s"] - 1),
        ),
    ),
    paths=(
        PathSpec("reference", "reference", reference, memory="O(n^2 d)"),
        PathSpec(
            "efficient",
            "efficient",
            banded,
            memory="O(n s d)",
            note="window densely, outside keys by exactly stabilised prefix/suffix sums",
        ),
    ),
    check_inputs=check_elementwise,
    flops=flops,
    decode=(LOCAL,),
    layer=aft_layer(layer_init, layer_at_length),
    time="O(n s d)",
    memory="O(n s d)",
    notes="A layer is built for max_len: rows and keys >= max_len get bias 0.",
)
