"""Tiny speed suites: CPU, a few short lengths, a fast timing policy."""

from __future__ import annotations

from dataclasses import replace

from attnbench.bench.config import SpeedSuite
from attnbench.measure.timing import TimingPolicy

#: One warm-up call and two rounds: enough to run the timing code, not to measure anything.
FAST = TimingPolicy(
    warmup_calls=1, warmup_s=0.0, rounds=2, min_rounds=2, block_s=0.0, group_budget_s=1.0
)


def tiny(**changes) -> SpeedSuite:
    """A CPU suite of two short lengths and the reference and efficient paths; ``changes``
    replaces any field."""
    base = SpeedSuite(
        name="tiny",
        device="cpu",
        lengths=(16, 32),
        heads=2,
        head_dims=(8,),
        threads=1,
        timing=FAST,
        matmul_size=32,
        # The softmax family's fused SDPA paths need CUDA; they are checked in their own test.
        path_kinds=("reference", "efficient"),
    )
    return replace(base, **changes)
