"""Atrous (dilated) self-attention: query i sees key j only when (i - j) is a multiple of r
(Su 2019, "Atrous Self Attention"; cost n^2 / r).

Causal: j <= i as well. Every query sees itself (i - i = 0), so no row is ever empty.

The efficient path permutes positions into their residue classes mod r (a view: the sequence as
``[n / r, r]`` transposed) and attends densely inside each class: r blocks of (n / r)^2 scores,
n^2 / r in all, which is n * keys-per-query. Unlike bert4keras's atrous attention, nothing is
padded when r divides n, and r >= n is simply the diagonal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnbench.core import sources
from attnbench.core.spec import positive_int
from attnbench.variants.sparse.common import masked_reference, residue_count
from attnbench.variants.sparse.decode import atrous_keys, gather_form
from attnbench.variants.sparse.engine import Part, Residue
from attnbench.variants.sparse.executor import attend
from attnbench.variants.sparse.record import sparse_mechanism


def visible(i: Tensor, j: Tensor, n: int, causal: bool, params: Mapping[str, Any]) -> Tensor:
    """(i - j) mod r == 0 (and j <= i when causal), elementwise."""
    d = i - j
    ok = torch.remainder(d, params["r"]) == 0
    return ok & (d >= 0) if causal else ok


def pair_count(n: int, causal: bool, params: Mapping[str, Any]) -> int:
    return int(residue_count(n, causal, params["r"]).sum())


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, r: int) -> Tensor:
    """Dense scores with the dilation applied as -inf. q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    return masked_reference(visible, q, k, v, causal, {"r": r})


def by_residue(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, r: int) -> Tensor:
    """Dense attention inside each residue class mod r. q, k, v: [B, H, T, D]."""
    n = q.shape[-2]
    classes = Residue(n, r)
    params = {"r": r}
    rule = lambda i, j: visible(i, j, n, causal, params)  # noqa: E731
    return attend(q, k, v, [Part(classes, classes)], rule, key=("atrous", causal, r))


MECHANISM = sparse_mechanism(
    name="atrous",
    description="Atrous (dilated) attention: query i sees key j when i - j is a multiple of r",
    sources=(sources.SU_2019_SPARSE, sources.CHILD_2019),
    params=(positive_int("r", 8, "dilation rate: keys every r positions (Su 2019's k)"),),
    visible=visible,
    pair_count=pair_count,
    reference=reference,
    efficient=by_residue,
    efficient_memory="O(n^2 / r)",
    efficient_note="dense attention within residue classes mod r (a transposed view)",
    flex_note="FlexAttention; r < 256 leaves no 128-block empty: dense work",
    time="O(n^2 d / r)",
    memory="O(n^2 / r)",
    decode=(gather_form(atrous_keys),),
)
