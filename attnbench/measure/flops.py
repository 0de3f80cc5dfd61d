"""FLOPs: counted exactly for the pattern, and the device's own matmul rate for the roofline.

Forward FLOPs come from :meth:`attnbench.core.spec.Mechanism.forward_flops`: by default
``2 * B * H * pairs * (D + Dv)`` with the attended (query, key) pairs counted exactly for the
pattern (causal, windows, dilation), or the mechanism's own formula when it declares one (linear
attention, AFT...). A multiply-add counts as 2.

Forward + backward counts ``1 + BACKWARD_FACTOR`` times the forward; beside it, the same work in
flash-attention's convention (3.5x the forward) and, for block-sparse kernels (FlexAttention),
the FLOPs their kernel executes, whole blocks counted, beside the exact pair count. The roofline
denominator is not a spec sheet: a square matmul is timed on the same device, in the same dtype
and thread count, interleaved with the cases it divides (:class:`MatmulAnchor`), sized by time
(:func:`sized_anchor`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.core.decode import decode_flops
from attnbench.core.spec import Mechanism, PathSpec, Shape
from attnbench.core.varlen import varlen_flops
from attnbench.measure.timing import Clock

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
    mech: Mechanism,
    shape: Shape,
    causal: bool,
    params: Mapping[str, Any],
    direction: str,
    path: PathSpec | None = None,
) -> FlopCount:
    """FLOPs of one call in ``direction`` ("fwd" or "fwdbwd") for ``shape`` (already adapted):
    a decode call's (``shape.query_len``: ``path``'s count, :func:`decode_flops`), a packed
    batch's (``shape.varlen``: the pairs inside each sequence, :func:`varlen_flops`)."""
    method = "formula" if mech.flops is not None else "pairs"
    if shape.query_len is not None:
        forward = decode_flops(mech, path, shape, params)
        method = "decode form" if getattr(path, "flops", None) else f"{method}: the new rows"
    elif shape.varlen is not None:
        forward = varlen_flops(mech, shape, causal, params)
        method += ": inside each sequence"
    else:
        forward = mech.forward_flops(shape, causal, params)
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
        self.call_s: float | None = None  # one call's time, when sized_anchor measured it

    def __call__(self) -> torch.Tensor:
        return self.a @ self.b


#: The smallest roofline matmul :func:`sized_anchor` starts from.
MIN_ANCHOR_SIZE = 64


def anchor_sizes(max_size: int) -> list[int]:
    """The sizes :func:`sized_anchor` may pick, smallest first: the powers of two from
    MIN_ANCHOR_SIZE below ``max_size``, then ``max_size`` itself."""
    sizes, size = [], MIN_ANCHOR_SIZE
    while size < max_size:
        sizes.append(size)
        size *= 2
    return [*sizes, max_size]


def _call_s(anchor: MatmulAnchor, clock: Clock, max_call_s: float) -> float:
    """Seconds one call takes: the better of two (the first may pay one-off costs: cuBLAS
    start-up, the CPU thread pool), or the first alone when it is far over ``max_call_s``."""
    first = clock.time_block(anchor, 1)
    if first > 2 * max_call_s:
        return first
    return min(first, clock.time_block(anchor, 1))


def sized_anchor(
    device: torch.device,
    dtype: torch.dtype,
    max_size: int,
    max_call_s: float,
    clock: Clock,
    note: Callable[[str], None] = lambda text: None,
) -> MatmulAnchor:
    """The largest anchor up to ``max_size`` (powers of two, then ``max_size``) whose call takes
    at most ``max_call_s`` on this device in this dtype; the smallest when none does;
    ``max_size`` untried when ``max_call_s`` <= 0.

    Why by time, not a fixed shape: the anchor is timed in every round of every group, and a
    dtype without fast kernels on a device makes a fixed shape absurd (2048^3 in float16 on a
    CPU ran at 0.2-0.4 GFLOP/s: ~50 s a call, minutes for a 0.05 ms case). A bigger size is
    tried only when the last one's time, scaled by (size ratio)^3, stays under the limit, so
    the sizing costs about two calls of the size it keeps."""
    if max_call_s <= 0:
        return MatmulAnchor(device, dtype, max_size)
    name = str(dtype).removeprefix("torch.")
    note(f"sizing the {name} matmul (up to {max_size}^3, a call at most {max_call_s:g} s)")
    sizes = anchor_sizes(max_size)
    chosen = MatmulAnchor(device, dtype, sizes[0])
    took = _call_s(chosen, clock, max_call_s)
    for size in sizes[1:]:
        if took * (size / chosen.size) ** 3 > max_call_s:
            break
        bigger = MatmulAnchor(device, dtype, size)
        bigger_took = _call_s(bigger, clock, max_call_s)
        if bigger_took > max_call_s:
            note(f"{name} matmul {size}^3 took {bigger_took:.2g} s a call: keeping {chosen.size}")
            break
        chosen, took = bigger, bigger_took
    chosen.call_s = took
    return chosen
