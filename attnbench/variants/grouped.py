"""Multi-query and grouped-query attention: K/V shared across groups of query heads.

MQA (Shazeer, 2019) shares one K/V head among all query heads; GQA (Ainslie et al., 2023) shares
each of ``kv_heads`` K/V heads among ``heads / kv_heads`` consecutive query heads. FlashAttention-2
(Dao 2023) supports both. q is [B, H, T, D]; k and v are [B, Hkv, T, D].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from attnbench.core import sources
from attnbench.core.spec import Mechanism, PathSpec, Shape, positive_int
from attnbench.kernels.sdpa import backend_path, backend_paths
from attnbench.variants.dense import causal_mask, softmax_attention
from attnbench.variants.packed import masked_reference
from attnbench.variants.softmax_decode import cache_forms


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """K/V repeated per head, then dense softmax attention. q [B,H,T,D], k/v [B,Hkv,T,D]."""
    mask = causal_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    return softmax_attention(q, k, v, mask=mask)


def sdpa(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """SDPA with ``enable_gqa``: the kernels index the shared K/V head, no per-head copy."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


PATHS = (
    PathSpec("reference", "reference", reference, memory="O(n^2)", varlen=masked_reference),
    PathSpec(
        "efficient",
        "efficient",
        sdpa,
        memory="O(n) (SDPA flash kernel, K/V not copied)",
        note="SDPA enable_gqa=True",
    ),
    *backend_paths(
        lambda backend: backend_path(backend, enable_gqa=True),
        note="enable_gqa=True (a backend without native GQA says so)",
    ),
)


def _gqa_shape(shape: Shape, params: Mapping[str, Any]) -> Shape:
    return replace(shape, kv_heads=params["kv_heads"])


def _check_kv_heads(q: Tensor, k: Tensor, v: Tensor, params: Mapping[str, Any]) -> str | None:
    if k.shape[1] != params["kv_heads"]:
        return f"k has {k.shape[1]} heads but kv_heads={params['kv_heads']}; they must match"
    return None


MQA = Mechanism(
    name="mqa",
    family="softmax",
    description="multi-query attention: one K/V head shared by all query heads",
    sources=(sources.SHAZEER_2019, sources.DAO_2023),
    paths=PATHS,
    adapt_shape=lambda shape, params: replace(shape, kv_heads=1),
    check_inputs=lambda q, k, v, params: (
        None if k.shape[1] == 1 else f"mqa takes one K/V head, k has {k.shape[1]}"
    ),
    shares_kv=True,
    decode=cache_forms(shared_kv=True),
    memory="O(n^2) reference; K/V cache 1/H of softmax",
)

GQA = Mechanism(
    name="gqa",
    family="softmax",
    description="grouped-query attention: kv_heads K/V heads, each shared by heads/kv_heads",
    sources=(sources.AINSLIE_2023, sources.DAO_2023),
    params=(positive_int("kv_heads", 2, "number of K/V heads; must divide the query heads"),),
    paths=PATHS,
    adapt_shape=_gqa_shape,
    check_inputs=_check_kv_heads,
    shares_kv=True,
    decode=cache_forms(shared_kv=True),
    memory="O(n^2) reference; K/V cache kv_heads/H of softmax",
)
