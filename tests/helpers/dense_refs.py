"""Dense references for the fused kernels, written literally from the formulas (n x n on purpose).

Shared by the CPU tests (test_fused_cpu.py), the interpreter tests (interpreted_triton.py) and
the GPU tests (test_fused_gpu.py). Every tensor is ``[B, H, T, D]``; v is ``[B, H, T, Dv]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnbench.variants.dense import softmax_attention


def make_qkv(
    b: int, h: int, t: int, d: int, dv: int, dtype: torch.dtype, device="cpu", seed: int = 0
) -> dict[str, Tensor]:
    """q, k ``[b, h, t, d]`` and v ``[b, h, t, dv]`` from N(0, 1), drawn in float64 on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(b, h, t, dim, generator=gen, dtype=torch.float64).to(device, dtype)
        for name, dim in (("q", d), ("k", d), ("v", dv))
    }


def _ij(t: int, device) -> tuple[Tensor, Tensor]:
    idx = torch.arange(t, device=device)
    return idx[:, None], idx[None, :]


def gau_reference(q, k, v, *, causal, norm="ns", chunk=0):
    """o = (relu(q k^T)^2 * mask) v * norm, norm = 1/(n_i s) or 1/n_i^2, n_i = keys row i sees
    (T, or i + 1 when causal; inside row i's chunk when chunked), s = head dim (Su 2022)."""
    t, s = q.shape[-2], q.shape[-1]
    i, j = _ij(t, q.device)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device)
    if causal:
        mask &= j <= i
    if chunk:
        mask &= (i // chunk) == (j // chunk)
    n = mask.sum(-1, keepdim=True).to(q.dtype)  # (T, 1)
    a = torch.relu(q @ k.transpose(-1, -2)) ** 2 * mask  # (B, H, T, T)
    a = a / (n * s) if norm == "ns" else a / (n * n)
    return a @ v  # (B, H, T, Dv)


def retention_reference(q, k, v, *, gamma):
    """o = ((q k^T) * D) v, D_ts = gamma_h^(t - s) for s <= t, else 0 (RetNet's parallel form)."""
    t = q.shape[-2]
    i, j = _ij(t, q.device)
    g = torch.as_tensor(gamma, dtype=torch.float64, device=q.device).reshape(-1, 1, 1)  # (H,1,1)
    zero = torch.zeros((), dtype=torch.float64, device=q.device)
    decay = torch.where(j <= i, g ** (i - j).clamp(min=0), zero)  # (H, T, T)
    return ((q @ k.transpose(-1, -2)) * decay.to(q.dtype)) @ v  # (B, H, T, Dv)


def linear_reference(q, k, v):
    """Causal normalised linear attention on positive features q, k:
    o_t = sum_{s<=t} (q_t . k_s) v_s / sum_{s<=t} q_t . k_s."""
    scores = (q @ k.transpose(-1, -2)).tril()  # (B, H, T, T)
    return (scores @ v) / scores.sum(-1, keepdim=True)


def flash_global_reference(q, k, v, *, chunk):
    """FLASH's causal global part (Su 2022): whole earlier chunks only, / the tokens summed."""
    i, j = _ij(q.shape[-2], q.device)
    earlier = (j // chunk) < (i // chunk)  # (T, T)
    summed = ((i // chunk) * chunk).clamp(min=1).to(q.dtype)  # (T, 1)
    return ((q @ k.transpose(-1, -2)) * earlier) @ v / summed


def window_rule(i, j, n, causal, params):
    """|i - j| <= w: a sliding window, as an elementwise predicate (a ``visible`` rule)."""
    return (i - j).abs() <= params["w"]


def dilated_rule(i, j, n, causal, params):
    """(i - j) a multiple of r, or within 1: a dilated pattern (every row sees itself)."""
    return ((i - j) % params["r"] == 0) | ((i - j).abs() <= 1)


def dense_masked(rule):
    """Dense softmax attention with ``rule``'s pattern (and causality) at -inf."""

    def reference(q, k, v, *, causal, **params):
        n = q.shape[-2]
        i, j = _ij(n, q.device)
        mask = rule(i, j, n, causal, params)
        if causal:
            mask = mask & (j <= i)
        return softmax_attention(q, k, v, mask=mask)

    return reference
