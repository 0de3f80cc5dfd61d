"""RetNet's recurrent form (Sun et al. 2023):
S_n = gamma S_{n-1} + K_n^T V_n, O_n = Q_n S_n / sqrt(d).

A Python loop over positions with a [D, Dv] state per head: the decoding form, O(d^2) state;
autograd keeps one state per step for backward.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbench.core.precision import float32_sums
from attnbench.variants.retention.decay import finish, log_gammas, require_causal, with_ones


@float32_sums(name="retention:recurrent")
def recurrent(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, normalize: str) -> Tensor:
    """One position at a time. q, k: [B, H, T, D], v: [B, H, T, Dv] -> [B, H, T, Dv]."""
    require_causal(causal)
    b, h, t, d = q.shape
    log_g = log_gammas(h, q.device)
    vv = with_ones(v) if normalize == "rownorm" else v  # (B, H, T, Dv')
    gamma = torch.exp(log_g).to(q.dtype)[:, None, None]  # (H, 1, 1)
    qs = q / math.sqrt(d)
    state = q.new_zeros(b, h, d, vv.shape[-1])  # (B, H, D, Dv')
    outs = []
    # unbind rather than x[:, :, i]: indexing in a loop costs a full-size zero-fill per step in
    # backward (O(T^2 d)); unbind's backward stacks once.
    for qi, ki, vi in zip(qs.unbind(2), k.unbind(2), vv.unbind(2), strict=True):
        state = gamma * state + ki[..., :, None] * vi[..., None, :]  # (B, H, D, Dv')
        outs.append(qi[..., None, :] @ state)  # (B, H, 1, Dv')
    return finish(torch.cat(outs, dim=-2), normalize, log_g)
