"""FLOPs: counted exactly for the pattern, and the device's own matmul rate for the roofline.

Forward FLOPs come from :meth:`attnbench.core.spec.Mechanism.forward_flops`: by default
``2 * B * H * pairs * (D + Dv)`` with the attended (query, key) pairs counted exactly for the
pattern (causal, windows, dilation), or the mechanism's own formula when it declares one (linear
attention, AFT...). A multiply-add counts as 2.

Forward + backward counts ``1 + BACKWARD_FACTOR`` times the forward. The roofline denominator is
not a spec sheet: a square matmul is timed on the same device, in the same dtype and thread count,
interleaved with the cases it divides (:class:`MatmulAnchor`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.core.spec import Mechanism, Shape

#: Backward = 2x forward: each forward matmul C = A B has two backward matmuls (dA = dC B^T,
#: dB = A^T dC). FlashAttention's benchmarks count 2.5x because their backward also recomputes
#: Q K^T; attnbench counts the math, not one kernel's recomputation, so that every path of a
#: mechanism is credited with the same FLOPs and their FLOP/s compare directly.
BACKWARD_FACTOR = 2


@dataclass(frozen=True)
class FlopCount:
    flops: int
    method: str  # how it was counted, written into the results row


def count_flops(
    mech: Mechanism, shape: Shape, causal: bool, params: Mapping[str, Any], direction: str
) -> FlopCount:
    """FLOPs of one call in ``direction`` ("fwd" or "fwdbwd") for ``shape`` (already adapted)."""
    forward = mech.forward_flops(shape, causal, params)
    method = "formula" if mech.flops is not None else "pairs"
    if direction == "fwd":
        return FlopCount(forward, method)
    return FlopCount(forward * (1 + BACKWARD_FACTOR), f"{method}; bwd={BACKWARD_FACTOR}x fwd")


class MatmulAnchor:
    """The roofline's denominator: a square ``size`` x ``size`` matmul in ``dtype`` on ``device``.

    The speed suite times it as one more member of every group's interleaved rounds, so each
    case's roofline fraction is a per-round ratio to a matmul measured under the same load (a
    calibration taken once at the start drifts with the load of a shared machine: a busy minute
    made the first version of this suite report 175 % of the "peak").
    """

    def __init__(self, device: torch.device, dtype: torch.dtype, size: int) -> None:
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
        self.b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
        self.size = size
        self.dtype = str(dtype).removeprefix("torch.")
        self.flops = 2 * size**3

    def __call__(self) -> torch.Tensor:
        return self.a @ self.b
