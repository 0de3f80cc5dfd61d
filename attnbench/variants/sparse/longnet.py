"""LongNet's dilated attention (Ding et al. 2023).

``segments`` is a list of branches (w, r). Branch (w, r) cuts the sequence into segments of w
positions ([0, w), [w, 2w), ...; the last one shorter when w does not divide n, a segment longer
than n is the whole sequence) and keeps every r-th position of each segment, counted from the
segment's start: position p is in the branch when (p mod w) mod r == 0. Inside each segment the
kept positions attend densely to each other (causal: j <= i inside the segment).

The branches are combined weighted by their softmax denominators (the paper's rule, torchscale's
``scattering``): o_i = sum_b Z_b(i) o_b(i) / sum_b Z_b(i), with Z_b(i) = sum_{j in branch b}
exp(s_ij). That is exactly one softmax in which a pair (i, j) covered by m branches has weight m,
softmax_j(s_ij + log m_ij), so:

* a pair that several branches cover counts once per branch (as in torchscale): the reference
  repeats the keys once per branch and masks each copy with its branch's pattern;
* a query that a branch does not keep (p mod w not a multiple of r) gets nothing from that branch
  (its Z_b is 0), and a query that no branch keeps outputs zeros and passes zero gradient. Include
  an r = 1 branch (the default does) to cover every row.

Differences from torchscale, on purpose: the branch weights are differentiated (torchscale computes
them under ``torch.no_grad``, so its gradient is not the gradient of its output), and partial
segments hold only real positions (no zero-padded keys).

Heads: LongNet shifts the dilation offset per head group (group h keeps positions ≡ h mod r) so
that the heads together cover every position. attnbench uses offset 0 in every head, so the
pattern is one [n, n] matrix shared by all heads (what ``visible`` and ``pattern_matrix`` describe
and a FlexAttention mask_mod can use); the per-head shift is not implemented.

``pair_count`` is the number of distinct attended pairs (the pattern's size); ``flops`` counts the
work the definition does, i.e. each branch's pairs (with multiplicity).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from attnbench.core import sources
from attnbench.core.spec import Param, Shape
from attnbench.kernels.flex import ScoreMod
from attnbench.variants.dense import softmax_attention
from attnbench.variants.sparse.decode import gather_form
from attnbench.variants.sparse.engine import Dilated, Part
from attnbench.variants.sparse.executor import attend
from attnbench.variants.sparse.record import sparse_mechanism

Segments = tuple[tuple[int, int], ...]
DEFAULT: Segments = ((256, 1), (512, 2), (1024, 4), (2048, 8))
ACCEPTED = "a non-empty list of w:r pairs of integers >= 1, e.g. 256:1,512:2,1024:4"


def format_segments(segments: Segments) -> str:
    """((256, 1), (512, 2)) -> ``"256:1,512:2"`` (what parse_segments reads)."""
    return ",".join(f"{w}:{r}" for w, r in segments)


def parse_segments(text: str) -> Segments:
    """``"256:1,512:2"`` -> ((256, 1), (512, 2)); raises ValueError on anything else."""
    pairs = []
    for item in text.split(","):
        w, sep, r = item.strip().partition(":")
        if not sep:
            raise ValueError(text)
        pairs.append((int(w), int(r)))
    return tuple(pairs)


def normalize(segments: Any) -> Segments:
    """A sequence of (w, r) pairs as a tuple of int pairs; raises ValueError/TypeError."""
    if isinstance(segments, str):
        return parse_segments(segments)
    out = []
    for pair in segments:
        w, r = pair
        if isinstance(w, bool) or isinstance(r, bool) or int(w) != w or int(r) != r:
            raise ValueError(pair)
        out.append((int(w), int(r)))
    return tuple(out)


def valid_segments(segments: Any) -> bool:
    try:
        segs = normalize(segments)
    except (TypeError, ValueError):
        return False
    return len(segs) > 0 and all(w >= 1 and r >= 1 for w, r in segs)


def _branch(i: Tensor, j: Tensor, w: int, r: int, causal: bool) -> Tensor:
    """Whether branch (w, r) covers the pair (i, j), elementwise."""
    ok = (
        (torch.div(i, w, rounding_mode="floor") == torch.div(j, w, rounding_mode="floor"))
        & (torch.remainder(torch.remainder(i, w), r) == 0)
        & (torch.remainder(torch.remainder(j, w), r) == 0)
    )
    return ok & (j <= i) if causal else ok


def multiplicity(i: Tensor, j: Tensor, n: int, causal: bool, params: Mapping[str, Any]) -> Tensor:
    """How many branches cover (i, j), elementwise (int)."""
    total = torch.zeros((), dtype=torch.int64, device=i.device)
    for w, r in normalize(params["segments"]):
        total = total + _branch(i, j, w, r, causal).long()
    return total


def visible(i: Tensor, j: Tensor, n: int, causal: bool, params: Mapping[str, Any]) -> Tensor:
    """At least one branch covers (i, j), elementwise."""
    ok = torch.zeros((), dtype=torch.bool, device=i.device)
    for w, r in normalize(params["segments"]):
        ok = ok | _branch(i, j, w, r, causal)
    return ok


def _branch_keys(n: int, w: int, r: int, segment: int) -> Tensor:
    start = segment * w
    return torch.arange(start, min(start + w, n), r)


def pair_count(n: int, causal: bool, params: Mapping[str, Any]) -> int:
    """Distinct attended pairs. Rows are grouped by which segment of each branch keeps them (the
    rows of a group share one key set); cost O(n log n + groups * keys-per-query), no n x n."""
    segs = normalize(params["segments"])
    if n == 0:
        return 0
    i = torch.arange(n)
    signature = torch.stack(
        [torch.where((i % w) % r == 0, i // w, -1) for w, r in segs], dim=1
    )  # (n, branches): the segment that keeps row i, -1 if none
    groups, inverse = torch.unique(signature, dim=0, return_inverse=True)
    order = torch.argsort(inverse, stable=True)
    sizes = torch.bincount(inverse, minlength=len(groups)).tolist()
    total = 0
    for group, members in zip(groups.tolist(), torch.split(i[order], sizes), strict=True):
        parts = [
            _branch_keys(n, w, r, seg) for (w, r), seg in zip(segs, group, strict=True) if seg >= 0
        ]
        if not parts:
            continue
        keys = torch.unique(torch.cat(parts))  # sorted
        if causal:
            total += int(torch.searchsorted(keys, members, right=True).sum())
        else:
            total += len(keys) * len(members)
    return total


def branch_pairs(n: int, causal: bool, segments: Sequence[tuple[int, int]]) -> int:
    """Pairs summed over branches (a pair covered by m branches counts m times)."""
    total = 0
    for w, r in segments:
        for start in range(0, n, w):
            m = len(range(0, min(w, n - start), r))
            total += m * (m + 1) // 2 if causal else m * m
    return total


def flops(shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
    pairs = branch_pairs(shape.seq_len, causal, normalize(params["segments"]))
    return 2 * shape.batch * shape.heads * pairs * (shape.head_dim + shape.dv)


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, segments: Any) -> Tensor:
    """One dense softmax over every (branch, key) pair: the keys repeated once per branch, each
    copy masked with its branch's pattern. q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    segs = normalize(segments)
    idx = torch.arange(q.shape[-2], device=q.device)
    mask = torch.cat([_branch(idx[:, None], idx[None, :], w, r, causal) for w, r in segs], dim=1)
    keys = torch.cat([k] * len(segs), dim=-2)  # (B, H, branches * T, D)
    values = torch.cat([v] * len(segs), dim=-2)  # (B, H, branches * T, Dv)
    return softmax_attention(q, keys, values, mask=mask)  # mask (T, branches * T)


def dilated(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, segments: Any) -> Tensor:
    """Each branch as dense attention inside its dilated segments (strided views), merged by
    log-sum-exp. q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    n = q.shape[-2]
    parts = []
    for w, r in normalize(segments):
        layout = Dilated(n, w, r)
        parts.append(Part(layout, layout, keep=lambda i, j, w=w, r=r: _branch(i, j, w, r, causal)))
    every = lambda i, j: torch.ones((), dtype=torch.bool, device=i.device)  # noqa: E731
    return attend(q, k, v, parts, every, key=("longnet", causal, tuple(normalize(segments))))


def log_multiplicity(n: int, causal: bool, params: Mapping[str, Any]) -> ScoreMod:
    """FlexAttention score_mod adding log m_ij, m_ij = the branches covering (i, j): with
    ``visible`` as the mask, softmax_j(s_ij + log m_ij) is the reference's one softmax over every
    (branch, key) copy. flex applies 1/sqrt(d) before the score_mod, as the reference does before
    its softmax. Pairs no branch covers are masked; clamping m to 1 keeps log finite there."""

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        m = multiplicity(q_idx, kv_idx, n, causal, params)  # branches covering the pair
        return score + torch.log(m.clamp(min=1).to(score.dtype))

    return score_mod


def longnet_keys(pos: Tensor, params: Mapping[str, Any]) -> Tensor:
    """For each branch (w, r) keeping i, the kept keys of i's segment up to i; a key of several
    branches listed once per branch (its weight in the mechanism)."""
    parts = []
    for w, r in normalize(params["segments"]):
        start = (pos // w) * w
        keeps = (pos % w) % r == 0
        idx = start[:, None] + r * torch.arange(math.ceil(w / r), device=pos.device)[None, :]
        parts.append(torch.where(keeps[:, None] & (idx <= pos[:, None]), idx, -1))
    return torch.cat(parts, dim=1)


MECHANISM = sparse_mechanism(
    name="longnet",
    description="LongNet dilated attention: (segment w, dilation r) branches, lse-weighted",
    sources=(sources.DING_2023,),
    params=(
        Param(
            "segments",
            DEFAULT,
            "branches as w:r (segment length : dilation), e.g. 256:1,512:2",
            accepted=ACCEPTED,
            valid=valid_segments,
            parse=parse_segments,
            show=format_segments,
        ),
    ),
    visible=visible,
    pair_count=pair_count,
    reference=reference,
    reference_memory="O(branches * n^2)",
    efficient=dilated,
    efficient_memory="O(n * sum(w / r^2))",
    efficient_note="per branch: dense inside dilated segments (views); branches lse-merged",
    score_mod=log_multiplicity,
    flex_note="FlexAttention, union mask + log-multiplicity bias",
    flops=flops,
    time="O(n sum(w/r^2) d)",
    memory="O(n sum(w/r^2))",
    decode=(gather_form(longnet_keys),),
)
