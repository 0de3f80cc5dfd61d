"""Where a call's time goes: a few calls under ``torch.profiler``, as a table of what ran.

On CUDA the table holds the GPU's own activity, as CUPTI records it: every kernel, copy and
memset the calls launched, by name (a Triton kernel under its function's name, a library kernel
under its C++ name), with its launches and device time per call. On the CPU it holds operators
(``aten::...``, autograd nodes) by their *self* time, the time inside the operator less the
operators it called, so that the entries add up to the time spent in operators.

The profiled calls are extra, untimed calls. Two more calls run first under the profiler and are
not recorded (its warm-up steps: the first calls after the profiler starts cost many times a
steady one). Left out on both devices: the profiler's step markers (``ProfilerStep#N``) and, on
CUDA, user annotations (the spans torch.compile and ``record_function`` put on the GPU's
timeline, which cover kernels already counted). ``wall_us`` is the wall time per recorded call
under the profiler, its overhead included (on the CPU, a few microseconds an operator, inside
the self times too): compare ``busy_us`` with the case's timed median to see how much of a call
the device was idle (launch-bound on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

#: What a table's entries are, per device type.
SOURCES = {
    "cuda": "GPU activity recorded by CUPTI (kernels, copies, memsets), device time",
    "cpu": "operators, self time (time inside each operator less the operators it called)",
}


@dataclass(frozen=True)
class Entry:
    """One kernel (CUDA) or operator (CPU), per profiled call."""

    name: str
    kind: str  # "kernel", "memcpy", "memset" (CUDA); "operator" (CPU)
    launches: float  # launches (CUDA) or calls (CPU) per profiled call
    time_us: float  # device time (CUDA) or self time (CPU) per profiled call
    share: float  # of busy_us


@dataclass(frozen=True)
class CallProfile:
    """The profile of ``calls`` calls, per call, entries by time (largest first)."""

    calls: int
    source: str
    entries: tuple[Entry, ...]
    busy_us: float  # the entries' total per call
    wall_us: float  # wall time per call under the profiler


def kind_of(name: str) -> str:
    """A CUDA activity's kind from its name as CUPTI gives it (``Memcpy DtoD (Device ->
    Device)``, ``Memset (Device)``; anything else is a kernel)."""
    if name.startswith("Memcpy"):
        return "memcpy"
    if name.startswith("Memset"):
        return "memset"
    return "kernel"


def summarise(
    activity: Iterable[tuple[str, float, int]], calls: int, kind: Callable[[str], str]
) -> tuple[tuple[Entry, ...], float]:
    """``(name, time in us, launches)`` records of ``calls`` calls as entries per call, largest
    first (ties by name), and their total per call."""
    if calls < 1:
        raise ValueError(f"calls={calls}; accepted: >= 1")
    time_by: dict[str, float] = {}
    count_by: dict[str, int] = {}
    for name, time_us, count in activity:
        time_by[name] = time_by.get(name, 0.0) + float(time_us)
        count_by[name] = count_by.get(name, 0) + int(count)
    busy = sum(time_by.values())
    entries = tuple(
        Entry(
            name=name,
            kind=kind(name),
            launches=count_by[name] / calls,
            time_us=time_by[name] / calls,
            share=time_by[name] / busy if busy > 0 else 0.0,
        )
        for name in sorted(time_by, key=lambda n: (-time_by[n], n))
    )
    return entries, busy / calls


#: The profiler's own step markers (user annotations ``ProfilerStep#<step>``; ``ProfilerStep*``
#: in the key averages).
STEP_MARKER = "ProfilerStep"
#: Calls run under the profiler and not recorded before the recorded ones: the first calls after
#: it starts cost many times a steady call (a CPU SDPA decode step: 84 us recorded after one
#: such call, 18 after two, 13 steady).
WARMUP_STEPS = 2


def _cuda_activity(events) -> list[tuple[str, float, int]]:
    """The GPU's own activity in a profile: (name, device time in us, 1) per kernel, copy or
    memset; user annotations (device-side spans over kernels counted already) left out."""
    from torch.autograd import DeviceType

    return [
        (e.name, e.time_range.elapsed_us(), 1)
        for e in events
        if e.device_type == DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.name.startswith(STEP_MARKER)
    ]


def _cpu_activity(averages) -> list[tuple[str, float, int]]:
    """Operators by self CPU time (name, us, calls), from the profile's key averages; the
    profiler's step markers left out."""
    return [
        (a.key, a.self_cpu_time_total, a.count)
        for a in averages
        if a.self_cpu_time_total > 0 and not a.key.startswith(STEP_MARKER)
    ]


def profile_call(
    call: Callable[[], object],
    device: torch.device,
    calls: int,
    trace: Path | None = None,
) -> CallProfile:
    """Run ``call`` ``calls`` times under ``torch.profiler``, after ``WARMUP_STEPS`` more calls
    under it that are not recorded, and return where the time went; with ``trace``, also write
    the profile there as a Chrome trace (open it in Perfetto or chrome://tracing). ``call``
    should have been warmed up before (a first call's compilation would be profiled)."""
    import time

    from torch.profiler import ProfilerActivity, profile, schedule

    if calls < 1:
        raise ValueError(f"calls={calls}; accepted: >= 1")
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    sync()
    steps = schedule(wait=0, warmup=WARMUP_STEPS, active=calls, repeat=1)
    with profile(activities=activities, schedule=steps) as prof:
        for _ in range(WARMUP_STEPS):  # under the profiler, not recorded
            call()
            sync()
            prof.step()
        started = time.perf_counter()
        for i in range(calls):
            call()
            if i == calls - 1:  # the wall time ends with the last call, before the profiler's
                sync()  # last step (which stops it and gathers the events)
                wall = time.perf_counter() - started
            prof.step()
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
    if cuda:
        entries, busy = summarise(_cuda_activity(prof.events()), calls, kind_of)
    else:
        entries, busy = summarise(_cpu_activity(prof.key_averages()), calls, lambda _: "operator")
    return CallProfile(
        calls=calls,
        source=SOURCES["cuda" if cuda else "cpu"],
        entries=entries,
        busy_us=busy,
        wall_us=wall * 1e6 / calls,
    )
