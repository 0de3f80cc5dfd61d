"""Attention-E: softmax(log_b(n) / sqrt(d) * Q K^T) V, entropy-invariant scaling (Su 2021).

n is the number of keys a query really attends to: the sequence length when bidirectional, i + 1
for the i-th query when causal, so the factor is per row. Keeping the entropy of each attention
row roughly constant in n gives lambda = kappa * log(n) / d; kappa is chosen so that n = b (512)
gives back 1/sqrt(d).

Variants, all reachable through parameters:

* ``base``: b, 512 by default; ``e`` (natural log, Chiang & Cholak 2022: log(n)/sqrt(d)); a
  training length L gives log_L n.
* ``clip``: max(1, log_b n), for using a model beyond the length it was trained at.
* ``min_n``: a floor on n before the log (bert4keras uses 16).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.core import sources
from attnbench.core.spec import Mechanism, Param, PathSpec
from attnbench.kernels.flex import ScoreMod, flex_fused
from attnbench.kernels.sdpa import backend_paths, sdpa_with_backend
from attnbench.variants.dense import causal_mask, keys_seen, softmax_attention
from attnbench.variants.softmax_decode import cache_forms, logn_scale


def parse_base(text: str) -> float:
    """Command-line text for a log base: a number, or ``e`` for the natural log."""
    return math.e if text.strip().lower() == "e" else float(text)


def logn_factor(n: Tensor, *, base: float, clip: bool = False, min_n: int = 1) -> Tensor:
    """log_base(max(n, min_n)), clipped below at 1 when ``clip``. Computed in float64."""
    f = torch.log(n.clamp(min=min_n)) / math.log(base)
    return f.clamp(min=1.0) if clip else f


def row_scale(q: Tensor, k: Tensor, causal: bool, base: float, clip: bool, min_n: int) -> Tensor:
    """The per-row score scale log_b(n_i) / sqrt(d) as a [Tq, 1] tensor in q's dtype."""
    n = keys_seen(q.shape[-2], k.shape[-2], causal, q.device)
    factor = logn_factor(n, base=base, clip=clip, min_n=min_n) / math.sqrt(q.shape[-1])
    return factor.to(q.dtype)


def reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, base: float, clip: bool, min_n: int
) -> Tensor:
    """Dense scores times the per-row factor, then softmax. q, k, v: [B, H, T, D]."""
    mask = causal_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    return softmax_attention(q, k, v, mask=mask, scale=row_scale(q, k, causal, base, clip, min_n))


def sdpa(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, base: float, clip: bool, min_n: int
) -> Tensor:
    """The per-row factor folded into q, then SDPA with scale 1. q, k, v: [B, H, T, D]."""
    q = q * row_scale(q, k, causal, base, clip, min_n)  # (B, H, T, D), row i scaled
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0)


def sdpa_backend(backend: str):
    """A path pinned to one SDPA backend: the per-row factor folded into q, scale 1."""

    def fn(
        q: Tensor, k: Tensor, v: Tensor, *, causal: bool, base: float, clip: bool, min_n: int
    ) -> Tensor:
        q = q * row_scale(q, k, causal, base, clip, min_n)  # (B, H, T, D), row i scaled
        return sdpa_with_backend(backend, q, k, v, causal=causal, scale=1.0)

    fn.__name__ = fn.__qualname__ = f"sdpa_{backend}"
    return fn


def logn_score_mod(n: int, causal: bool, params) -> ScoreMod:
    """FlexAttention score_mod multiplying row i's scaled scores by log_b(n_i) (n_i = i + 1 when
    causal, n otherwise; floored at min_n, clipped at 1 when ``clip``). The 1/sqrt(d) is flex's
    own scale, so together: log_b(n_i) / sqrt(d) * q.k, as in :func:`reference`."""
    log_base = math.log(params["base"])
    clip, min_n = params["clip"], params["min_n"]

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        keys = q_idx + 1 if causal else q_idx * 0 + n  # keys row q_idx sees
        factor = torch.log(keys.clamp(min=min_n).to(score.dtype)) / log_base
        if clip:
            factor = factor.clamp(min=1.0)
        return score * factor

    return score_mod


PARAMS = (
    Param(
        "base",
        512.0,
        "log base b: 512 (Su 2021), e (natural log), or a training length L",
        accepted="a number > 1, or e",
        valid=lambda b: b > 1,
        parse=parse_base,
    ),
    Param("clip", False, "use max(1, log_b n) so short inputs are never flattened"),
    Param(
        "min_n",
        1,
        "floor on n before the log (bert4keras: 16)",
        accepted="an integer >= 1",
        valid=lambda x: x >= 1,
    ),
)


MECHANISM = Mechanism(
    name="softmax-logn",
    family="softmax",
    description="Attention-E: softmax(log_b(n)/sqrt(d) QK^T)V, n = keys each query sees",
    sources=(sources.SU_2021_ENTROPY, sources.CHIANG_CHOLAK_2022),
    aliases=("attention-e",),
    params=PARAMS,
    paths=(
        PathSpec("reference", "reference", reference, memory="O(n^2)"),
        PathSpec(
            "efficient",
            "efficient",
            sdpa,
            memory="O(n) (SDPA flash kernel)",
            note="per-row factor folded into q, SDPA with scale=1",
        ),
        *backend_paths(sdpa_backend, note="per-row factor folded into q"),
        flex_fused(score_mod=logn_score_mod, note="FlexAttention with a log-n score_mod"),
    ),
    decode=cache_forms(logn_scale),
)
