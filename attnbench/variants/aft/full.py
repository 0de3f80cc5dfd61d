"""AFT-full: a learned T x T pair-wise bias (Zhai et al. 2021).

    Y[t] = sigmoid(Q[t]) * sum_t' exp(K[t'] + w[t, t']) * V[t'] / sum_t' exp(K[t'] + w[t, t'])

elementwise over features; ``w`` is ``[T, T]``, shared by every head and feature, or factorised
as ``w = w_u @ w_v^T`` with ``w_u, w_v`` of shape ``[T, rank]`` (the paper's d' = 128).

The efficient path is two matrix products, ``exp(w) @ (exp(K) * V)`` and ``exp(w) @ exp(K)``,
with T*T*d work and no T*T*d tensor. They are stabilised exactly: a per-query-row maximum of w
and a per-feature maximum of K are subtracted, ``e^{w - mw[t]} e^{K - mk[f]}``; the common factor
``e^{mw[t] + mk[f]}`` cancels between numerator and denominator. (labml's AFT subtracts a per-key
maximum instead, which does not cancel when biases are non-zero: up to 0.73 off with random
biases.)

That stabiliser is an upper bound of the joint maximum ``max_t' w[t, t'] + K[t', f]`` of each
(row, feature), not the maximum itself, and no choice of per-row, per-feature and per-key shifts
can be (:mod:`~attnbench.variants.aft.softmax_sums` gives a two-key counterexample): the gap is
at most ``min(span of w over row t, span of K over feature f)``, so with K and w of standard
deviation 5 in float16 (T = 129), or spans beyond ~100 in float32, every term of some (row,
feature) underflowed and the division was 0/0 (issue 11). The sums are therefore taken in float32
for half inputs and *certified*: a denominator >= ``underflow_threshold(T)`` (T (2 + 2 log2 T)
tiny / eps: e^-61 for float32 at T = 1000) is provably within eps of exact and non-zero. If some
(row, feature) is below it, the products are taken once more in float64 (threshold e^-660) and
used for the entries that failed; any still below are recomputed densely over the keys their row
sees, each with its exact maximum (denominator >= 1), in pieces of at most max(T, B*H*D) entries
(O(T^2 + T d) memory). Unit-scale inputs never leave the float32 products; K and w of standard
deviation 20 at T = 1024 fail the certificate in ~2 % of the entries (one float64 pass more), and
nothing goes dense short of logit spans near 700.

Causal (the paper's autoregressive form masks w: t' <= t): a single per-feature maximum of K
would be taken over keys that early rows cannot see and underflow them (K x 50: ~60 % of the
features of row 0 in fp32). So the causal path divides the triangle recursively: a square of
rows/keys [a, b) is its two half-squares on the diagonal (recursed) plus the rectangle of rows
[mid, b) x keys [a, mid), which every one of those rows sees entirely and which is therefore two
stabilised products as above, merged exactly into the lower half-square's partial sums.
Squares of at most ``chunk`` rows are computed densely (``chunk x chunk x d``, each row with
its own maximum). The merged sums are certified as above (merges only scale by factors <= 1,
which the threshold accounts for); failures are redone in float64, then densely over keys
t' <= t. Work: the T^2/2 visible pairs in matrix products plus O(T d log T + T chunk d)
elementwise; memory O(T^2 + T d log T + T chunk d). Sub-blocks are taken with ``split``, so
backward costs O(size) per level rather than a full-size zero-fill per slice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.core import sources
from attnbench.core.precision import float32_sums
from attnbench.core.spec import ExtraInput, Mechanism, Param, PathSpec, Shape, positive_int
from attnbench.variants.aft.common import as_features, check_elementwise, from_features
from attnbench.variants.aft.decode import FULL
from attnbench.variants.aft.dense import aft_dense
from attnbench.variants.aft.layer import aft_layer
from attnbench.variants.aft.softmax_sums import (
    Partial,
    certified_average,
    dense,
    exact_average,
    merge,
)


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
    w: Tensor | None = None,
    w_u: Tensor | None = None,
    w_v: Tensor | None = None,
) -> Tensor:
    """Dense AFT-full over ``[B, H, T, T, D]`` logits. q, k, v: [B, H, T, D] -> [B, H, T, D]."""
    return aft_dense(q, k, v, bias_of(factorized, w, w_u, w_v), causal=causal)


def _all_keys(w: Tensor, kf: Tensor, vf: Tensor) -> tuple[Tensor, Tensor]:
    """Stabilised sums when every row sees every key. w [T, T], kf, vf [T, F] -> (num, den),
    each [T, F], both scaled by the same e^{-(mw[t] + mk[f])}."""
    ew = torch.exp(w - w.detach().amax(-1, keepdim=True))  # (T, T), each row's max is 1
    ek = torch.exp(kf - kf.detach().amax(0, keepdim=True))  # (T, F), each feature's max is 1
    num_den = ew @ torch.cat((ek * vf, ek), dim=-1)  # (T, 2F)
    num, den = num_den.chunk(2, dim=-1)
    return num, den


def _exact_entries(
    w: Tensor, kt: Tensor, vt: Tensor, causal: bool, rows: Tensor, feats: Tensor
) -> Tensor:
    """The average of (row, feature) entries computed densely with each one's exact maximum.
    w [T, T], kt, vt [F, T] (features x keys); rows, feats [n] -> [n]."""
    logits = w[rows] + kt[feats]  # (n, T)
    if causal:
        keys = torch.arange(w.shape[1], device=w.device)
        logits = logits.masked_fill(keys[None, :] > rows[:, None], float("-inf"))
    return exact_average(logits, vt[feats])


def _triangle(w: Tensor, kf: Tensor, vf: Tensor, leaf: int) -> Partial:
    """Partial sums of every row over keys t' <= t, for a diagonal square of the problem.
    w [n, n] (rows and keys of the square), kf, vf [n, F] -> (m, num, den), each [n, F]."""
    n = w.shape[0]
    if n <= leaf:
        logits = w[:, :, None] + kf[None, :, :]  # (n, n', F)
        future = torch.ones(n, n, dtype=torch.bool, device=kf.device).triu(1)
        return dense(logits.masked_fill(future[:, :, None], float("-inf")), vf[None], dim=1)
    h = n // 2
    top_rows, bottom_rows = w.split((h, n - h), dim=0)
    w_top, _ = top_rows.split((h, n - h), dim=1)  # the upper-right quadrant is the future
    w_rect, w_bottom = bottom_rows.split((h, n - h), dim=1)
    k_top, k_bottom = kf.split((h, n - h), dim=0)
    v_top, v_bottom = vf.split((h, n - h), dim=0)
    top = _triangle(w_top, k_top, v_top, leaf)  # rows [0, h), keys [0, t]
    bottom = _triangle(w_bottom, k_bottom, v_bottom, leaf)  # rows [h, n), keys [h, t]
    mw = w_rect.detach().amax(-1, keepdim=True)  # (n-h, 1)
    mk = k_top.detach().amax(0, keepdim=True)  # (1, F)
    ek = torch.exp(k_top - mk)  # (h, F)
    num_den = torch.exp(w_rect - mw) @ torch.cat((ek * v_top, ek), dim=-1)  # (n-h, 2F)
    num, den = num_den.chunk(2, dim=-1)
    bottom = merge(bottom, (mw + mk, num, den))  # rows [h, n) also see every key in [0, h)
    return tuple(torch.cat(pair, dim=0) for pair in zip(top, bottom, strict=True))


@float32_sums(name="aft-full:efficient")
def efficient(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    factorized: bool,
    chunk: int,
    w: Tensor | None = None,
    w_u: Tensor | None = None,
    w_v: Tensor | None = None,
) -> Tensor:
    """Two stabilised matrix products (blocked when causal), certified against underflow (see
    the module docstring). q, k, v: [B, H, T, D]."""
    bias = bias_of(factorized, w, w_u, w_v)  # (T, T)
    kf, vf = as_features(k), as_features(v)  # (T, F), F = B*H*D
    t, f = kf.shape

    def sums(dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        w_, k_, v_ = bias.to(dtype), kf.to(dtype), vf.to(dtype)
        return _triangle(w_, k_, v_, chunk)[1:] if causal else _all_keys(w_, k_, v_)

    by_feature: list[Tensor] = []  # K^T and V^T, made contiguous once if needed

    def exact(rows: Tensor, feats: Tensor) -> Tensor:
        if not by_feature:
            by_feature.extend((kf.t().contiguous(), vf.t().contiguous()))
        return _exact_entries(bias, *by_feature, causal, rows, feats)

    avg = certified_average(sums, kf.dtype, t, exact, piece=max(t, f))  # (T, F)
    return torch.sigmoid(q) * from_features(avg, q)


def _causal_terms(n: int, leaf: int) -> int:
    """(query, key) terms the causal recursion evaluates: dense leaves (masked entries included)
    plus every rectangle."""
    if n <= leaf:
        return n * n
    h = n // 2
    return _causal_terms(h, leaf) + _causal_terms(n - h, leaf) + (n - h) * h


def flops(shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
    """4 per (query, key, feature) term the path evaluates (see aft.common), plus 2 T^2 rank for
    ``w_u @ w_v^T``."""
    t, feats = shape.seq_len, shape.batch * shape.heads * shape.head_dim
    terms = _causal_terms(t, params["chunk"]) if causal else t * t
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
    sources=(sources.ZHAI_2021, sources.LABML_AFT),
    params=(
        Param(
            "factorized",
            False,
            "w = w_u @ w_v^T with w_u, w_v [T, rank] (the paper's factorised form)",
        ),
        positive_int("rank", 128, "d', the width of the factorised bias (used when factorized)"),
        positive_int("chunk", 32, "causal path: squares of at most this many rows are dense"),
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
        PathSpec("reference", "reference", reference, memory="O(n^2 d)"),
        PathSpec(
            "efficient",
            "efficient",
            efficient,
            memory="O(n^2 + n d); causal O(n^2 + n d log n + n chunk d)",
            note="exp(w) @ [exp(K) V, exp(K)] with exact row/feature maxima, sums certified "
            "against underflow (failures recomputed densely); causal: recursive halving of the "
            "triangle into such products, dense squares of `chunk` rows",
        ),
    ),
    check_inputs=check_elementwise,
    flops=flops,
    decode=(FULL,),
    layer=aft_layer(layer_init, layer_at_length),
    time="O(n^2 d)",
    memory="O(n^2 + n d) (the bias itself is n^2)",
    notes="A layer is built for max_len: shorter T uses w[:T, :T]; pairs involving a position >= "
    "max_len get bias 0 (AFT-simple there).",
)
