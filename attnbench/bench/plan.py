"""The plan of a speed sweep: the suite expanded into groups of cases, in the order they run, and
each case's capability check. Pure: nothing is timed, allocated or written here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.bench.config import SpeedSuite, params_for, select
from attnbench.bench.results import params_text
from attnbench.core.spec import Mechanism, PathSpec, Shape


@dataclass(frozen=True, eq=False)
class Case:
    """One measurement: a mechanism's path at one shape, dtype, causal flag and direction."""

    mech: Mechanism
    path: PathSpec
    params: Mapping[str, Any]
    shape: Shape  # as the mechanism adapts it (MQA: kv_heads = 1)
    dtype: torch.dtype
    device: torch.device
    causal: bool
    direction: str  # "fwd" | "fwdbwd"

    @property
    def impl(self) -> str:
        return f"{self.mech.name}:{self.path.name}"

    @property
    def series(self) -> tuple:
        """What stays the same across lengths: OOM at one n skips the longer n of this."""
        s = self.shape
        return (self.impl, params_text(self.params), self.dtype, self.causal, self.direction,
                s.heads, s.head_dim)  # fmt: skip

    def label(self) -> str:
        tag = "causal" if self.causal else "bidir"
        return f"{self.impl} {self.direction} {tag} n={self.shape.seq_len}"


@dataclass(frozen=True)
class Group:
    """Every case at one (dtype, head dim, causal flag, n): timed together, interleaved."""

    dtype: torch.dtype
    head_dim: int
    causal: bool
    seq_len: int
    cases: tuple[Case, ...]

    def label(self) -> str:
        tag = "causal" if self.causal else "bidir"
        dname = str(self.dtype).removeprefix("torch.")
        return f"n={self.seq_len} {tag} d={self.head_dim} {dname}"


def plan(suite: SpeedSuite, mechanisms: Sequence[Mechanism] | None = None) -> list[Group]:
    """The suite's groups in the order they run (increasing n within each series)."""
    device = suite.torch_device()
    pairs = select(suite, mechanisms)
    resolved = {mech.name: params_for(suite, mech) for mech, _ in pairs}
    groups = []
    for dtype in suite.torch_dtypes():
        for head_dim in suite.head_dims:
            heads = suite.heads_for(head_dim)
            for causal in suite.causal:
                for n in suite.lengths:
                    cases = []
                    for mech, path in pairs:
                        cap = suite.max_len.get(path.kind)
                        if cap is not None and n > cap:
                            continue
                        params = resolved[mech.name]
                        asked = Shape(suite.batch_for(n), heads, n, head_dim)
                        shape = mech.shape_for(asked, params)
                        for direction in suite.directions:
                            cases.append(
                                Case(mech, path, params, shape, dtype, device, causal, direction)
                            )
                    if cases:
                        groups.append(Group(dtype, head_dim, causal, n, tuple(cases)))
    return groups


def unsupported_reason(case: Case) -> str | None:
    """Why this case cannot run here, from the mechanism's declared capabilities, or None."""
    reasons = case.mech.not_supported_reasons(
        case.path,
        device=case.device,
        dtype=case.dtype,
        causal=case.causal,
        backward=case.direction == "fwdbwd",
    )
    return "; ".join(reasons) or None
