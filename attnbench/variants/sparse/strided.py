"""The Sparse Transformer's strided pattern (Child et al. 2019): query i sees key j
when |i - j| < s or (i - j) mod s == 0. With s ~ sqrt(n) the cost is O(n sqrt(n) d).

Causal: j <= i as well (the paper's autoregressive form). Every query sees itself.

Efficient path: the same plan as ``sparse`` with a band of s - 1 keys per side and residue classes
mod s beyond it (there the only overlap with the band is the diagonal).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnbench.core import sources
from attnbench.core.spec import positive_int
from attnbench.variants.sparse.common import band_and_residue_count, masked_reference
from attnbench.variants.sparse.decode import gather_form, strided_keys
from attnbench.variants.sparse.openai_sparse import band_plus_residue
from attnbench.variants.sparse.record import sparse_mechanism


def visible(i: Tensor, j: Tensor, n: int, causal: bool, params: Mapping[str, Any]) -> Tensor:
    """|i - j| < s or (i - j) mod s == 0 (and j <= i when causal), elementwise."""
    s = params["s"]
    d = i - j
    ok = (d.abs() < s) | (torch.remainder(d, s) == 0)
    return ok & (d >= 0) if causal else ok


def pair_count(n: int, causal: bool, params: Mapping[str, Any]) -> int:
    s = params["s"]
    return band_and_residue_count(n, causal, s - 1, s)


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, s: int) -> Tensor:
    """Dense scores with the pattern applied as -inf. q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    return masked_reference(visible, q, k, v, causal, {"s": s})


def efficient(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, s: int) -> Tensor:
    """Band of s - 1 plus residue classes mod s, merged by log-sum-exp. q, k, v: [B, H, T, D]."""
    n, params = q.shape[-2], {"s": s}
    rule = lambda i, j: visible(i, j, n, causal, params)  # noqa: E731
    return band_plus_residue(q, k, v, causal, s - 1, s, rule, ("strided", s))


MECHANISM = sparse_mechanism(
    name="strided",
    description="Sparse Transformer strided: i sees j if |i-j| < s or (i-j) mod s = 0",
    sources=(sources.CHILD_2019,),
    params=(positive_int("s", 64, "stride, ~sqrt(n) in the paper"),),
    visible=visible,
    pair_count=pair_count,
    reference=reference,
    efficient=efficient,
    efficient_memory="O(n * (s + n / s))",
    efficient_note="band part + residue-class part, merged by log-sum-exp",
    flex_note="FlexAttention, band ∪ residue rule as a cached BlockMask",
    time="O(n (s + n/s) d)",
    memory="O(n (s + n/s))",
    decode=(gather_form(strided_keys),),
)
