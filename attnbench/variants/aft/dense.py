"""The AFT formula evaluated literally: the dense oracle every AFT path is tested against.

Zhai et al. 2021 ("An Attention Free Transformer"), per feature f::

    Y[t, f] = sigmoid(Q[t, f]) * sum_t' softmax_t'(w[t, t'] + K[t', f]) * V[t', f]

It builds the ``[B, H, D, T, T]`` logits on purpose (memory O(T^2 d)): it is the oracle, not a
fast path. Causal AFT masks the bias, w[t, t'] = -inf for t' > t (the paper's autoregressive
setting). The features of our ``[B, H, T, D]`` layout are the H * D pairs (h, d): AFT is
elementwise, heads only group features that share a bias (aft-conv) or nothing at all.
"""

from __future__ import annotations

import torch
from torch import Tensor


def aft_dense(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, *, causal: bool) -> Tensor:
    """q, k, v ``[B, H, T, D]``; bias ``[T, T]`` (shared by heads) or ``[H, T, T]``; -> ``[B, H,
    T, D]``. Rows of ``bias`` are queries t, columns keys t'."""
    t = q.shape[-2]
    if bias.dim() == 2:
        bias = bias[None]  # (1, T, T)
    if causal:
        future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)  # t' > t
        bias = bias.masked_fill(future, float("-inf"))  # masking w masks the pair
    logits = bias[None, :, None] + k.transpose(-2, -1)[..., None, :]  # (B, H, D, T, T')
    weights = torch.softmax(logits, dim=-1)  # (B, H, D, T, T'), over t' per feature
    mixed = weights @ v.transpose(-2, -1)[..., None]  # (B, H, D, T, 1)
    return torch.sigmoid(q) * mixed.squeeze(-1).transpose(-2, -1)  # (B, H, T, D)


def band_to_dense(w_band: Tensor, s: int) -> Tensor:
    """AFT-local's bias as a dense ``[T, T]``: ``w_band[t, t' - t + s - 1]`` where
    ``|t - t'| < s``, 0 elsewhere. ``w_band`` is ``[T, 2s - 1]``."""
    t = w_band.shape[0]
    pos = torch.arange(t, device=w_band.device)
    offset = pos[None, :] - pos[:, None]  # (T, T): t' - t
    inside = offset.abs() < s
    column = (offset + s - 1).clamp(0, 2 * s - 2)  # (T, T)
    return torch.where(inside, w_band.gather(1, column), torch.zeros((), dtype=w_band.dtype))


def kernel_to_dense(kernel: Tensor, t: int) -> Tensor:
    """AFT-conv's bias as a dense ``[H, T, T]``: ``kernel[h, j]`` at offset t' - t = j - (s-1)//2
    (a centred kernel of size s, PyTorch's ``padding='same'`` alignment), 0 elsewhere."""
    s = kernel.shape[-1]
    pos = torch.arange(t, device=kernel.device)
    j = pos[None, :] - pos[:, None] + (s - 1) // 2  # (T, T): kernel tap of pair (t, t')
    inside = (j >= 0) & (j < s)
    taps = kernel[:, j.clamp(0, s - 1)]  # (H, T, T)
    return torch.where(inside, taps, torch.zeros((), dtype=kernel.dtype))
