"""GPU timing options of a speed suite (``[timing] l2`` and ``graph``): a cold L2 cache between
timed calls, and calls replayed from a CUDA graph.

``l2 = "warm"`` (what a loop of calls sees, and the default on a GPU): each call finds in the L2
whatever the call before it left there. When a case's working set fits in the L2 (50 MiB on an
H100), its inputs are then read from the cache, not from HBM, and a bandwidth-bound kernel looks
faster than it is in a model, where the previous layer's work evicted them. ``l2 = "cold"``
writes a buffer of at least twice the L2 (:class:`L2Flush`) before every timed call, outside the
timed region: each call is bracketed by its own CUDA events (:class:`ColdL2Clock`), the flush
runs on the stream before the first of them. This is what Triton's ``do_bench`` does (it zeroes a
256 MB buffer); flash-attention's benchmarks time warm calls.

``graph = true`` captures a case's call (forward, or forward + backward) in a CUDA graph after
its warm-up and times replays of it: no Python, no dispatcher and no kernel-launch cost between
kernels, which is what a short call at a small shape mostly pays. A path whose call cannot be
captured (it synchronises with the host, allocates outside the graph's pool, or compiles on the
call) is timed as usual, and its row says why (:func:`capture`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.measure.timing import Clock, TimingPolicy

#: The flush buffer is at least this many times the L2 (and at least MIN_FLUSH_BYTES).
FLUSH_FACTOR = 2
#: When the device does not report its L2 size: 256 MiB, Triton's do_bench's buffer.
MIN_FLUSH_BYTES = 256 * 2**20
#: Calls on a side stream before capture (torch's CUDA graph notes: lazy initialisation, cuBLAS
#: workspaces and autotuning must happen before capture, not in it).
CAPTURE_WARMUP_CALLS = 3
#: What ``l2`` may be.
L2_MODES = ("cold", "warm")


def l2_bytes(device: torch.device) -> int:
    """The L2 cache's size in bytes as the device reports it (0 when it does not)."""
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 0)


def flush_bytes(device: torch.device) -> int:
    """The size of the flush buffer: ``FLUSH_FACTOR`` x the L2, never below MIN_FLUSH_BYTES."""
    return max(FLUSH_FACTOR * l2_bytes(device), MIN_FLUSH_BYTES)


class L2Flush:
    """Evicts the L2: one write of a buffer of :func:`flush_bytes` bytes (queued on the current
    stream, so it runs before whatever is queued after it)."""

    def __init__(self, device: torch.device) -> None:
        self.bytes = flush_bytes(device)
        self.buffer = torch.empty(self.bytes, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


class ColdL2Clock(Clock):
    """A CUDA clock that flushes the L2 before every call and times each call alone (its own
    pair of events): the flush is never inside a timed interval."""

    def __init__(self, device: torch.device | str, flush: Callable[[], None]) -> None:
        super().__init__(device, "wall")
        if not self.cuda:
            raise ValueError("l2 = 'cold' flushes a GPU's L2: a CUDA device only")
        self.flush = flush

    def time_block(self, fn: Callable[[], object], calls: int) -> float:
        pairs = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(calls)
        ]
        torch.cuda.synchronize(self.device)
        for start, end in pairs:
            self.flush()
            start.record()
            fn()
            end.record()
        pairs[-1][1].synchronize()
        return sum(start.elapsed_time(end) for start, end in pairs) / 1e3 / calls


def effective_l2(policy: TimingPolicy, device: torch.device) -> str | None:
    """What a row records in ``l2``: the suite's choice on a GPU (``warm`` when unset), None
    (an empty cell) on the CPU, where attnbench does not manage caches."""
    if device.type != "cuda":
        return None
    return policy.l2 or "warm"


def make_clock(device: torch.device, policy: TimingPolicy) -> Clock:
    """The clock a suite's timing asks for: cold-L2 per-call events, or the usual one."""
    if device.type == "cuda" and policy.l2 == "cold":
        return ColdL2Clock(device, L2Flush(device))
    return Clock(device, policy.clock)


def gpu_only_options(policy: TimingPolicy, device: torch.device) -> str | None:
    """Why ``policy`` cannot time on ``device`` (a one-line error), or None."""
    if device.type == "cuda":
        return None
    if policy.l2 is not None:
        return (
            f"[timing] l2 = {policy.l2!r} manages a GPU's L2 cache between samples: a CUDA "
            f"device only (this run's device is {device.type}); on the CPU leave l2 unset"
        )
    if policy.graph:
        return (
            "[timing] graph = true times CUDA graph replays: a CUDA device only (this run's "
            f"device is {device.type}); on the CPU leave graph unset or false"
        )
    return None


def capture(call: Callable[[], object], device: torch.device) -> tuple[Callable[[], None], str]:
    """``(replay, "")``: ``call`` captured in a CUDA graph, or ``(call, why)`` when it cannot be
    (the original call, still timed, and the one-line reason the row gives)."""
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(CAPTURE_WARMUP_CALLS):
                call()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
    except Exception as e:  # any refusal: the case is still timed, without a graph
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        torch.cuda.synchronize(device)
        return call, f"not captured in a CUDA graph: {type(e).__name__}: {first[:160]}"
    return graph.replay, ""
