"""What the sparse family shares: the dense masked reference and small counting helpers.

The reference of every pattern is the same obviously right computation: build the boolean
``[n, n]`` pattern from the mechanism's literal rule ``visible(i, j, n, causal, params)``, apply it
as -inf before the softmax (:func:`attnbench.variants.dense.softmax_attention`), and let a row with
no visible key output zeros. It never shares code with the efficient paths, which live on
:mod:`attnbench.variants.sparse.engine`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from attnbench.variants.dense import softmax_attention

#: ``visible(i, j, n, causal, params)`` -> bool tensor, elementwise over broadcastable i, j.
Visible = Callable[[Tensor, Tensor, int, bool, Mapping[str, Any]], Tensor]

#: The query block edge b of banded parts. A band of w keys per side costs (2 ceil(w/b) + 1) * b
#: score slots per query: 192 for w = b = 64 (129 attended), 160 for b = 32. On the CPU the parts
#: run on the fused flash kernel (:mod:`attnbench.variants.sparse.cpu_fused`), where b = 32 was
#: the fastest forward for local w = 64, strided and sparse at n = 8192 (B=1 H=4 D=32, one thread:
#: local 16.4 / 18.5 / 18.0 ms at b = 32 / 64 / 128). Elsewhere (the chunked path) b = 32 and
#: b = 128 were both slower than 64 (smaller matmuls and more shifted adds; more wasted slots).
BLOCK = 64
CPU_BLOCK = 32


def band_block(n: int, reach: int, device: torch.device | None = None) -> int:
    """Query block size for a band of ``reach`` keys on each side at length ``n``, on
    ``device`` (the CPU's fused kernel prefers smaller blocks)."""
    edge = CPU_BLOCK if device is not None and device.type == "cpu" else BLOCK
    return max(1, min(n, edge, max(16, reach)))


def pattern(visible: Visible, n: int, causal: bool, params: Mapping[str, Any]) -> Tensor:
    """Boolean ``[n, n]``, True where query i sees key j: the literal rule on every pair."""
    idx = torch.arange(n)
    return visible(idx[:, None], idx[None, :], n, causal, params)


def masked_reference(
    visible: Visible, q: Tensor, k: Tensor, v: Tensor, causal: bool, params: Mapping[str, Any]
) -> Tensor:
    """Dense ``[B, H, n, n]`` scores, the pattern applied as -inf before the softmax.

    q, k, v ``[B, H, n, D]`` -> ``[B, H, n, Dv]``; rows with no visible key give zeros.
    """
    idx = torch.arange(q.shape[-2], device=q.device)
    mask = visible(idx[:, None], idx[None, :], q.shape[-2], causal, params)  # (n, n)
    return softmax_attention(q, k, v, mask=mask)


def rows(n: int) -> Tensor:
    """Positions 0..n-1 as int64 (for O(n) pair counts)."""
    return torch.arange(n, dtype=torch.int64)


def window_count(n: int, causal: bool, left: int, right: int) -> Tensor:
    """Per query i, the number of keys j in [i - left, i + right] ∩ [0, n) (j <= i if causal)."""
    i = rows(n)
    lo = (i - left).clamp_min(0)
    hi = i if causal else (i + right).clamp_max(n - 1)
    return hi - lo + 1


def residue_count(n: int, causal: bool, r: int) -> Tensor:
    """Per query i, the number of keys j in [0, n) with (i - j) a multiple of r (j <= i if
    causal)."""
    i = rows(n)
    return i // r + 1 if causal else (n - 1 - i % r) // r + 1


def band_and_residue_count(n: int, causal: bool, reach: int, r: int) -> int:
    """Exact pairs of |i - j| <= reach OR (i - j) mod r == 0 (j <= i if causal), in O(n):
    the band, plus the residue class, minus the multiples of r inside the band."""
    i = rows(n)
    lo = (i - reach).clamp_min(0)
    hi = i if causal else (i + reach).clamp_max(n - 1)
    both = (i - lo) // r + (hi - i) // r + 1  # multiples of r in [-(hi - i), i - lo]
    band = hi - lo + 1
    return int((band + residue_count(n, causal, r) - both).sum())
