"""RetNet's parallel form, the dense reference: (Q K^T / sqrt(d) * D) V (Sun et al. 2023).

D[n, m] = gamma^(n - m) for n >= m, else 0 (causal masking and decay in one matrix). With
``normalize="rownorm"``, the RetNet paper's normalisations: each decay row divided by the square
root of its sum, then the scores R divided by max(|sum_m R[n, m]|, 1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbench.core.precision import float32_sums
from attnbench.variants.retention.decay import log_gammas, require_causal


@float32_sums(name="retention:parallel")
def parallel(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, normalize: str) -> Tensor:
    """Dense T x T retention. q, k: [B, H, T, D], v: [B, H, T, Dv] -> [B, H, T, Dv]. Half inputs
    are computed in float32, as the other retention paths are (the score sums of the row
    normalisation pass float16's range long before the output does)."""
    require_causal(causal)
    _, h, t, d = q.shape
    pos = torch.arange(t, dtype=torch.float64, device=q.device)
    gap = pos[:, None] - pos[None, :]  # (T, T): n - m
    decay = torch.where(
        gap >= 0, torch.exp(gap.clamp(min=0) * log_gammas(h, q.device)[:, None, None]), 0.0
    )  # (H, T, T), float64
    if normalize == "rownorm":
        decay = decay / decay.sum(-1, keepdim=True).sqrt()
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d) * decay.to(q.dtype)  # (B, H, T, T)
    if normalize == "rownorm":
        scores = scores / scores.sum(-1, keepdim=True).abs().clamp(min=1.0)
    return scores @ v  # (B, H, T, Dv)
