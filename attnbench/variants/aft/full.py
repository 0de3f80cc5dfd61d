"""AFT-full: a learned T x T pair-wise bias (Zhai et al. 2021; seed 001).

    Y[t] = sigmoid(Q[t]) * sum_t' exp(K[t'] + w[t, t']) * V[t'] / sum_t' exp(K[t'] + w[t, t'])

elementwise over features; ``w`` is ``[T, T]``, shared by every head and feature, or factorised
as ``w = w_u @ w_v^T`` with ``w_u, w_v`` of shape ``[T, rank]`` (the paper's d' = 128).

The efficient path is two matrix products, ``exp(w) @ (exp(K) * V)`` and ``exp(w) @ exp(K)``,
with T*T*d work and no T*T*d tensor. They are stabilised exactly: a per-query-row maximum of w
and a per-feature maximum of K are subtracted, ``e^{w - mw[t]} e^{K - mk[f]}``; the common factor
``e^{mw[t] + mk[f]}`` cancels between numerator and denominator. (labml's AFT subtracts a per-key
maximum instead, which does not cancel when biases are non-zero: up to 0.73 off with random
biases, FIELD-NOTES.) The denominator stays >= e^{w[t, b] - mw[t]} where b holds K's maximum, so
it cannot underflow unless w itself spans ~80 (fp32).

Causal (the paper's autoregressive form masks w: t' <= t): a single per-feature maximum of K
would be taken over keys that early rows cannot see and underflow them (K x 50: ~60 % of the
features of row 0 in fp32). So the causal path works on blocks of ``chunk`` query rows: keys
before the block, which every row of it sees, by the two stabilised products; keys inside the
block densely (``chunk x chunk x d``) with each row's own maximum; the two merged exactly. Each
block runs under activation checkpointing, so backward keeps O(chunk * d) per block rather than
the products' inputs (which would be O(T^2 d / chunk)) and recomputes the block's forward.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attnbench.spec import ExtraInput, Mechanism, Param, Path, Shape, positive_int
from attnbench.variants.aft.common import as_features, check_elementwise, from_features
from attnbench.variants.aft.dense import aft_dense
from attnbench.variants.aft.layer import aft_layer
from attnbench.variants.aft.softmax_sums import average, dense, merge


def bias_of(factorized: bool, w: Tensor | None, w_u: Tensor | None, w_v: Tensor | None) -> Tensor:
    """The ``[T, T]`` bias: ``w`` itself, or ``w_u @ w_v^T`` when factorised."""
    return w_u @ w_v.transpose(0, 1) if factorized else w


def reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    factorized: bool,
    rank: int,
    chunk: int,
    w: Tensor | None = None,
    w_u: Tensor | None = None,
    w_v: Tensor | None = None,
) -> Tensor:
    """Dense AFT-full over ``[B, H, T, T, D]`` logits. q, k, v: [B, H, T, D] -> [B, H, T, D]."""
    return aft_dense(q, k, v, bias_of(factorized, w, w_u, w_v), causal=causal)


def _all_keys(w: Tensor, kf: Tensor, vf: Tensor) -> Tensor:
    """Weighted averages when every row sees every key. w [T, T], kf, vf [T, F] -> [T, F]."""
    ew = torch.exp(w - w.detach().amax(-1, keepdim=True))  # (T, T), each row's max is 1
    ek = torch.exp(kf - kf.detach().amax(0, keepdim=True))  # (T, F), each feature's max is 1
    num_den = ew @ torch.cat((ek * vf, ek), dim=-1)  # (T, 2F)
    num, den = num_den.chunk(2, dim=-1)
    return num / den


def _causal_block(w_rows: Tensor, kf: Tensor, vf: Tensor, i0: int) -> Tensor:
    """Weighted averages of query rows i0..i0+c-1 (``w_rows`` = w[i0:i0+c], [c, T]) over keys
    t' <= t. kf, vf [T, F] -> [c, F]."""
    c = w_rows.shape[0]
    i1 = i0 + c
    logits = w_rows[:, i0:i1, None] + kf[None, i0:i1, :]  # (c, c', F)
    future = torch.ones(c, c, dtype=torch.bool, device=kf.device).triu(1)
    logits = logits.masked_fill(future[:, :, None], float("-inf"))
    part = dense(logits, vf[None, i0:i1, :], dim=1)  # keys i0..t, each (c, F)
    if i0 > 0:
        wp, kp = w_rows[:, :i0], kf[:i0]  # (c, i0), (i0, F): keys every row of the block sees
        mw = wp.detach().amax(-1, keepdim=True)  # (c, 1)
        mk = kp.detach().amax(0, keepdim=True)  # (1, F)
        ek = torch.exp(kp - mk)  # (i0, F)
        num_den = torch.exp(wp - mw) @ torch.cat((ek * vf[:i0], ek), dim=-1)  # (c, 2F)
        num, den = num_den.chunk(2, dim=-1)
        part = merge(part, (mw + mk, num, den))
    return average(part)


def efficient(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    factorized: bool,
    rank: int,
    chunk: int,
    w: Tensor | None = None,
    w_u: Tensor | None = None,
    w_v: Tensor | None = None,
) -> Tensor:
    """Two stabilised matrix products (blocked when causal). q, k, v: [B, H, T, D]."""
    bias = bias_of(factorized, w, w_u, w_v)  # (T, T)
    kf, vf = as_features(k), as_features(v)  # (T, F), F = B*H*D
    if not causal:
        avg = _all_keys(bias, kf, vf)  # (T, F)
    else:
        t = kf.shape[0]
        blocks = [
            checkpoint(_causal_block, bias[i0 : i0 + chunk], kf, vf, i0, use_reentrant=False)
            for i0 in range(0, t, chunk)
        ]
        avg = torch.cat(blocks, dim=0)  # (T, F)
    return torch.sigmoid(q) * from_features(avg, q)


def flops(shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
    """4 per (query, key, feature) term the path evaluates (see aft.common), plus 2 T^2 rank for
    ``w_u @ w_v^T``. Causal: each block of c rows evaluates the keys before it and its own c x c
    square (masked entries included)."""
    t, feats = shape.seq_len, shape.batch * shape.heads * shape.head_dim
    if causal:
        c = params["chunk"]
        terms = sum(min(c, t - i0) * min(i0 + c, t) for i0 in range(0, t, c))
    else:
        terms = t * t
    extra = 2 * t * t * params["rank"] if params["factorized"] else 0
    return 4 * feats * terms + extra


def layer_init(params: Mapping[str, Any], heads: int, max_len: int) -> dict[str, Tensor]:
    """w = 0 (labml's init: a fresh layer is AFT-simple); factorised: small random w_u, w_v
    (both zero would be a saddle with no gradient)."""
    if params["factorized"]:
        r = params["rank"]
        return {"w_u": torch.randn(max_len, r) * 0.02, "w_v": torch.randn(max_len, r) * 0.02}
    return {"w": torch.zeros(max_len, max_len)}


def layer_at_length(
    bias: dict[str, Tensor], t: int, max_len: int, params: Mapping[str, Any]
) -> dict[str, Tensor]:
    """w[:T, :T] for T <= max_len; zero bias on every pair touching a position >= max_len."""
    if params["factorized"]:  # zero rows of w_u / w_v give zero rows / columns of w_u @ w_v^T
        grow = max(t - max_len, 0)
        return {name: F.pad(x[:t], (0, 0, 0, grow)) for name, x in bias.items()}
    w = bias["w"]
    if t <= max_len:
        return {"w": w[:t, :t]}
    return {"w": F.pad(w, (0, t - max_len, 0, t - max_len))}


MECHANISM = Mechanism(
    name="aft-full",
    family="aft",
    description="AFT: sigmoid(Q) * elementwise softmax over keys of K + w[t, t'], times V",
    source="Zhai et al. 2021 (AFT); seed 001",
    params=(
        Param(
            "factorized",
            False,
            "w = w_u @ w_v^T with w_u, w_v [T, rank] (the paper's factorised form)",
        ),
        positive_int("rank", 128, "d', the width of the factorised bias (used when factorized)"),
        positive_int("chunk", 64, "query rows per block of the causal efficient path"),
    ),
    extra_inputs=(
        ExtraInput(
            "w",
            "learned pair-wise bias [T, T]; rows are queries, columns keys",
            shape=lambda s, p: (s.seq_len, s.seq_len),
            when=lambda p: not p["factorized"],
        ),
        ExtraInput(
            "w_u",
            "query factor [T, rank] of the bias w = w_u @ w_v^T",
            shape=lambda s, p: (s.seq_len, p["rank"]),
            init_std=128**-0.25,  # entries of w_u @ w_v^T ~ N(0, 1) at the default rank
            when=lambda p: p["factorized"],
        ),
        ExtraInput(
            "w_v",
            "key factor [T, rank] of the bias w = w_u @ w_v^T",
            shape=lambda s, p: (s.seq_len, p["rank"]),
            init_std=128**-0.25,
            when=lambda p: p["factorized"],
        ),
    ),
    paths=(
        Path("reference", "reference", reference, memory="O(n^2 d)"),
        Path(
            "efficient",
            "efficient",
            efficient,
            memory="O(n^2 + n d)",
            note="exp(w) @ [exp(K) V, exp(K)] with exact row/feature maxima; causal: blocks of "
            "`chunk` rows under checkpointing",
        ),
    ),
    check_inputs=check_elementwise,
    flops=flops,
    layer=aft_layer(layer_init, layer_at_length),
    time="O(n^2 d)",
    memory="O(n^2 + n d) (the bias itself is n^2)",
    notes="A layer is built for max_len: shorter T uses w[:T, :T]; pairs involving a position >= "
    "max_len get bias 0 (AFT-simple there).",
)
