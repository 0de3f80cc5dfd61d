"""Causal linear attention with the feature map and the normaliser inside the Triton chunk
kernels (:mod:`attnbench.kernels.triton_linear_causal`), as a checked autograd function; Triton
is imported only when a kernel runs. On a CPU it runs only under Triton's interpreter
(``TRITON_INTERPRET=1``), as the tests do."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError
from attnbench.kernels.triton_ops import (
    LINEAR_FEATURE_MAPS,
    MAX_HEAD_DIM,
    _check_block,
    _last_dim_contiguous,
    check_call,
)


class _LinearCausal(torch.autograd.Function):
    """Keeps q, k, v, the output (for delta = do . o), the float32 chunk states h, z and the
    rows' 1 / den for the backward; the backward recomputes phi from q and k in registers."""

    @staticmethod
    def forward(ctx, q, k, v, feature_map, normalize, eps, block):
        from attnbench.kernels import triton_linear_causal

        o, h, z, r = triton_linear_causal.forward(q, k, v, feature_map, normalize, eps, block)
        ctx.save_for_backward(q, k, v, o if normalize else None, h, z, r)
        ctx.args = (feature_map, normalize, block)
        return o

    @staticmethod
    def backward(ctx, do):
        from attnbench.kernels import triton_linear_causal

        q, k, v, o, h, z, r = ctx.saved_tensors
        feature_map, normalize, block = ctx.args
        do = _last_dim_contiguous(do)
        dq, dk, dv = triton_linear_causal.backward(
            q, k, v, o, do, h, z, r, feature_map, normalize, block
        )
        return dq, dk, dv, None, None, None, None


def linear_attention_causal(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str = "elu+1",
    normalize: bool = True,
    eps: float = 1e-6,
    block: int | None = None,
) -> Tensor:
    """Causal linear attention (Katharopoulos et al. 2020) with phi, the normaliser and eps
    fused into the chunk kernels, forward and backward:

        o_t = sum_{s<=t} (phi(q_t) . phi(k_s)) v_s / (sum_{s<=t} phi(q_t) . phi(k_s) + eps)

    (the numerator alone when not ``normalize``). phi (``feature_map``: "elu+1", "relu",
    "identity") in float32 in registers, rounded to the input dtype for the dots. q, k ``[B, H,
    T, D]``, v ``[B, H, T, Dv]`` (D, Dv <= 128) -> ``[B, H, T, Dv]`` in q's dtype. A float16
    result past 65504 (the bare sum) comes back as inf: callers refuse it. ``block``: positions
    a tile (a power of two >= 16; default 64; tests use 16)."""
    check_call("causal linear attention", q, k, v, max_v=MAX_HEAD_DIM)
    if feature_map not in LINEAR_FEATURE_MAPS:
        ok = ", ".join(LINEAR_FEATURE_MAPS)
        raise AttnbenchError(f"invalid feature_map={feature_map!r}; accepted: {ok}")
    if not (math.isfinite(eps) and eps >= 0):
        raise AttnbenchError(f"causal linear attention: eps={eps}; accepted: a number >= 0")
    _check_block("causal linear attention", block)
    if q.shape[-2] == 0:  # nothing to launch; an empty result still in the autograd graph
        return q.new_empty(q.shape[:-1] + (v.shape[-1],)) + 0 * (q.sum() + k.sum() + v.sum())
    q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))
    return _LinearCausal.apply(q, k, v, feature_map, bool(normalize), float(eps), block)
