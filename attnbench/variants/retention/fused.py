"""RetNet retention on the Triton chunkwise kernel (attnbench/kernels/triton_retention.py).

The kernel computes o_t = sum_{s<=t} gamma_h^(t-s) (q_t . k_s) v_s with gamma_h = 1 - 2^(-5 - h)
(:func:`attnbench.kernels.triton_ops.retnet_gammas`, the same decays as ``decay.log_gammas``).
Fed q / sqrt(d), it is the parallel form (Q K^T / sqrt(d) * D) V exactly. ``rownorm`` needs two
more numbers per row, both computed exactly: the decay row sums sqrt(sum_{i<=t} gamma^i) in closed
form, and the score row sums sum_{s<=t} gamma^(t-s) q_t . k_s / sqrt(d), which is the same kernel
on a column of ones, run in float32.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError
from attnbench.core.precision import refuse_overflow
from attnbench.kernels import triton_ops
from attnbench.libraries import fla
from attnbench.variants.retention.decay import log_gammas, require_causal


def triton(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, normalize: str) -> Tensor:
    """Retention on the Triton chunkwise kernel, forward and backward (its own tile, not the
    ``chunk`` parameter). q, k: [B, H, T, D], v: [B, H, T, Dv] (D, Dv <= 128) ->
    [B, H, T, Dv]."""
    require_causal(causal)
    triton_ops.check_call("retention", q, k, v, max_v=triton_ops.MAX_HEAD_DIM)
    h, t, d = q.shape[1], q.shape[2], q.shape[3]
    gammas = triton_ops.retnet_gammas(h)
    qs = q / math.sqrt(d)  # (B, H, T, D): the 1/sqrt(d) of every form
    o = triton_ops.retention_chunked(qs, k, v, gammas)  # (B, H, T, Dv)
    if normalize == "none":
        return o
    ones = torch.ones(v.shape[:-1] + (1,), dtype=torch.float32, device=v.device)
    # The score sums from q in float32, not from the half-precision qs: the output has a kink
    # where |score sum * r| = 1 (the clamp), and a half-rounded q / sqrt(d) moves rows across it
    # (seen: rows within 1e-4 of the kink, float16, T = 1023, gave dq errors of 60 % of its scale).
    qs32 = q.float() / math.sqrt(d)  # (B, H, T, D)
    score_sum = triton_ops.retention_chunked(qs32, k.float(), ones, gammas)  # (B, H, T, 1)
    log_g = log_gammas(h, q.device)  # (H,) float64
    n = torch.arange(1, t + 1, dtype=torch.float64, device=q.device)
    decay_sum = torch.expm1(n[None, :] * log_g[:, None]) / torch.expm1(log_g)[:, None]  # (H, T)
    r = decay_sum.rsqrt().float()[None, :, :, None]  # (1, H, T, 1): 1 / sqrt(decay row sum)
    return (o.float() * r / (score_sum * r).abs().clamp(min=1.0)).to(v.dtype)


def fla_form(form: str):
    """FLA's retention kernel ``form`` (chunk or recurrent) as a path function: the same decays
    and scale, the unnormalised form only (FLA has no ``rownorm``)."""

    def fn(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, normalize: str) -> Tensor:
        if normalize != "none":
            raise AttnbenchError(
                f"retention:fla-{form} computes normalize=none only (FLA has no {normalize!r}); "
                "use the triton or chunkwise path"
            )
        return refuse_overflow(
            fla.retention(q, k, v, causal=causal, form=form), (q, k, v), f"retention:fla-{form}"
        )

    fn.__name__ = fn.__qualname__ = f"fla_{form}"
    return fn
