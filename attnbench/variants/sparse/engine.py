"""The engine behind every sparse pattern's efficient path: exact attention over a few *parts*,
never an n x n matrix.

A part pairs a query :class:`Layout` with a key layout. A layout arranges the positions
``0..n-1`` into ``G`` groups of ``M`` (``positions()`` is ``[G, M]``, -1 marks padding) and gathers
a ``[B, H, n, C]`` tensor into ``[B, H, G, M, C]``, by views where it can (blocks, dilated
segments, residue classes) and by indexing where it must (BigBird's random blocks, summary
columns). Each group's queries are scored against that group's keys only, so a part costs
``G * Mq * Mk`` score slots: the layouts are chosen so that this is O(n * keys-per-query). A
:class:`Band` (query blocks against their neighbouring key blocks) is not gathered at all: the
windows are overlapping strided views of K and V that ``bmm`` reads in place.

Layouts only need to *cover* a pattern: inside a part, the pattern's literal rule
(``Mechanism.visible``) is applied to the gathered ``(i, j)`` pairs elementwise, together with
the part's ``keep`` rule that hands each pair to exactly one part (so a union such as local ∪
atrous counts no pair twice). The resulting boolean mask has one byte per score slot, shared by
batch and heads. Lengths that are not a multiple of a block are padded inside and the padding is
masked out.

On the CPU every part runs on PyTorch's fused flash-attention kernel instead
(:mod:`attnbench.variants.sparse.cpu_fused`); what follows is the executor everywhere else.
The scores are computed chunk by chunk (:data:`CHUNK`); each chunk's unnormalised probabilities
are kept for the backward (``G * Mq * Mk`` values per head: the O(n * keys-per-query) term), and
the backward's score-sized temporaries live one chunk at a time.

Each part yields, for every query it holds, its output normalised over its own keys and their
log-sum-exp. The parts are merged exactly, as FlashAttention merges tiles::

    L = log sum_p exp(lse_p),    o = sum_p exp(lse_p - L) * o_p

which is one softmax over the union of the parts' keys. A pair that sits in two parts is counted
twice: LongNet relies on that (its branches overlap on purpose); every other pattern gives its
parts disjoint ``keep`` rules. A query with no visible key in any part outputs zeros and passes
zero gradient.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

NEG_INF = float("-inf")

#: Score slots per chunk (fp32: 8 MiB). Bounds the backward's score-sized temporaries and keeps
#: buffers small enough to be recycled by the allocator. On this CPU (local, window 64, n = 8192,
#: B=1, H=4, D=64, fwd+bwd, 1 thread) 1 << 20 / 1 << 21 / 1 << 23 took 471 / 369 / 472 ms; with 2
#: threads on the oversubscribed machine fewer, larger chunks won (fewer parallel regions to
#: synchronise), 2479 / 1336 / 1161 ms. Noisy; see the README's sparse section.
CHUNK = 1 << 21

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


class Layout(ABC):
    """Positions arranged as ``[G, M]`` groups; see the module docstring. Every layout has
    positions; key layouts that are read in place (Band) need no gather or place."""

    n: int

    @abstractmethod
    def positions(self, device: torch.device) -> Tensor:
        """Long ``[G, M]``: the position of each slot, -1 for padding."""

    def gather(self, x: Tensor) -> Tensor:
        """``[B, H, n, C]`` -> ``[B, H, G, M, C]`` (padding slots hold zeros)."""
        raise TypeError(f"{type(self).__name__} is read in place; it has no gather")

    def place(self, y: Tensor, fill: float) -> Tensor:
        """Inverse of :meth:`gather` for query layouts: ``[B, H, G, M, C]`` -> ``[B, H, n, C]``;
        positions the layout does not hold get ``fill``."""
        raise TypeError(f"{type(self).__name__} is a key layout; it places no outputs")


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
    """Keys only, with :func:`Blocks` of b queries: query block g sees the key blocks
    g - before .. g + after (whole blocks). Computed on overlapping strided windows of K and V,
    with no gather at all (see :func:`_run_band`)."""

    n: int
    b: int
    before: int  # key blocks before the query's block
    after: int  # key blocks after it

    @property
    def groups(self) -> int:
        return ceil_div(self.n, self.b)

    @property
    def lo(self) -> int:  # blocks beyond the sequence add only padding
        return min(self.before, self.groups - 1)

    @property
    def hi(self) -> int:
        return min(self.after, self.groups - 1)

    @property
    def width(self) -> int:
        """Key blocks per query block."""
        return self.lo + 1 + self.hi

    def positions(self, device: torch.device) -> Tensor:
        g = torch.arange(self.groups, device=device)[:, None]
        u = torch.arange(self.width * self.b, device=device)[None, :]
        p = (g - self.lo) * self.b + u  # (G, L)
        return torch.where((p >= 0) & (p < self.n), p, -1)


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
    """Queries in ``queries`` attend keys in ``keys`` (group g against group g), where the
    pattern's rule holds and ``keep`` (if given) too."""

    queries: Layout
    keys: Layout
    keep: Rule | None = None


# --------------------------------------------------------------------------------------------
# The mask of a part
# --------------------------------------------------------------------------------------------


def part_mask(qpos: Tensor, kpos: Tensor, rule: Rule, keep: Rule | None) -> Tensor:
    """Boolean ``[G, Mq, Mk]``, True where the slot pair is NOT attended (padding, outside the
    rule, or handed to another part). Evaluated in slices so the rule's integer temporaries stay
    chunk-sized."""
    G, Mq = qpos.shape
    Mk = kpos.shape[1]
    blocked = torch.empty(G, Mq, Mk, dtype=torch.bool, device=qpos.device)
    for g0, g1, r0, r1 in _slices(G, Mq, Mk, CHUNK):
        i = qpos[g0:g1, r0:r1, None]  # (g, rows, 1)
        j = kpos[g0:g1, None, :]  # (g, 1, Mk)
        ok = rule(i, j) & (i >= 0) & (j >= 0)
        if keep is not None:
            ok = ok & keep(i, j)
        blocked[g0:g1, r0:r1] = ~ok
    return blocked


def _slices(G: int, Mq: int, Mk: int, budget: int) -> Iterator[tuple[int, int, int, int]]:
    """(g0, g1, r0, r1) covering [G, Mq] with about ``budget`` score slots each: whole groups when
    a group fits, else row ranges of one group."""
    per_group = Mq * Mk
    if per_group <= budget:
        step = max(1, budget // max(per_group, 1))
        for g0 in range(0, G, step):
            yield g0, min(G, g0 + step), 0, Mq
        return
    rows = max(1, budget // max(Mk, 1))
    for g in range(G):
        for r0 in range(0, Mq, rows):
            yield g, g + 1, r0, min(Mq, r0 + rows)


# --------------------------------------------------------------------------------------------
# Chunked masked attention with its log-sum-exp, and its backward
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Plan:
    """How the batch items of one part line up. Item t (of T) has queries ``q3[t]`` ``[Mq, D]``
    and mask ``blocked[t % period]``; its keys are ``k3[t]`` (``window == 0``) or the ``window``
    blocks ``k3[t : t + window]`` viewed as one ``[window * b, D]`` matrix (a band)."""

    period: int
    window: int
    blocked: Tensor  # (period, Mq, Mk) bool


def _keys(x3: Tensor, plan: _Plan, t0: int, t1: int) -> Tensor:
    """Keys (or values) of items t0..t1: ``[t1 - t0, Mk, C]``, a view."""
    if plan.window == 0:
        return x3[t0:t1]
    _, b, C = x3.shape
    return x3.as_strided(
        (t1 - t0, plan.window * b, C), (b * C, C, 1), x3.storage_offset() + t0 * b * C
    )


def _chunks(T: int, plan: _Plan) -> Iterator[tuple[int, int, int, int, Tensor]]:
    """(t0, t1, r0, r1, blocked) chunks of about CHUNK score slots: whole heads (``blocked`` is the
    plan's mask, broadcast over them) or a range of one head's items or rows (``blocked`` is its
    slice). The chunk's scores viewed as ``[-1, *blocked.shape]`` line up with ``blocked``."""
    P, Mq, Mk = plan.blocked.shape
    per_head = P * Mq * Mk
    if per_head <= CHUNK:  # whole heads at a time
        step = max(1, CHUNK // per_head) * P
        for t0 in range(0, T, step):
            yield t0, min(T, t0 + step), 0, Mq, plan.blocked
        return
    for h0 in range(0, T, P):
        for g0, g1, r0, r1 in _slices(P, Mq, Mk, CHUNK):
            yield h0 + g0, h0 + g1, r0, r1, plan.blocked[g0:g1, r0:r1]


def _scores(q3: Tensor, k3: Tensor, plan: _Plan, chunk, out: Tensor) -> Tensor:
    """Masked scores of one chunk written into ``out`` ``[t1 - t0, rows, Mk]`` (blocked slots
    at -inf)."""
    t0, t1, r0, r1, blocked = chunk
    torch.bmm(q3[t0:t1, r0:r1], _keys(k3, plan, t0, t1).transpose(1, 2), out=out)
    out.view(-1, *blocked.shape).masked_fill_(blocked, NEG_INF)
    return out


class _ChunkedAttention(torch.autograd.Function):
    """o = softmax(q k^T, blocked slots at -inf) v and lse = log sum exp(q k^T), per batch item,
    chunk by chunk. q3 ``[T, Mq, D]`` (already scaled), k3 ``[T(+window-1), Mk or b, D]``, v3
    likewise with Dv -> o3 ``[T, Mq, Dv]``, lse3 ``[T, Mq]``. Empty rows: o = 0, lse = -inf.

    Saves the unnormalised probabilities ``[T, Mq, Mk]`` (the one O(n * keys-per-query) tensor;
    recomputing them FlashAttention-style would save that memory for about 20 % more time and
    twice the number of kernel launches, which a shared CPU punishes) and 1 / (row sum).
    """

    @staticmethod
    def forward(ctx, q3: Tensor, k3: Tensor, v3: Tensor, plan: _Plan):
        T, Mq, _ = q3.shape
        Mk = plan.blocked.shape[-1]
        p3 = q3.new_empty(T, Mq, Mk)  # unnormalised probabilities
        o3 = q3.new_empty(T, Mq, v3.shape[-1])
        lse3 = q3.new_empty(T, Mq, 1)
        inv3 = q3.new_empty(T, Mq, 1)  # 1 / row sum (1 on empty rows)
        for chunk in _chunks(T, plan):
            t0, t1, r0, r1, _ = chunk
            p = _scores(q3, k3, plan, chunk, p3[t0:t1, r0:r1])  # (t, rows, Mk)
            m = p.amax(-1, keepdim=True).nan_to_num_(neginf=0.0)  # row max, 0 when empty
            p.sub_(m).exp_()  # 0 where blocked
            l = p.sum(-1, keepdim=True)  # >= 1 unless the row is empty  # noqa: E741
            lse3[t0:t1, r0:r1] = m + l.log()  # -inf on empty rows
            inv = inv3[t0:t1, r0:r1]
            torch.reciprocal(l.clamp_min_(1.0), out=inv)
            o3[t0:t1, r0:r1] = torch.bmm(p, _keys(v3, plan, t0, t1)).mul_(inv)
        ctx.save_for_backward(q3, k3, v3, o3, p3, inv3)
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        return o3, lse3.squeeze(-1)

    @staticmethod
    def backward(ctx, do3: Tensor | None, dlse3: Tensor | None):
        q3, k3, v3, o3, p3, inv3 = ctx.saved_tensors
        plan: _Plan = ctx.plan
        # With p = pu / l: d(score) = pu * (do/l . v_j - (do . o - dlse) / l), where do . o / l =
        # sum_j pu_j (do/l . v_j) / l is summed in each chunk (which holds whole rows) from the
        # very dp it is subtracted from: rowsum(do * o) is the same in exact arithmetic, but
        # leaves a saturated row (pu one-hot) with the rounding difference of two sums of the
        # same products instead of 0, which |q| ~ the scores multiplies into dk (issue 64).
        do3 = torch.zeros_like(o3) if do3 is None else do3 * inv3  # (T, Mq, Dv), do / l
        dq3 = torch.empty_like(q3)
        dk3 = torch.zeros_like(k3)
        dv3 = torch.zeros_like(v3)
        for chunk in _chunks(q3.shape[0], plan):
            t0, t1, r0, r1, _ = chunk
            p = p3[t0:t1, r0:r1]  # (t, rows, Mk)
            do = do3[t0:t1, r0:r1]  # (t, rows, Dv)
            kc, vc = _keys(k3, plan, t0, t1), _keys(v3, plan, t0, t1)
            dv = torch.bmm(p.transpose(1, 2), do)  # (t, Mk, Dv)
            ds = torch.bmm(do, vc.transpose(1, 2))  # (t, rows, Mk) dp
            inv = inv3[t0:t1, r0:r1]  # (t, rows, 1)
            delta = (ds * p).sum(-1, keepdim=True).mul_(inv)  # do/l . o = sum_j p_j dp_j
            if dlse3 is not None:
                delta -= dlse3[t0:t1, r0:r1].unsqueeze(-1) * inv
            ds.sub_(delta).mul_(p)
            dq3[t0:t1, r0:r1] = torch.bmm(ds, kc)
            dk = torch.bmm(ds.transpose(1, 2), q3[t0:t1, r0:r1])  # (t, Mk, D)
            _accumulate(dk3, dk, plan, t0, t1)
            _accumulate(dv3, dv, plan, t0, t1)
        return dq3, dk3, dv3, None


def _accumulate(dx3: Tensor, dx: Tensor, plan: _Plan, t0: int, t1: int) -> None:
    """Add the gradient of items t0..t1's keys ``[t, Mk, C]`` into ``dx3``; a band's window
    gradients fold back onto its blocks with one shifted add per block of the window."""
    if plan.window == 0:
        dx3[t0:t1] += dx
        return
    t, _, C = dx.shape
    b = dx3.shape[1]
    blocks = dx.view(t, plan.window, b, C)
    for offset in range(plan.window):
        dx3[t0 + offset : t1 + offset] += blocks[:, offset]


# --------------------------------------------------------------------------------------------
# Parts, merged
# --------------------------------------------------------------------------------------------


def _run_gathered(q: Tensor, k: Tensor, v: Tensor, part: Part, rule: Rule, scale: float):
    B, H, n, _ = q.shape
    qpos = part.queries.positions(q.device)  # (G, Mq)
    kpos = part.keys.positions(q.device)  # (G, Mk)
    if qpos.shape[0] != kpos.shape[0]:
        raise ValueError("a part's query and key layouts must have the same number of groups")
    G, Mq = qpos.shape
    plan = _Plan(G, 0, part_mask(qpos, kpos, rule, part.keep))

    def flat(x: Tensor, layout: Layout) -> Tensor:
        g = layout.gather(x)  # (B, H, G, M, C)
        return g.reshape(B * H * G, g.shape[-2], g.shape[-1])

    q3, k3, v3 = flat(q, part.queries) * scale, flat(k, part.keys), flat(v, part.keys)
    o3, lse3 = _ChunkedAttention.apply(q3, k3, v3, plan)
    o = part.queries.place(o3.view(B, H, G, Mq, -1), 0.0)  # (B, H, n, Dv)
    lse = part.queries.place(lse3.view(B, H, G, Mq, 1), NEG_INF).squeeze(-1)  # (B, H, n)
    return o, lse


def _run_band(q: Tensor, k: Tensor, v: Tensor, part: Part, rule: Rule, scale: float):
    """A band: every head's query blocks laid end to end (``nbp = nb + W - 1`` blocks per head,
    the last W - 1 of them padding), keys shifted by ``lo`` blocks, so that the band of item t is
    key blocks t .. t + W - 1: an overlapping view, nothing gathered."""
    band = part.keys
    if part.queries != Blocks(band.n, band.b):
        raise ValueError("a Band part needs Blocks queries of the same block size")
    B, H, n, _ = q.shape
    b, W, nb, lo = band.b, band.width, band.groups, band.lo
    nbp = nb + W - 1
    g = torch.arange(nbp, device=q.device)[:, None]
    qpos = g * b + torch.arange(b, device=q.device)[None, :]  # (nbp, b)
    qpos = torch.where(qpos < n, qpos, -1)
    kpos = torch.cat([band.positions(q.device), torch.full((W - 1, W * b), -1, device=q.device)])
    plan = _Plan(nbp, W, part_mask(qpos, kpos, rule, part.keep))

    def flat(x: Tensor, before: int, extra: int) -> Tensor:
        C = x.shape[-1]
        buf = x.new_zeros((B * H * nbp + extra) * b, C)
        heads = buf[: B * H * nbp * b].view(B * H, nbp * b, C)
        heads[:, before * b : before * b + n] = x.reshape(B * H, n, C)
        return buf.view(-1, b, C)  # (B*H*nbp + extra, b, C)

    q3 = flat(q, 0, 0).mul_(scale)
    o3, lse3 = _ChunkedAttention.apply(q3, flat(k, lo, W - 1), flat(v, lo, W - 1), plan)
    o = o3.view(B * H, nbp * b, -1)[:, :n].reshape(B, H, n, -1)  # (B, H, n, Dv)
    lse = lse3.view(B * H, nbp * b)[:, :n].reshape(B, H, n)
    return o, lse


def merge(results: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    """Combine parts' (o ``[B, H, n, Dv]``, lse ``[B, H, n]``) into one softmax over their union:
    o = sum_p exp(lse_p - L) o_p with L = log sum_p exp(lse_p); rows empty everywhere give 0."""
    if len(results) == 1:
        return results[0][0]
    return _Merge.apply(*(o for o, _ in results), *(lse for _, lse in results))


class _Merge(torch.autograd.Function):
    """:func:`merge`, weights relative to each row's largest log-sum-exp (the largest is 1) and
    renormalised by their sum. Its backward writes the gradient of lse_p as w_p (o_p - o) . do
    with o_p - o = sum_r w_r (o_p - o_r): differences of the parts' outputs before any product,
    so that a row whose weight is (nearly) all in one part gets (nearly) 0 to its own relative
    accuracy, where autograd's w_p (o_p . do - o . do) keeps the rounding difference of two sums
    (and o's rounding), which the part's backward then multiplies by |q| into dk (issue 64)."""

    @staticmethod
    def forward(ctx, *tensors: Tensor) -> Tensor:
        outs, lses = tensors[: len(tensors) // 2], torch.stack(tensors[len(tensors) // 2 :])
        top = lses.amax(0)
        top = torch.where(torch.isfinite(top), top, 0.0)  # (B, H, n)
        weights = torch.exp(lses - top)  # (P, B, H, n), the largest is 1 on non-empty rows
        total = weights.sum(0)  # (B, H, n), >= 1 on non-empty rows, 0 on empty ones
        weights = weights / torch.where(total > 0, total, 1.0)  # each row's shares, sum 1 or 0
        out = sum(w.unsqueeze(-1) * o for w, o in zip(weights, outs, strict=True))
        ctx.save_for_backward(weights, *outs)
        return out  # (B, H, n, Dv)

    @staticmethod
    def backward(ctx, dout: Tensor):
        weights, *outs = ctx.saved_tensors
        douts = [w.unsqueeze(-1) * dout for w in weights]
        dlses = []
        for w, o in zip(weights, outs, strict=True):
            pairs = zip(weights, outs, strict=True)
            apart = sum(u.unsqueeze(-1) * (o - other) for u, other in pairs)  # o - out
            dlses.append(w * (apart * dout).sum(-1))
        return (*douts, *dlses)


def attend_chunked(q: Tensor, k: Tensor, v: Tensor, parts: Sequence[Part], rule: Rule) -> Tensor:
    """Softmax attention restricted to ``rule`` over the union of ``parts``, chunk by chunk (the
    executor off the CPU; :func:`attnbench.variants.sparse.executor.attend` chooses).

    q, k ``[B, H, n, D]``, v ``[B, H, n, Dv]`` -> ``[B, H, n, Dv]``; scale 1/sqrt(D).
    """
    if not parts:
        raise ValueError("attend needs at least one part")
    scale = 1.0 / math.sqrt(q.shape[-1])
    results = []
    for part in parts:
        run = _run_band if isinstance(part.keys, Band) else _run_gathered
        results.append(run(q, k, v, part, rule, scale))
    return merge(results)
