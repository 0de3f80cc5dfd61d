"""The plan of a speed sweep: the suite expanded into groups of cases, in the order they run, and
each case's capability check. Pure: nothing is timed, allocated or written here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from attnbench.bench.config import SpeedSuite, params_for, select
from attnbench.bench.results import params_text
from attnbench.core.spec import Mechanism, PathSpec, Shape
from attnbench.core.varlen import packing_of, padded_shape


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
    #: A packed batch (``shape.varlen``): "packed" (the path's own entry), "packed-loop" (a
    #: loop over the sequences) or "padded" (the same sequences padded to the longest).
    packing: str | None = None

    @property
    def impl(self) -> str:
        return f"{self.mech.name}:{self.path.name}"

    @property
    def decoding(self) -> bool:
        return self.shape.query_len is not None

    @property
    def variant(self) -> tuple:
        """What tells apart the cases of one path in a group: its parameters and packing."""
        return (self.impl, params_text(self.params), self.packing)

    @property
    def series(self) -> tuple:
        """What stays the same across lengths: OOM at one n skips the longer n of this."""
        s = self.shape
        return (self.impl, params_text(self.params), self.dtype, self.causal, self.direction,
                s.heads, s.head_dim, s.query_len, self.packing)  # fmt: skip

    def label(self) -> str:
        tag = "causal" if self.causal else "bidir"
        extra = f" q={self.shape.query_len}" if self.decoding else ""
        extra += f" {self.packing}" if self.packing else ""
        return f"{self.impl} {self.direction} {tag} n={self.shape.seq_len}{extra}"


@dataclass(frozen=True)
class Group:
    """Every case at one (dtype, head dim, causal flag, n): timed together, interleaved."""

    dtype: torch.dtype
    head_dim: int
    causal: bool
    seq_len: int
    cases: tuple[Case, ...]
    query_len: int | None = None  # decoding: the new queries per call

    def label(self) -> str:
        tag = "causal" if self.causal else "bidir"
        dname = str(self.dtype).removeprefix("torch.")
        decode = f" decode q={self.query_len}" if self.query_len is not None else ""
        return f"n={self.seq_len}{decode} {tag} d={self.head_dim} {dname}"


def plan(suite: SpeedSuite, mechanisms: Sequence[Mechanism] | None = None) -> list[Group]:
    """The suite's groups in the order they run (increasing n within each series)."""
    if suite.decoding:
        return decode_plan(suite, mechanisms)
    if suite.varlen:
        return packed_plan(suite, mechanisms)
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


def kv_settings(suite: SpeedSuite, mech: Mechanism, params: Mapping[str, Any]) -> list[dict]:
    """The parameter settings of ``mech`` along the suite's ``kv_heads`` axis: one per value
    for a mechanism with a ``kv_heads`` parameter (GQA), else its own parameters once."""
    if not suite.kv_heads or "kv_heads" not in mech.param_names:
        return [dict(params)]
    return [mech.resolve({**params, "kv_heads": kv}) for kv in suite.kv_heads]


def decode_plan(suite: SpeedSuite, mechanisms: Sequence[Mechanism] | None = None) -> list[Group]:
    """A decoding suite's groups: per dtype, head dim, new queries and cache length n (in
    increasing n), every selected decode form (causal, forward: decoding is both)."""
    pairs = select(suite, mechanisms)
    resolved = {mech.name: params_for(suite, mech) for mech, _ in pairs}
    groups = []
    for dtype in suite.torch_dtypes():
        for head_dim in suite.head_dims:
            for query_len in suite.query_lengths:
                for n in suite.lengths:
                    cases = _decode_cases(suite, pairs, resolved, dtype, head_dim, query_len, n)
                    if cases:
                        groups.append(Group(dtype, head_dim, True, n, cases, query_len))
    return groups


def _decode_cases(suite, pairs, resolved, dtype, head_dim, query_len, n) -> tuple[Case, ...]:
    device, heads = suite.torch_device(), suite.heads_for(head_dim)
    cases = []
    for mech, path in pairs:
        cap = suite.max_len.get(path.kind)
        if cap is not None and n > cap:
            continue
        for params in kv_settings(suite, mech, resolved[mech.name]):
            asked = Shape(suite.batch_for(n), heads, n, head_dim)
            shape = replace(mech.shape_for(asked, params), query_len=query_len)
            cases.append(Case(mech, path, params, shape, dtype, device, True, "fwd"))
    return tuple(cases)


def packed_plan(suite: SpeedSuite, mechanisms: Sequence[Mechanism] | None = None) -> list[Group]:
    """A packed-batch suite's groups: per dtype, head dim and causal flag, one group of every
    path's packed batch (``[1, H, T]``, T the tokens) and the same sequences padded to the
    longest (``[count, H, longest]``), timed side by side; both shapes keep the lengths."""
    device = suite.torch_device()
    pairs = select(suite, mechanisms)
    lengths = suite.varlen or ()
    groups = []
    for dtype in suite.torch_dtypes():
        for head_dim in suite.head_dims:
            heads = suite.heads_for(head_dim)
            for causal in suite.causal:
                cases = []
                for mech, path in pairs:
                    for params in kv_settings(suite, mech, params_for(suite, mech)):
                        asked = Shape(1, heads, sum(lengths), head_dim)
                        packed = replace(mech.shape_for(asked, params), varlen=lengths)
                        for packing in (packing_of(path), "padded"):
                            shape = padded_shape(packed) if packing == "padded" else packed
                            for direction in suite.directions:
                                cases.append(Case(mech, path, params, shape, dtype, device,
                                                  causal, direction, packing))  # fmt: skip
                if cases:
                    groups.append(Group(dtype, head_dim, causal, sum(lengths), tuple(cases)))
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
