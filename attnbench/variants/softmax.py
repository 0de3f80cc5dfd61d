"""Attention-O: softmax(Q K^T / sqrt(d)) V (Vaswani et al., 2017; Su 2021's baseline)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from attnbench.core import sources
from attnbench.core.capabilities import CUDA, FLA_CORE, SAGEATTENTION, XFORMERS
from attnbench.core.spec import Mechanism, PathSpec
from attnbench.kernels.sdpa import backend_path, backend_paths
from attnbench.kernels.triton_ops import REQUIRES
from attnbench.libraries import fla_varlen
from attnbench.libraries.fla import softmax_attention as fla_softmax
from attnbench.libraries.sage import sage_attention
from attnbench.libraries.xformers import memory_efficient
from attnbench.variants.dense import causal_mask, softmax_attention
from attnbench.variants.packed import masked_reference
from attnbench.variants.softmax_decode import cache_forms


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """Dense matmul + softmax over the full [B, H, T, T] scores. q, k, v: [B, H, T, D]."""
    mask = causal_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    return softmax_attention(q, k, v, mask=mask)


def sdpa(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """torch's scaled_dot_product_attention, backend left to torch. q, k, v: [B, H, T, D]."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


#: SageAttention's own bound: the largest output error against the float64 oracle, relative to
#: the oracle's largest magnitude, on the N(0, 1) inputs of ``check`` and the GPU tests. 8-bit
#: Q and K carry about 2^-8 relative error each into the scores; float16 P V adds 2^-11.
SAGE_TOLERANCE = 0.03


MECHANISM = Mechanism(
    name="softmax",
    family="softmax",
    description="Attention-O: softmax(QK^T/sqrt(d))V, the standard dense attention",
    sources=(sources.VASWANI_2017, sources.SU_2021_ENTROPY),
    aliases=("attention-o",),
    paths=(
        PathSpec("reference", "reference", reference, memory="O(n^2)", varlen=masked_reference),
        PathSpec(
            "efficient",
            "efficient",
            sdpa,
            memory="O(n) (SDPA flash kernel)",
            note="torch SDPA; torch picks the backend",
        ),
        *backend_paths(backend_path),
        PathSpec(
            "fla-parallel",
            "fused",
            fla_softmax,  # softmax passes no window: full causal attention
            memory="O(n)",
            requires=(*REQUIRES, FLA_CORE),
            note="FLA's parallel_attn Triton kernel (fla-core); causal only",
            varlen=fla_varlen.softmax,
        ),
        PathSpec(
            "xformers",
            "fused",
            memory_efficient,  # no window: causal or full attention
            memory="O(n)",
            requires=(CUDA, XFORMERS),
            note="xFormers' memory_efficient_attention (its dispatcher picks the kernel)",
        ),
        PathSpec(
            "sage",
            "fused",
            sage_attention,
            memory="O(n)",
            requires=(*REQUIRES, SAGEATTENTION),
            note="SageAttention 1: int8 Q K^T, fp16 P V; approximate, forward only",
            backward=False,
            tolerance=SAGE_TOLERANCE,
        ),
    ),
    decode=cache_forms(),
)
