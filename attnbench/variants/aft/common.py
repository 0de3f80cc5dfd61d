"""What the AFT mechanisms share: the elementwise-shape check and the FLOP convention.

FLOPs (``Mechanism.flops``): AFT's work is two weighted sums per feature, the numerator
``sum e^{a} V`` and the denominator ``sum e^{a}``. Each term the path evaluates counts 2 FLOPs
in each sum (a multiply-add, as FlopCounterMode counts a matmul's), so 4 per (query, key,
feature) term computed directly and 4 per (key, feature) for a sum shared by every query (a
global, prefix or suffix sum; the tree scan's ~2x bookkeeping is not counted). Elementwise maps
(exp, sigmoid, the final division) are not counted, as dense attention's 4 n^2 d leaves out its
softmax.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor


def check_elementwise(q: Tensor, k: Tensor, v: Tensor, params: Mapping[str, Any]) -> str | None:
    """AFT mixes V feature by feature with weights from K, so V must have K's feature size."""
    if v.shape[-1] != k.shape[-1]:
        return (
            f"AFT is elementwise: v has {v.shape[-1]} features per head but k has "
            f"{k.shape[-1]}; they must be equal"
        )
    return None


def as_features(x: Tensor) -> Tensor:
    """``[B, H, T, D]`` -> ``[T, B*H*D]``: every (batch, head, feature) is one AFT column."""
    b, h, t, d = x.shape
    return x.permute(2, 0, 1, 3).reshape(t, b * h * d)


def from_features(y: Tensor, like: Tensor) -> Tensor:
    """Inverse of :func:`as_features`: ``[T, B*H*D]`` -> ``[B, H, T, D]`` shaped like ``like``."""
    b, h, t, d = like.shape
    return y.reshape(t, b, h, d).permute(1, 2, 0, 3)
