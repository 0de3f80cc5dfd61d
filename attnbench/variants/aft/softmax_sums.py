"""Exactly stabilised AFT sums: partial softmax sums carried as (m, num, den), merged like
FlashAttention's online softmax.

Every AFT output is a weighted average ``sum_t' e^{a[t, t']} V[t'] / sum_t' e^{a[t, t']}`` per
feature, with logits ``a = w[t, t'] + K[t']``. A partial sum over a set of keys is held as three
tensors of the same shape ``[..., T, F]``:

* ``m``   a stabiliser, detached: the largest logit of the set (``-inf`` for an empty set),
* ``num`` ``sum e^{a - m} V`` and ``den`` ``sum e^{a - m}`` (so ``den >= 1`` unless empty).

Two disjoint sets merge exactly: ``m = max(m1, m2)``, ``num = num1 e^{m1 - m} + num2 e^{m2 - m}``
(likewise ``den``). The stabiliser is a maximum of actual logits, never a rounded log-sum, so the
rescaling factors are as precise as the dense reference's own ``exp(a - max a)`` (a log-sum-exp
representation loses ``eps * |a|`` per merge: 6x the reference's error at K ~ N(0, 1), 1000x on
dK at K x 50, measured with ``torch.logcumsumexp``).

:func:`prefix_scan` computes inclusive prefix sums over positions with a tree of merges (depth
log2 T, O(T F) work and memory, no Python loop over T); :func:`suffix_scan` is its mirror.

Matrix-product paths (aft-full, aft-conv) cannot use the exact maximum of every (row, feature):
``w[t, t'] + K[t', f]`` has one per pair, and a product shares one stabiliser ``a[t] + b[f]``
across the whole sum. Any such separable stabiliser can miss the true maximum by an unbounded
gap: with two keys, ``w = [[0, -L], [-L, 0]]`` and ``K = [[0, -L], [-L, 0]]`` (keys x features),
the maxima are ``[[0, -L], [-L, 0]]``; no overflow needs ``a[t] + b[f] >= max``, so
``(a0 + b1) + (a1 + b0) = (a0 + b0) + (a1 + b1) >= 0`` and one off-diagonal entry is stabilised
at least L above its maximum: all its terms underflow once L passes the exponent range, whatever
per-key shifts are added (they cancel in each term). So such a path *certifies* its sums
(:func:`certified_average`). The argument: every term is a product or exp of values <= 1 and
partial sums are merged with factors <= 1, so the only error beyond ordinary rounding is values
falling below the smallest normal number ``tiny``: a term then loses at most ``tiny`` and a
merge, scaling a sum <= T, at most ``T tiny`` (with or without flush-to-zero). With at most T
terms and 2 log2 T merges per entry the loss is below ``T (2 + 2 log2 T) tiny`` in the
denominator (times max |V| in the numerator), so a denominator >= :func:`underflow_threshold`,
``T (2 + 2 log2 T) tiny / eps``, is within eps of exact from underflow and is not 0: no 0/0.
The (rare) entries below it are taken from the same sums in float64, where the same gap costs
nothing until it nears 700, and those that fail even there are recomputed densely, each with its
own exact maximum (``den >= 1``).

The AFT efficient paths take half inputs (float16, bfloat16) in float32
(:func:`attnbench.core.precision.float32_sums`): float16's own exponent range (it underflows
below e^-17) would make the certificate fail for ordinary inputs, and logits w + K rounded to 8
or 11 bits lose digits the float64 oracle keeps.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

Partial = tuple[Tensor, Tensor, Tensor]  # (m, num, den), each [..., T, F]


def leaves(k: Tensor, v: Tensor) -> Partial:
    """One-key sets: m = K (detached), num = e^{K - m} V (= V, with K's gradient), den = e^0."""
    m = k.detach()
    e = torch.exp(k - m)  # ones, but differentiable in k
    return m, e * v, e


def merge(a: Partial, b: Partial) -> Partial:
    """The partial sums of the union of two disjoint key sets (one of them may be empty)."""
    m = torch.maximum(a[0], b[0])
    fa, fb = torch.exp(a[0] - m), torch.exp(b[0] - m)  # <= 1; 0 for an empty set
    return m, a[1] * fa + b[1] * fb, a[2] * fa + b[2] * fb


def empty_like(p: Partial, length: int) -> Partial:
    """``length`` empty sets shaped like ``p`` along dim -2: (-inf, 0, 0)."""
    shape = (*p[0].shape[:-2], length, p[0].shape[-1])
    m = torch.full(shape, float("-inf"), dtype=p[0].dtype, device=p[0].device)
    zero = torch.zeros(shape, dtype=p[1].dtype, device=p[1].device)
    return m, zero, zero


def shift(p: Partial, by: int) -> Partial:
    """Move every position ``by`` steps later along dim -2 (``by < 0``: earlier), filling with
    empty sets and keeping the length."""
    t = p[0].shape[-2]
    if by == 0:
        return p
    if abs(by) >= t:
        return empty_like(p, t)
    pairs = zip(empty_like(p, abs(by)), p, strict=True)
    if by > 0:
        return tuple(torch.cat((f, x[..., : t - by, :]), dim=-2) for f, x in pairs)
    return tuple(torch.cat((x[..., -by:, :], f), dim=-2) for f, x in pairs)


def prefix_scan(p: Partial) -> Partial:
    """Inclusive prefix sums along dim -2: position t holds the set of positions 0..t.

    Pairs (2i, 2i+1) are merged, the half-length sequence is scanned recursively, and the even
    positions get the pair prefix before them merged with themselves.
    """
    t = p[0].shape[-2]
    if t == 1:
        return p
    if t % 2:
        p = tuple(torch.cat((x, f), dim=-2) for x, f in zip(p, empty_like(p, 1), strict=True))
    even = tuple(x[..., 0::2, :] for x in p)
    odd = tuple(x[..., 1::2, :] for x in p)
    upto_odd = prefix_scan(merge(even, odd))  # [i] covers 0..2i+1
    upto_even = merge(shift(upto_odd, 1), even)  # [i] covers 0..2i
    return tuple(
        torch.stack((e, o), dim=-2).flatten(-3, -2)[..., :t, :]  # interleave: 0, 1, 2, ...
        for e, o in zip(upto_even, upto_odd, strict=True)
    )


def suffix_scan(p: Partial) -> Partial:
    """Inclusive suffix sums along dim -2: position t holds the set of positions t..T-1."""
    flipped = prefix_scan(tuple(x.flip(-2) for x in p))
    return tuple(x.flip(-2) for x in flipped)


def dense(logits: Tensor, v: Tensor, dim: int) -> Partial:
    """Partial sums of a dense block of logits reduced over ``dim`` (masked entries -inf); the
    stabiliser is the block's own per-row maximum, so ``den >= 1`` whenever a key is visible."""
    m = logits.detach().amax(dim, keepdim=True)
    safe = torch.where(torch.isfinite(m), m, torch.zeros((), dtype=m.dtype))  # all-masked rows
    e = torch.exp(logits - safe)  # 0 at masked entries
    return m.squeeze(dim), (e * v).sum(dim), e.sum(dim)


def average(p: Partial) -> Tensor:
    """num / den: the weighted average of V the partial sums describe."""
    return p[1] / p[2]


def underflow_threshold(dtype: torch.dtype, count: int) -> float:
    """The smallest denominator of ``count`` terms (stabilised to <= 1, merged with factors <= 1)
    whose loss to underflow is at most eps relative (see the module docstring)."""
    info = torch.finfo(dtype)
    merges = 2 + 2 * math.ceil(math.log2(max(count, 1)))
    return max(count, 1) * merges * info.tiny / info.eps


#: Stabilised sums computed in a given dtype: dtype -> (num, den), same shape.
Sums = Callable[[torch.dtype], tuple[Tensor, Tensor]]
#: Exact averages of selected entries: index tensors (one per dim of ``den``) -> values [n].
Exact = Callable[..., Tensor]


def certified_average(
    sums: Sums, dtype: torch.dtype, count: int, exact: Exact, piece: int
) -> Tensor:
    """``num / den`` from ``sums(dtype)``, certified against underflow (module docstring).

    Entries whose denominator (a sum of ``count`` terms) is below :func:`underflow_threshold` are
    taken from ``sums(float64)`` instead, whose exponent range (e^-708) absorbs gaps between the
    stabiliser and the true maximum some 600 wider; entries that fail even there are replaced,
    differentiably, by ``exact(*indices)`` (each with its exact maximum), ``piece`` entries at a
    time. A failing denominator is replaced by 1 before dividing, so neither the output nor a
    gradient can be 0/0 or inf/inf.
    """
    num, den = sums(dtype)
    bad = den < underflow_threshold(dtype, count)
    if not bool(bad.any()):
        return num / den
    one = torch.ones((), dtype=dtype, device=den.device)
    avg = num / torch.where(bad, one, den)
    if dtype != torch.float64:
        num64, den64 = sums(torch.float64)
        still = bad & (den64 < underflow_threshold(torch.float64, count))
        avg64 = num64 / torch.where(still, one.double(), den64)
        avg, bad = torch.where(bad, avg64.to(dtype), avg), still
        if not bool(bad.any()):
            return avg
    index = bad.nonzero(as_tuple=True)
    n, piece = index[0].numel(), max(1, piece)
    values = torch.cat(
        [exact(*(i[start : start + piece] for i in index)) for start in range(0, n, piece)]
    )
    return avg.index_put(index, values.to(dtype))


def exact_average(logits: Tensor, v: Tensor) -> Tensor:
    """Each row's weighted average with its own exact maximum: logits, v ``[n, T]`` (masked
    logits -inf) -> ``[n]``."""
    return average(dense(logits, v, dim=-1))
