"""Timing: a warm-up that absorbs compilation and autotuning, then interleaved timed rounds.

The clock is monotonic and device-aware. On the CPU a block of calls is timed with
``time.perf_counter_ns`` (the caller fixes and records the torch thread count); on CUDA with events
recorded around the block and one synchronisation per block, so launch overhead overlaps as it
does in real use.

``clock="cpu"`` (CPU only) times the CPU time the process consumed instead
(``time.process_time_ns``, all its threads). It answers "how much work does this call do", not
"how long did the user wait", and it does not see the time the process spent descheduled: on a
machine running more processes than it has cores, wall-clock samples of a few milliseconds are
preempted again and again and their ratios swing by 1.5-6x between runs (measured here at load
8 on 2 cores), while CPU time stays put. The CI regression gate uses it, with one thread.

Noise on a shared machine is fought in two ways: medians and the p20..p80
spread instead of the mean, and *interleaving*: every member of a group (the mechanisms measured
at one length) is timed once per round, A B C A B C ..., so that a burst of load from another
process hits all of them alike. A ratio taken per round between two members (``paired_ratio``)
then cancels most of that load.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

#: A timing is flagged noisy when its p20..p80 spread exceeds this fraction of its median.
#: torch.utils.benchmark warns at IQR (p25..p75) / median > 10 %; p20..p80 is a slightly wider
#: band, so the same 10 % is a slightly stricter test, which suits the few rounds taken here.
NOISY_SPREAD = 0.10

#: What a suite's ``clock`` may be (see the module docstring).
CLOCKS = ("wall", "cpu")

#: Never take more warm-up calls than this, however short a call is (time is the usual limit).
MAX_WARMUP_CALLS = 200


@dataclass(frozen=True)
class TimingPolicy:
    """How long to warm up and how many rounds to time; a suite file's ``[timing]`` table."""

    warmup_calls: int = 2  # at least this many untimed calls (the first compiles/autotunes)
    warmup_s: float = 0.05  # ...and at least this long, so caches and allocators settle
    rounds: int = 5  # timed rounds at most (one sample per member per round)
    min_rounds: int = 3  # never fewer rounds, even when a group is slow
    block_s: float = 0.005  # one sample averages enough calls to last this long (timer noise)
    group_budget_s: float = 4.0  # rounds stop once a group has taken this long (>= min_rounds)
    clock: str = "wall"  # "wall" (perf_counter / CUDA events) or "cpu" (process CPU time)
    retain_memory: bool = False  # keep freed memory in the process (see retain_freed_memory)
    #: The order of a round's samples (see :func:`round_order`): "rotate" (each round starts one
    #: place further on, so every member takes every position equally often), "fixed",
    #: "reversed" or "shuffle" (a seeded random order per round).
    order: str = "rotate"
    #: GPU only (see :mod:`attnbench.measure.gpu_timing`): "cold" flushes the L2 before every
    #: timed call, "warm" (what None means on a GPU) does not; True: time CUDA graph replays.
    l2: str | None = None
    graph: bool = False


#: Accepted values of TimingPolicy.order.
ORDERS = ("rotate", "fixed", "reversed", "shuffle")


def round_order(count: int, round_index: int, order: str = "rotate") -> list[int]:
    """The positions 0..count-1 in the order round ``round_index`` times them.

    A fixed order gives each member the same neighbour before it in every round; on a GPU (clock
    boost after an idle gap, caches left warm or cold by the previous kernel) and on a CPU
    (frequency, page cache) that can favour a position, and a ratio between two members then
    measures their places as well as their speeds. "rotate" is a cyclic Latin square: over
    ``count`` rounds every member takes every position once, and follows every other member.
    """
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; accepted: {', '.join(ORDERS)}")
    positions = list(range(count))
    if order == "fixed" or count < 2:
        return positions
    if order == "reversed":
        return positions[::-1]
    if order == "shuffle":
        random.Random(round_index).shuffle(positions)
        return positions
    start = round_index % count
    return positions[start:] + positions[:start]


@dataclass(frozen=True)
class Stats:
    """Median and 20th/80th percentiles of a set of samples (same unit as the samples)."""

    median: float
    p20: float
    p80: float
    n: int

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the relative width of the middle 60 % of the samples."""
        return (self.p80 - self.p20) / self.median if self.median > 0 else math.inf

    @property
    def noisy(self) -> bool:
        return self.spread > NOISY_SPREAD


def stats(samples: Sequence[float]) -> Stats:
    """Median, p20 and p80 (linear interpolation between order statistics)."""
    if not samples:
        raise ValueError("no samples")
    arr = np.asarray(samples, dtype=np.float64)
    p20, med, p80 = np.percentile(arr, [20, 50, 80])
    return Stats(float(med), float(p20), float(p80), len(arr))


def per_round_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a[r] / b[r] for every round r: a's time relative to b's, round by round (the samples
    ``attnbench compare`` tests; they are kept in the run's samples file)."""
    return [x / y for x, y in zip(a, b, strict=True)]


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> Stats:
    """Statistics of a[r] / b[r] over rounds r: a's time relative to b's, round by round."""
    return stats(per_round_ratios(a, b))


def retain_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in the process instead of returning it to the OS.

    PyTorch's CPU allocator does not cache: a path that allocates a 4 MiB temporary per step gets
    fresh pages from the kernel each time, and faulting them in and zeroing them is system time
    that depends on the rest of the machine (transparent huge pages, memory pressure). Measured
    here: flash-tiled took 2,000-4,300 page faults per call and its CPU time was bimodal between
    otherwise identical processes (1.7x). With freed memory kept in the heap (what the CUDA
    caching allocator does on a GPU) the faults vanish. Process-wide and irreversible; only
    suites that ask for it (``[timing] retain_memory = true``, the CI grid) call it. Returns
    whether it took effect (False off glibc).
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    big = 1 << 30  # allocations below 1 GiB come from the heap; the heap is never trimmed
    return bool(mallopt(m_mmap_threshold, big)) and bool(mallopt(m_trim_threshold, big))


class Clock:
    """Times blocks of calls on one device; ``time_block`` returns seconds per call."""

    def __init__(self, device: torch.device | str, kind: str = "wall") -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if kind not in CLOCKS:
            raise ValueError(f"clock {kind!r}: accepted: {', '.join(CLOCKS)}")
        if kind == "cpu" and self.cuda:
            raise ValueError("clock 'cpu' measures CPU time: a CPU device only")
        self.cpu_time = kind == "cpu"
        self.name = "cuda-events" if self.cuda else ("process-cpu" if self.cpu_time else "wall")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def time_block(self, fn: Callable[[], object], calls: int) -> float:
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(self.device)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / calls
        now = time.process_time_ns if self.cpu_time else time.perf_counter_ns
        t0 = now()
        for _ in range(calls):
            fn()
        return (now() - t0) / 1e9 / calls


@dataclass(frozen=True)
class WarmUp:
    """What the warm-up learnt: the first call alone (compilation, autotuning, allocator growth)
    and a per-call estimate from the later calls, used to size blocks and rounds."""

    first_s: float
    per_call_s: float
    calls: int


def warm_up(fn: Callable[[], object], clock: Clock, policy: TimingPolicy) -> WarmUp:
    """Call ``fn`` until at least ``warmup_calls`` calls and ``warmup_s`` seconds have passed."""
    first = clock.time_block(fn, 1)
    later: list[float] = []
    spent = first
    while len(later) + 1 < MAX_WARMUP_CALLS and (
        len(later) + 1 < policy.warmup_calls or spent < policy.warmup_s
    ):
        t = clock.time_block(fn, 1)
        later.append(t)
        spent += t
    per_call = float(np.median(later)) if later else first
    return WarmUp(first, per_call, len(later) + 1)


def block_calls(per_call_s: float, policy: TimingPolicy) -> int:
    """Calls per sample so that one sample lasts at least ``block_s``."""
    if per_call_s <= 0:
        return 1
    return max(1, math.ceil(policy.block_s / per_call_s))
