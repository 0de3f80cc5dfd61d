"""Sequences cut into chunks, for the chunkwise forms of linear attention and retention."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def chunked(x: Tensor, n: int, c: int) -> Tensor:
    """``x`` [B, H, T, D] as ``n`` chunks of ``c`` positions, [B H n, c, D] (n c >= T). A last
    partial chunk is padded with zero rows: zero keys add nothing, padded queries are cut off by
    the caller. The result is a view of ``x`` when T = n c: no copy then (``F.pad`` with zero
    padding still copies)."""
    b, h, t, d = x.shape
    if n * c != t:
        x = F.pad(x, (0, 0, 0, n * c - t))
    return x.reshape(b * h * n, c, d)
