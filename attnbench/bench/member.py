"""One case of a group made ready to time (:func:`set_up`): its inputs, shared within the group,
its call, warm-up and peak memory; then the samples the group's rounds give it."""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnbench import api
from attnbench.bench.plan import Case
from attnbench.core.inputs import make_inputs
from attnbench.measure.gpu_timing import capture
from attnbench.measure.memory import PeakMemory, peak_memory
from attnbench.measure.timing import Clock, TimingPolicy, WarmUp, block_calls, warm_up


@dataclass(eq=False)  # compared by identity: a group's members are distinct objects
class Member:
    """A case being timed within its group."""

    case: Case
    call: Callable[[], object]
    warm: WarmUp
    mem: PeakMemory | None = None  # of its own direction
    mem_fwd: PeakMemory | None = None  # fwdbwd members only, when the run has no fwd direction
    block: int = 1
    samples: list[float] = field(default_factory=list)
    graph: bool = False  # timed as replays of a CUDA graph ([timing] graph = true)
    graph_reason: str = ""  # why not, when asked
    #: Columns of its row known from the set-up (a decode case's state bytes).
    values: dict[str, Any] = field(default_factory=dict)


def set_up(
    case: Case,
    cache: dict[tuple, dict[str, torch.Tensor]],
    clock: Clock,
    timing: TimingPolicy,
    *,
    need_fwd_memory: bool,
) -> Member:
    """The case ready to time: its call (forward under no_grad, or forward + autograd.grad of
    every input for a fixed random output gradient) with the path's arguments chosen once, warmed
    up (compilation and autotuning happen here, untimed), its peak memory measured in its own
    untimed pass (and the forward's, for a fwdbwd case when the run has no fwd direction), and its
    calls per sample. Raises whatever the case raises."""
    backward = case.direction == "fwdbwd"
    inputs = shared_inputs(case, cache, backward)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    extras = {name: t for name, t in inputs.items() if name not in ("q", "k", "v")}
    with torch.set_grad_enabled(backward):
        api.prepare(case.mech, q, k, v, causal=case.causal, path=case.path.name,
                    **case.params, **extras)  # fmt: skip
    fn = case.path.fn  # called directly, its own arguments chosen once, outside the timing
    kwargs = case.path.arguments({"causal": case.causal, **case.params, **extras})

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return fn(q, k, v, **kwargs)

    if backward:
        leaves = [t for t in inputs.values() if t.requires_grad]
        s = case.shape
        gen = torch.Generator(device="cpu").manual_seed(1)
        dout = torch.randn((s.batch, s.heads, s.seq_len, s.dv), generator=gen)
        dout = dout.to(device=case.device, dtype=case.dtype)

        def call() -> object:
            out = fn(q, k, v, **kwargs)
            return torch.autograd.grad(out, leaves, dout, allow_unused=True)
    else:
        call = forward

    warm = warm_up(call, clock, timing)
    member = Member(case, call, warm)
    compiled = case.path.compiled
    member.mem = peak_memory(call, case.device, compiled=compiled)
    if backward and need_fwd_memory:
        member.mem_fwd = peak_memory(forward, case.device, compiled=compiled)
    member.block = block_calls(warm.per_call_s, timing)
    if timing.graph and case.device.type == "cuda":
        use_graph(member, clock, timing)
    return member


def use_graph(member: Member, clock: Clock, timing: TimingPolicy) -> None:
    """Time the member as replays of a CUDA graph of its call (after its warm-up and memory
    pass), or, when the call cannot be captured, as before with the reason kept for its row."""
    replay, why = capture(member.call, member.case.device)
    member.graph_reason = why
    if why:
        return
    member.call, member.graph = replay, True
    member.block = block_calls(warm_up(replay, clock, timing).per_call_s, timing)


def shared_inputs(
    case: Case, cache: dict[tuple, dict[str, torch.Tensor]], backward: bool
) -> dict[str, torch.Tensor]:
    """make_inputs, shared by every case of the group that needs identical tensors (same
    shape, dtype, grad flag and extra inputs), so a group holds one copy of q, k, v."""
    extras = tuple(
        (e.name, tuple(e.shape(case.shape, case.params)), e.init_std)
        for e in case.mech.extras_for(case.params)
    )
    key = (case.shape, case.dtype, backward, extras)
    if key not in cache:
        cache[key] = make_inputs(
            case.mech,
            case.shape,
            case.params,
            dtype=case.dtype,
            device=case.device,
            seed=0,
            requires_grad=backward,
        )
    return cache[key]


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
