"""Attention-O: softmax(Q K^T / sqrt(d)) V (Vaswani et al., 2017; Su 2021's baseline)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from attnbench import sources
from attnbench.kernels.sdpa import backend_path, backend_paths
from attnbench.spec import Mechanism, PathSpec
from attnbench.variants.dense import causal_mask, softmax_attention


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """Dense matmul + softmax over the full [B, H, T, T] scores. q, k, v: [B, H, T, D]."""
    mask = causal_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    return softmax_attention(q, k, v, mask=mask)


def sdpa(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """torch's scaled_dot_product_attention, backend left to torch. q, k, v: [B, H, T, D]."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


MECHANISM = Mechanism(
    name="softmax",
    family="softmax",
    description="Attention-O: softmax(QK^T/sqrt(d))V, the standard dense attention",
    sources=(sources.VASWANI_2017, sources.SU_2021_ENTROPY),
    aliases=("attention-o",),
    paths=(
        PathSpec("reference", "reference", reference, memory="O(n^2)"),
        PathSpec(
            "efficient",
            "efficient",
            sdpa,
            memory="O(n) (SDPA flash kernel)",
            note="torch SDPA; torch picks the backend",
        ),
        *backend_paths(backend_path),
    ),
)
