"""The engine behind every sparse pattern's efficient path: exact attention over a few *parts*,
never an n x n matrix.

A part pairs a query :class:`Layout` with a key layout. A layout arranges the positions
``0..n-1`` into ``G`` groups of ``M`` (``positions()`` is ``[G, M]``, -1 marks padding) and gathers
a ``[B, H, n, C]`` tensor into ``[B, H, G, M, C]``, by views where it can (blocks, dilated
segments, residue classes, overlapping key windows via ``unfold``) and by indexing where it must
(BigBird's random blocks, summary columns). Each group's queries are scored against that group's
keys only, so a part costs ``G * Mq * Mk`` scores: the layouts are chosen so that this is
O(n * keys-per-query).

Layouts only need to *cover* a pattern: inside a part, the pattern's literal rule
(``Mechanism.visible``) is applied to the gathered ``(i, j)`` pairs elementwise, together with
the part's ``keep`` rule that hands each pair to exactly one part (so a union such as local ∪
atrous counts no pair twice). Lengths that are not a multiple of a block are padded inside and the
padding is masked out.

Each part yields, for every query it holds, its output normalised over its own keys and their
log-sum-exp. The parts are merged exactly, as FlashAttention merges tiles::

    L = log sum_p exp(lse_p),    o = sum_p exp(lse_p - L) * o_p

which is one softmax over the union of the parts' keys. A pair that sits in two parts is counted
twice: LongNet relies on that (its branches overlap on purpose); every other pattern gives its
parts disjoint ``keep`` rules. A query with no visible key in any part outputs zeros and passes
zero gradient.

Backward: :class:`_PartAttention` is a custom autograd Function that saves each part's
probabilities (``G * Mq * Mk`` values, the O(n * keys-per-query) term) and the gathered views, and
computes the gradients of its output and log-sum-exp directly; the layouts' gathers are ordinary
differentiable torch views, so autograd maps the gradients back to q, k, v.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

NEG_INF = float("-inf")

#: A rule on broadcastable integer position tensors (queries i, keys j) -> bool tensor.
Rule = Callable[[Tensor, Tensor], Tensor]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def pad_positions(x: Tensor, before: int, after: int, value: float = 0.0) -> Tensor:
    """Pad dim 2 (positions) of ``[B, H, T, C]`` with ``before`` rows in front, ``after`` behind."""
    if before == 0 and after == 0:
        return x
    return F.pad(x, (0, 0, before, after), value=value)


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------


class Layout:
    """Positions arranged as ``[G, M]`` groups; see the module docstring."""

    n: int

    def positions(self, device: torch.device) -> Tensor:
        """Long ``[G, M]``: the position of each slot, -1 for padding."""
        raise NotImplementedError

    def gather(self, x: Tensor) -> Tensor:
        """``[B, H, n, C]`` -> ``[B, H, G, M, C]`` (padding slots hold zeros)."""
        raise NotImplementedError

    def place(self, y: Tensor, fill: float) -> Tensor:
        """Inverse of :meth:`gather` for query layouts: ``[B, H, G, M, C]`` -> ``[B, H, n, C]``;
        positions the layout does not hold get ``fill``."""
        raise NotImplementedError


@dataclass(frozen=True)
class Dilated(Layout):
    """Segments of ``w`` positions, every ``r``-th kept: group g holds g*w, g*w + r, g*w + 2r, ...
    (below (g+1)*w and n). ``r = 1`` gives plain blocks of ``w``. A segment longer than the
    sequence is the whole sequence."""

    n: int
    w: int
    r: int = 1

    @property
    def seg(self) -> int:
        return min(self.w, self.n)

    @property
    def groups(self) -> int:
        return ceil_div(self.n, self.seg)

    @property
    def size(self) -> int:
        return ceil_div(self.seg, self.r)

    def positions(self, device: torch.device) -> Tensor:
        g = torch.arange(self.groups, device=device)[:, None]
        a = torch.arange(self.size, device=device)[None, :]
        p = g * self.seg + a * self.r  # (G, M); a * r < seg by construction of size
        return torch.where(p < self.n, p, -1)

    def gather(self, x: Tensor) -> Tensor:
        B, H, _, C = x.shape
        G, seg, M, r = self.groups, self.seg, self.size, self.r
        x = pad_positions(x, 0, G * seg - self.n).view(B, H, G, seg, C)  # (B, H, G, seg, C)
        if r == 1:
            return x
        x = F.pad(x, (0, 0, 0, M * r - seg)).view(B, H, G, M, r, C)  # (B, H, G, M, r, C)
        return x[:, :, :, :, 0]  # (B, H, G, M, C)

    def place(self, y: Tensor, fill: float) -> Tensor:
        B, H, G, M, C = y.shape
        seg, r = self.seg, self.r
        if r > 1:
            y = F.pad(y.unsqueeze(4), (0, 0, 0, r - 1), value=fill)  # (B, H, G, M, r, C)
            y = y.reshape(B, H, G, M * r, C)[:, :, :, :seg]  # (B, H, G, seg, C)
        return y.reshape(B, H, G * seg, C)[:, :, : self.n]  # (B, H, n, C)


def Blocks(n: int, b: int) -> Dilated:  # noqa: N802 (a layout constructor)
    """Contiguous blocks of ``b`` positions (the last one shorter when b does not divide n)."""
    return Dilated(n, b, 1)


@dataclass(frozen=True)
class Residue(Layout):
    """Residue classes mod r: group c holds c, c + r, c + 2r, ... (< n). Within a class every
    pair is a multiple of r apart, so dense attention inside a class is atrous attention.
    ``r >= n`` is the same as ``r = n`` (every class is a single position)."""

    n: int
    r: int

    @property
    def rate(self) -> int:
        return min(self.r, self.n)

    @property
    def size(self) -> int:
        return ceil_div(self.n, self.rate)

    def positions(self, device: torch.device) -> Tensor:
        c = torch.arange(self.rate, device=device)[:, None]
        a = torch.arange(self.size, device=device)[None, :]
        p = c + self.rate * a  # (r, m)
        return torch.where(p < self.n, p, -1)

    def gather(self, x: Tensor) -> Tensor:
        B, H, _, C = x.shape
        r, m = self.rate, self.size
        x = pad_positions(x, 0, m * r - self.n).view(B, H, m, r, C)  # (B, H, m, r, C)
        return x.transpose(2, 3)  # (B, H, r, m, C)

    def place(self, y: Tensor, fill: float) -> Tensor:
        B, H, r, m, C = y.shape
        return y.transpose(2, 3).reshape(B, H, m * r, C)[:, :, : self.n]  # (B, H, n, C)


@dataclass(frozen=True)
class Full(Layout):
    """One group holding every position in order (a dense row or column set)."""

    n: int

    def positions(self, device: torch.device) -> Tensor:
        return torch.arange(self.n, device=device)[None, :]  # (1, n)

    def gather(self, x: Tensor) -> Tensor:
        return x.unsqueeze(2)  # (B, H, 1, n, C)

    def place(self, y: Tensor, fill: float) -> Tensor:
        return y[:, :, 0]  # (B, H, n, C)


@dataclass(frozen=True)
class Band(Layout):
    """Keys only: for the query block g of size b, the window of keys
    ``[g*b - left, g*b + b + right)``, gathered as overlapping ``unfold`` views (no copy)."""

    n: int
    b: int
    left: int
    right: int

    @property
    def lo(self) -> int:  # a reach beyond n - 1 adds only padding
        return min(self.left, self.n - 1)

    @property
    def hi(self) -> int:
        return min(self.right, self.n - 1)

    @property
    def groups(self) -> int:
        return ceil_div(self.n, self.b)

    @property
    def size(self) -> int:
        return self.b + self.lo + self.hi

    def positions(self, device: torch.device) -> Tensor:
        g = torch.arange(self.groups, device=device)[:, None]
        u = torch.arange(self.size, device=device)[None, :]
        p = g * self.b - self.lo + u  # (G, L)
        return torch.where((p >= 0) & (p < self.n), p, -1)

    def gather(self, x: Tensor) -> Tensor:
        after = self.groups * self.b + self.hi - self.n
        x = pad_positions(x, self.lo, after)  # (B, H, lo + G*b + hi, C)
        return x.unfold(2, self.size, self.b).transpose(-1, -2)  # (B, H, G, L, C) view


@dataclass(frozen=True, eq=False)
class Indexed(Layout):
    """Arbitrary positions ``pos`` ``[G, M]`` (-1 for padding), gathered by indexing."""

    n: int
    pos: Tensor

    def positions(self, device: torch.device) -> Tensor:
        return self.pos.to(device)

    def _index(self, device: torch.device) -> Tensor:
        pos = self.positions(device)
        return torch.where(pos >= 0, pos, self.n)  # padding reads the zero row n

    def gather(self, x: Tensor) -> Tensor:
        x = pad_positions(x, 0, 1)  # (B, H, n + 1, C), row n is zeros
        return x[:, :, self._index(x.device)]  # (B, H, G, M, C)

    def place(self, y: Tensor, fill: float) -> Tensor:
        B, H, _, _, C = y.shape
        out = y.new_full((B, H, self.n + 1, C), fill)
        out[:, :, self._index(y.device)] = y  # each real position appears at most once
        return out[:, :, : self.n]  # (B, H, n, C)


@dataclass(frozen=True, eq=False)
class Part:
    """Queries in ``queries`` attend keys in ``keys`` (same group count, or keys with one group
    shared by all), where the pattern's rule holds and ``keep`` (if given) too."""

    queries: Layout
    keys: Layout
    keep: Rule | None = None


# --------------------------------------------------------------------------------------------
# One part: masked softmax attention with its log-sum-exp, and its backward
# --------------------------------------------------------------------------------------------


class _PartAttention(torch.autograd.Function):
    """o = softmax(q k^T, blocked pairs at -inf) v per group, and lse = log sum exp(q k^T).

    q ``[B, H, G, Mq, D]`` (already scaled), k ``[B, H, Gk, Mk, D]``, v ``[B, H, Gk, Mk, Dv]`` with
    Gk in (G, 1), ``blocked`` bool ``[G or 1, Mq, Mk]`` (True = not attended). A row with nothing
    visible gives o = 0 and lse = -inf. Saves the probabilities (G * Mq * Mk values).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, blocked: Tensor):
        p = torch.matmul(q, k.transpose(-2, -1))  # (B, H, G, Mq, Mk) scores
        p.masked_fill_(blocked, NEG_INF)
        m = p.amax(-1, keepdim=True).nan_to_num_(neginf=0.0)  # (B, H, G, Mq, 1) row max, 0 if empty
        p.sub_(m).exp_()  # unnormalised probabilities, 0 where blocked
        l = p.sum(-1, keepdim=True)  # (B, H, G, Mq, 1); >= 1 unless the row is empty  # noqa: E741
        lse = m + l.log()  # -inf on empty rows
        p.div_(l.clamp_min(1.0))  # probabilities; empty rows stay 0
        o = torch.matmul(p, v)  # (B, H, G, Mq, Dv)
        ctx.save_for_backward(q, k, v, p, o)
        ctx.set_materialize_grads(False)
        return o, lse.squeeze(-1)

    @staticmethod
    def backward(ctx, do: Tensor | None, dlse: Tensor | None):
        q, k, v, p, o = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        # d(score) = p * (do . v_j - do . o + dlse): softmax backward plus the lse term.
        delta = (do * o).sum(-1, keepdim=True)  # (B, H, G, Mq, 1)
        if dlse is not None:
            delta = delta - dlse.unsqueeze(-1)
        dv = torch.matmul(p.transpose(-2, -1), do)  # (B, H, G, Mk, Dv)
        ds = torch.matmul(do, v.transpose(-2, -1))  # (B, H, G, Mq, Mk) dp
        ds.sub_(delta).mul_(p)
        dq = torch.matmul(ds, k)  # (B, H, G, Mq, D)
        dk = torch.matmul(ds.transpose(-2, -1), q)  # (B, H, G, Mk, D)
        if k.shape[2] != q.shape[2]:  # keys shared by every group
            dk, dv = dk.sum(2, keepdim=True), dv.sum(2, keepdim=True)
        return dq, dk, dv, None


def merge(results: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    """Combine parts' (o ``[B, H, n, Dv]``, lse ``[B, H, n]``) into one softmax over their union:
    o = sum_p exp(lse_p - L) o_p with L = log sum_p exp(lse_p); rows empty everywhere give 0."""
    if len(results) == 1:
        return results[0][0]
    lses = torch.stack([lse for _, lse in results])  # (P, B, H, n)
    top = lses.detach().amax(0)
    top = torch.where(torch.isfinite(top), top, 0.0)  # (B, H, n)
    weights = torch.exp(lses - top)  # (P, B, H, n), the largest is 1 on non-empty rows
    total = weights.sum(0)  # (B, H, n), >= 1 on non-empty rows, 0 on empty ones
    out = sum(w.unsqueeze(-1) * o for w, (o, _) in zip(weights, results, strict=True))
    return out / torch.where(total > 0, total, 1.0).unsqueeze(-1)  # (B, H, n, Dv)


def attend(q: Tensor, k: Tensor, v: Tensor, parts: Sequence[Part], rule: Rule) -> Tensor:
    """Softmax attention restricted to ``rule`` over the union of ``parts``.

    q, k, v ``[B, H, n, D]`` (v ``[B, H, n, Dv]``) -> ``[B, H, n, Dv]``; scale 1/sqrt(D).
    """
    if not parts:
        raise ValueError("attend needs at least one part")
    qs = q * (1.0 / math.sqrt(q.shape[-1]))  # (B, H, n, D)
    results = []
    for part in parts:
        i = part.queries.positions(q.device)[:, :, None]  # (G, Mq, 1)
        j = part.keys.positions(q.device)[:, None, :]  # (Gk, 1, Mk)
        ok = rule(i, j) & (i >= 0) & (j >= 0)  # (G, Mq, Mk)
        if part.keep is not None:
            ok = ok & part.keep(i, j)
        o, lse = _PartAttention.apply(
            part.queries.gather(qs), part.keys.gather(k), part.keys.gather(v), ~ok
        )
        o = part.queries.place(o, 0.0)  # (B, H, n, Dv)
        lse = part.queries.place(lse.unsqueeze(-1), NEG_INF).squeeze(-1)  # (B, H, n)
        results.append((o, lse))
    return merge(results)
