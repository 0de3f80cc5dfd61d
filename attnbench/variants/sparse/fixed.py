"""The Sparse Transformer's fixed pattern (Child et al. 2019): query i sees key j when
floor(j / s) == floor(i / s) (its own block of s) or (j mod s) >= s - c (the last c positions of
every block, the "summary" columns).

Causal: j <= i as well, so a query sees the start of its block up to itself and the summary
columns of earlier blocks (the paper's autoregressive form). Every query sees itself.

Efficient path: two parts merged by log-sum-exp: each block of s against itself (a band of width
0), and every query against the summary columns outside its own block (gathered once: n c / s
keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnbench.core import sources
from attnbench.core.spec import positive_int
from attnbench.variants.sparse.common import masked_reference, rows
from attnbench.variants.sparse.decode import fixed_keys, gather_form
from attnbench.variants.sparse.engine import Band, Blocks, Full, Indexed, Part
from attnbench.variants.sparse.executor import attend
from attnbench.variants.sparse.record import sparse_mechanism


def visible(i: Tensor, j: Tensor, n: int, causal: bool, params: Mapping[str, Any]) -> Tensor:
    """floor(j/s) == floor(i/s) or (j mod s) >= s - c (and j <= i when causal), elementwise."""
    s, c = params["s"], params["c"]
    ok = (torch.div(i, s, rounding_mode="floor") == torch.div(j, s, rounding_mode="floor")) | (
        torch.remainder(j, s) >= s - c
    )
    return ok & (j <= i) if causal else ok


def pair_count(n: int, causal: bool, params: Mapping[str, Any]) -> int:
    s, c = params["s"], params["c"]
    i = rows(n)
    blk = i // s
    if causal:  # own block up to i, plus c summary columns in each earlier (full) block
        return int((i - blk * s + 1 + blk * c).sum())
    size = (n - blk * s).clamp_max(s)  # the length of i's block
    columns = (n // s) * c + max(0, n % s - (s - c))  # summary columns in [0, n)
    own = (size - (s - c)).clamp_min(0)  # summary columns inside i's block
    return int((size + columns - own).sum())


def check_params(params: Mapping[str, Any]) -> str | None:
    if params["c"] >= params["s"]:
        return f"invalid c={params['c']} for s={params['s']}; accepted: 1 <= c < s"
    return None


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, s: int, c: int) -> Tensor:
    """Dense scores with the pattern applied as -inf. q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    return masked_reference(visible, q, k, v, causal, {"s": s, "c": c})


def efficient(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, s: int, c: int) -> Tensor:
    """Own block + summary columns, merged by log-sum-exp. q, k, v: [B, H, T, D]."""
    n, params = q.shape[-2], {"s": s, "c": c}
    b = min(s, n)

    def same_block(i: Tensor, j: Tensor) -> Tensor:
        return torch.div(i, s, rounding_mode="floor") == torch.div(j, s, rounding_mode="floor")

    def other_block(i: Tensor, j: Tensor) -> Tensor:
        return ~same_block(i, j)

    parts = [Part(Blocks(n, b), Band(n, b, 0, 0), keep=same_block)]
    j = torch.arange(n, device=q.device)
    columns = j[(j % s >= s - c) & (n > s)]  # none outside the own block when n <= s
    if columns.numel():
        parts.append(Part(Full(n), Indexed(n, columns[None]), keep=other_block))
    rule = lambda i, j: visible(i, j, n, causal, params)  # noqa: E731
    return attend(q, k, v, parts, rule, key=("fixed", causal, s, c))


MECHANISM = sparse_mechanism(
    name="fixed",
    description="Sparse Transformer fixed: own block of s plus the last c of every block",
    sources=(sources.CHILD_2019,),
    params=(
        positive_int("s", 64, "block length (stride)"),
        positive_int("c", 8, "summary positions at the end of each block, 1 <= c < s"),
    ),
    check_params=check_params,
    visible=visible,
    pair_count=pair_count,
    reference=reference,
    efficient=efficient,
    efficient_memory="O(n * (s + n c / s))",
    efficient_note="block part + summary-column part, merged by log-sum-exp",
    flex_note="FlexAttention, own block ∪ summary columns as a BlockMask",
    time="O(n (s + n c/s) d)",
    memory="O(n (s + n c/s))",
    decode=(gather_form(fixed_keys),),
)
