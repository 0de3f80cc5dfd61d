"""The dense, obviously right softmax attention every softmax-family reference is built on.

It builds the full ``[B, H, Tq, Tk]`` score matrix on purpose: it is the oracle, not a fast path.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def expand_kv(k: Tensor, heads: int) -> Tensor:
    """Repeat K or V ``[B, Hkv, T, D]`` to ``[B, heads, T, D]`` (each kv head serves heads/Hkv
    consecutive query heads, as in SDPA's ``enable_gqa``)."""
    if k.shape[1] == heads:
        return k
    return k.repeat_interleave(heads // k.shape[1], dim=1)


def causal_mask(tq: int, tk: int, device: torch.device | str = "cpu") -> Tensor:
    """Boolean [Tq, Tk], True where query i may see key j (j <= i)."""
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril()


def keys_seen(tq: int, tk: int, causal: bool, device: torch.device | str = "cpu") -> Tensor:
    """n_i, the number of keys query i attends to, as float64 [Tq, 1]: Tk bidirectional,
    i + 1 (at most Tk) causal."""
    if causal:
        return torch.arange(1, tq + 1, dtype=torch.float64, device=device).clamp(max=tk)[:, None]
    return torch.full((tq, 1), float(tk), dtype=torch.float64, device=device)


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    scale: float | Tensor | None = None,
) -> Tensor:
    """o = softmax(scale * q k^T with masked pairs at -inf) v, densely.

    q ``[B, H, Tq, D]``, k ``[B, Hkv, Tk, D]``, v ``[B, Hkv, Tk, Dv]`` -> o ``[B, H, Tq, Dv]``.
    ``mask``: boolean ``[Tq, Tk]`` (True = attended), applied as -inf before the softmax.
    ``scale``: a number, or a ``[Tq, 1]`` tensor of per-row factors; default 1/sqrt(D).
    A row with no visible key outputs zeros (and passes zero gradient).
    """
    heads = q.shape[1]
    k, v = expand_kv(k, heads), expand_kv(v, heads)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
    if mask is None:
        return torch.softmax(scores, dim=-1) @ v  # (B, H, Tq, Dv)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # NaN on rows with no visible key
    probs = torch.where(mask.any(-1, keepdim=True), probs, torch.zeros((), dtype=probs.dtype))
    return probs @ v  # (B, H, Tq, Dv)
