"""FLOPs: counted exactly for the pattern, and the device's own matmul rate for the roofline.

Forward FLOPs come from :meth:`attnbench.core.spec.Mechanism.forward_flops`: by default
``2 * B * H * pairs * (D + Dv)`` with the attended (query, key) pairs counted exactly for the
pattern (causal, windows, dilation), or the mechanism's own formula when it declares one (linear
attention, AFT...). A multiply-add counts as 2.

Forward + backward counts ``1 + BACKWARD_FACTOR`` times the forward; beside it, the same work in
flash-attention's convention (3.5x the forward) and, for block-sparse kernels (FlexAttention),
the FLOPs their kernel executes, whole blocks counted, beside the exact pair count. The roofline
denominator is not a spec sheet: a square matmul is timed on the same device, in the same dtype
and thread count, interleaved with the cases it divides (:class:`MatmulAnchor`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.core.spec import Mechanism, PathSpec, Shape

#: Backward = 2x forward: each forward matmul C = A B has two backward matmuls (dA = dC B^T,
#: dB = A^T dC). attnbench counts the math, not one kernel's recomputation, so that every path of
#: a mechanism is credited with the same FLOPs and their FLOP/s compare directly.
BACKWARD_FACTOR = 2
#: flash-attention's benchmarks (Dao 2023, benchmarks/benchmark_flash_attention.py) count
#: forward + backward as 3.5x the forward: their backward recomputes Q K^T (2.5x). Published
#: FLOP/s figures of attention kernels use it; the ``*_fa`` columns do too, so they line up.
FA_FWDBWD_FACTOR = 3.5


@dataclass(frozen=True)
class FlopCount:
    flops: int
    method: str  # how it was counted, written into the results row
    flops_fa: int  # the same work in flash-attention's convention (fwd+bwd = 3.5x forward)


def count_flops(
    mech: Mechanism, shape: Shape, causal: bool, params: Mapping[str, Any], direction: str
) -> FlopCount:
    """FLOPs of one call in ``direction`` ("fwd" or "fwdbwd") for ``shape`` (already adapted)."""
    forward = mech.forward_flops(shape, causal, params)
    method = "formula" if mech.flops is not None else "pairs"
    if direction == "fwd":
        return FlopCount(forward, method, forward)
    return FlopCount(
        forward * (1 + BACKWARD_FACTOR),
        f"{method}; bwd={BACKWARD_FACTOR}x fwd",
        round(forward * FA_FWDBWD_FACTOR),
    )


def executed_flops(
    path: PathSpec,
    shape: Shape,
    causal: bool,
    params: Mapping[str, Any],
    direction: str,
    device: torch.device,
) -> int | None:
    """What a block-sparse path's kernel computes in one call, whole blocks counted, fwd+bwd in
    flash-attention's convention (3.5x: its backward recomputes the scores of the same blocks);
    None for a path that declares no such count."""
    if path.executed_flops is None:
        return None
    forward = path.executed_flops(shape, causal, params, device)
    return forward if direction == "fwd" else round(forward * FA_FWDBWD_FACTOR)


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
