"""OpenAI's sparse self-attention as Su 2019 presents it: the union of local and atrous
attention, "dense nearby, sparse far away": query i sees key j when |i - j| <= window or
(i - j) is a multiple of r.

Su 2019 uses one k for both (window = r = k); attnbench exposes both and defaults them equal.
Causal: j <= i as well. Every query sees itself, so no row is ever empty.

Efficient path: two parts merged exactly by their log-sum-exp (see the engine): the blocked band
(as in ``local``) and dense attention inside residue classes mod r (as in ``atrous``) restricted to
|i - j| > window, so no pair is counted twice. The residue part is skipped when the band already
holds every pair (n - 1 <= window).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnbench.core import sources
from attnbench.core.spec import positive_int
from attnbench.variants.sparse.common import band_and_residue_count, band_block, masked_reference
from attnbench.variants.sparse.decode import gather_form, sparse_keys
from attnbench.variants.sparse.engine import Band, Blocks, Part, Residue, ceil_div
from attnbench.variants.sparse.executor import attend
from attnbench.variants.sparse.record import sparse_mechanism


def visible(i: Tensor, j: Tensor, n: int, causal: bool, params: Mapping[str, Any]) -> Tensor:
    """|i - j| <= window or (i - j) mod r == 0 (and j <= i when causal), elementwise."""
    d = i - j
    ok = (d.abs() <= params["window"]) | (torch.remainder(d, params["r"]) == 0)
    return ok & (d >= 0) if causal else ok


def pair_count(n: int, causal: bool, params: Mapping[str, Any]) -> int:
    return band_and_residue_count(n, causal, params["window"], params["r"])


def band_plus_residue(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, reach: int, r: int, rule, key: tuple
) -> Tensor:
    """The engine plan shared by ``sparse`` and ``strided``: the band |i - j| <= reach, plus the
    residue classes mod r beyond it (``key``: the pattern's name and parameters, for the mask
    cache). q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    n = q.shape[-2]
    b = band_block(n, reach, q.device)
    in_band = lambda i, j: (i - j).abs() <= reach  # noqa: E731
    blocks = ceil_div(reach, b)
    parts = [Part(Blocks(n, b), Band(n, b, blocks, 0 if causal else blocks), keep=in_band)]
    if n - 1 > reach:
        classes = Residue(n, r)
        parts.append(Part(classes, classes, keep=lambda i, j: (i - j).abs() > reach))
    return attend(q, k, v, parts, rule, key=(*key, causal))


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, window: int, r: int) -> Tensor:
    """Dense scores with the pattern applied as -inf. q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    return masked_reference(visible, q, k, v, causal, {"window": window, "r": r})


def efficient(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, window: int, r: int) -> Tensor:
    """Band plus residue classes, merged by log-sum-exp. q, k, v: [B, H, T, D]."""
    n, params = q.shape[-2], {"window": window, "r": r}
    rule = lambda i, j: visible(i, j, n, causal, params)  # noqa: E731
    return band_plus_residue(q, k, v, causal, window, r, rule, ("sparse", window, r))


MECHANISM = sparse_mechanism(
    name="sparse",
    description="OpenAI sparse attention (Su 2019): local within `window` ∪ atrous every r",
    sources=(sources.SU_2019_SPARSE, sources.CHILD_2019),
    params=(
        positive_int("window", 64, "keys on each side seen densely (Su 2019's k)"),
        positive_int("r", 64, "beyond the window, keys every r positions (Su 2019's k)"),
    ),
    visible=visible,
    pair_count=pair_count,
    reference=reference,
    efficient=efficient,
    efficient_memory="O(n * (window + n / r))",
    efficient_note="band part + residue-class part, merged by log-sum-exp",
    flex_note="FlexAttention, band ∪ residue rule as a cached BlockMask",
    time="O(n (w + n/r) d)",
    memory="O(n (w + n/r))",
    decode=(gather_form(sparse_keys),),
)
