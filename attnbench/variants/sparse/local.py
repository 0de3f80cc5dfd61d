"""Local self-attention: query i sees key j when |i - j| <= window (Su 2019, "Local Self
Attention", where the window is called k; Beltagy et al. 2020's sliding window).

Causal: only backwards, 0 <= i - j <= window. Every query sees itself, so no row is ever empty.

The efficient path splits queries into blocks of b and gives block g the key blocks
g - ceil(window / b) .. g + ceil(window / b), read in place as overlapping strided views of K and
V, then masks the pairs outside the band: about 2 * window + b keys per query instead of n.

The parameter is called ``window``, not ``k`` as in Su 2019, because ``k`` is the key tensor in
every path's signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from attnbench.core import sources
from attnbench.core.capabilities import CUDA, FLA_CORE, LOCAL_ATTENTION, XFORMERS
from attnbench.core.spec import PathSpec, positive_int
from attnbench.kernels.triton_ops import REQUIRES
from attnbench.libraries import fla_varlen
from attnbench.libraries.fla import softmax_attention as fla_softmax
from attnbench.libraries.local_attention import local_attention
from attnbench.libraries.xformers import memory_efficient
from attnbench.variants.sparse.common import band_block, masked_reference, window_count
from attnbench.variants.sparse.decode import gather_form, local_keys
from attnbench.variants.sparse.engine import Band, Blocks, Part, ceil_div
from attnbench.variants.sparse.executor import attend
from attnbench.variants.sparse.record import sparse_mechanism


def visible(i: Tensor, j: Tensor, n: int, causal: bool, params: Mapping[str, Any]) -> Tensor:
    """|i - j| <= window (and j <= i when causal), elementwise."""
    d = i - j
    ok = d.abs() <= params["window"]
    return ok & (d >= 0) if causal else ok


def pair_count(n: int, causal: bool, params: Mapping[str, Any]) -> int:
    w = params["window"]
    return int(window_count(n, causal, w, w).sum())


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, window: int) -> Tensor:
    """Dense scores with the band applied as -inf. q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    return masked_reference(visible, q, k, v, causal, {"window": window})


def banded(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, window: int) -> Tensor:
    """Blocked band: each query block against its window of keys. q, k, v: [B, H, T, D]."""
    n = q.shape[-2]
    b = band_block(n, window, q.device)
    reach = ceil_div(window, b)  # in blocks
    part = Part(Blocks(n, b), Band(n, b, reach, 0 if causal else reach))
    params = {"window": window}
    rule = lambda i, j: visible(i, j, n, causal, params)  # noqa: E731
    return attend(q, k, v, [part], rule, key=("local", causal, window))


MECHANISM = sparse_mechanism(
    name="local",
    description="Local attention: each query sees the keys within `window` positions",
    sources=(sources.SU_2019_SPARSE, sources.BELTAGY_2020),
    params=(
        positive_int("window", 64, "keys on each side (only behind when causal); Su 2019's k"),
    ),
    visible=visible,
    pair_count=pair_count,
    reference=reference,
    efficient=banded,
    efficient_memory="O(n * window)",
    efficient_note="query blocks against strided key-block windows; CPU: fused flash kernel",
    flex_note="FlexAttention, window rule as a cached BlockMask",
    time="O(n w d)",
    memory="O(n w)",
    more_paths=(
        PathSpec(
            "local-attention",
            "efficient",
            local_attention,
            memory="O(n * window)",
            requires=(LOCAL_ATTENTION,),
            note="lucidrains' local-attention package: blocks of `window`, exact band mask",
        ),
        PathSpec(
            "fla-parallel",
            "fused",
            fla_softmax,
            memory="O(n * window)",
            requires=(*REQUIRES, FLA_CORE),
            note="FLA's parallel_attn with window_size = window + 1 (fla-core); causal only",
            varlen=fla_varlen.local,
        ),
        PathSpec(
            "xformers",
            "fused",
            memory_efficient,
            memory="O(n * window)",
            requires=(CUDA, XFORMERS),
            note="xFormers' memory_efficient_attention, LocalAttentionFromBottomRightMask",
        ),
    ),
    decode=(gather_form(local_keys),),
)
