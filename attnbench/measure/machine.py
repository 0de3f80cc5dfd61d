"""Provenance for a results sidecar: the machine, the versions, the git state.

``machine_class`` is what two runs must share for their times to be compared: the device type,
its model name, the thread count and the clock. A CPU's model name can be generic (a virtual
machine often reports "Intel(R) Xeon(R) Processor" whatever the host is), so the sidecar also
records ``cpu_signature``: vendor, family/model/stepping and the instruction sets the kernels
dispatch on. A baseline from another class or signature is skipped, not failed.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import attnbench
from attnbench.core import capabilities
from attnbench.core.errors import AttnbenchError


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty off Linux)."""
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        if not line.strip():
            if info:
                break
            continue
        name, _, value = line.partition(":")
        info.setdefault(name.strip().lower(), value.strip())
    return info


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform says."""
    return (
        _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown cpu"
    )


#: Instruction-set extensions that change which CPU kernels run (and so relative times).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "sve")


def cpu_signature() -> str:
    """``GenuineIntel 6/143/8 avx2,avx512f,...; torch AVX512``: what tells two CPUs apart when
    their model names agree. Runs whose signatures differ are not compared."""
    info = _cpuinfo()
    parts = []
    if info:
        ident = "/".join(info.get(k, "?") for k in ("cpu family", "model", "stepping"))
        flags = set(info.get("flags", info.get("features", "")).split())
        isa = ",".join(f for f in ISA_FLAGS if f in flags) or "-"
        parts.append(f"{info.get('vendor_id', platform.machine())} {ident} {isa}")
    else:
        parts.append(platform.machine() or "unknown")
    with contextlib.suppress(AttributeError, RuntimeError):  # older torch: no such query
        parts.append(f"torch {torch.backends.cpu.get_cpu_capability()}")
    return "; ".join(parts)


def memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory_bytes() -> int | None:
    """Memory a new allocation can get without swapping: MemAvailable on Linux, else the total."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return memory_bytes()


#: The share of the available memory a command may plan to fill (the rest: the OS, the other
#: processes, the allocator's slack): what :func:`refuse_if_too_big` refuses beyond.
MEMORY_SHARE = 0.8


def refuse_if_too_big(
    option: str, value: int, need: Callable[[int], float], what: str, instead: str = ""
) -> None:
    """Refuse ``option value``, before anything is allocated or written, when ``need(value)``
    bytes (``need`` grows with the value) do not fit in MEMORY_SHARE of the available memory:
    one line with the size, what is available and the largest value that fits. An allocation
    that fails halfway is a traceback (``Cannot allocate memory``), or the machine swaps."""
    found = too_big({option: value}, lambda sizes: need(sizes[option]), what)
    if found is not None:
        raise AttnbenchError(found[1] + instead)


def too_big(
    sizes: dict[str, int],
    need: Callable[[dict[str, int]], float],
    what: str,
    defaults: dict[str, int] | None = None,
    memory: int | None = None,
    has: str = "available",
    share: float = MEMORY_SHARE,
    sep: str = " ",
) -> tuple[str, str] | None:
    """When ``need(sizes)`` bytes do not fit in ``share`` of ``memory`` (default: MEMORY_SHARE
    of the memory available now): the size to blame and one line saying so, else None. The size
    blamed is the one furthest above its ``defaults`` value (its plain value without one) among
    those that alone can be brought down far enough; the line gives the sizes' bytes, what this
    machine ``has`` and the largest value of that size that fits with the others as asked
    (a size and its value joined by ``sep``: ``" = "`` for a config's keys, ``model.d_model =
    4000000``; ``"="`` for ``--param window=100``)::

        --d-model 4000000: the weights ..., about 954 TiB, and this machine has 19.2 GiB
        available; accepted here: --d-model up to about 9000
    """
    memory = available_memory_bytes() if memory is None else memory
    limit = share * memory if memory else None
    if limit is None or need(sizes) <= limit:
        return None
    defaults = defaults or {}
    order = sorted(sizes, key=lambda k: -sizes[k] / max(1, defaults.get(k, 1)))
    fits = [k for k in order if need({**sizes, k: 1}) <= limit]
    name = (fits or order)[0]
    low, high = 0, sizes[name]  # need(low) fits (or low is 0), need(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if need({**sizes, name: mid}) <= limit else (low, mid)
    accepted = f"{name} up to about {low}" if low else f"none: even {name} 1 needs too much"
    return name, (
        f"{name}{sep}{sizes[name]}: {what}, about {byte_size(need(sizes))}, "
        f"and this machine has "
        f"{byte_size(memory)} {has}; accepted here: {accepted}"
    )


def byte_size(count: float) -> str:
    """``19.2 GiB``, ``954 TiB``, ``2.1e+12 PiB``: a number of bytes for a message."""
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if count >= scale or unit == "MiB":
            value = count / scale
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.3g} {unit}"
    return f"{count:.0f} bytes"  # pragma: no cover


def device_memory_bytes(device: torch.device) -> int | None:
    """The total memory of ``device`` (None when it cannot be read): the GPU's once CUDA is
    started in this process; before, this machine's RAM stands in for it, since starting CUDA
    only to size a request would hold a context on the GPU in a process that may never use it
    (a sweep's driver, torchrun's ranks before each picks its device). A stand-in is enough for
    what it decides: a request no machine holds at all."""
    if device.type == "cuda" and torch.cuda.is_initialized():
        try:
            return int(torch.cuda.get_device_properties(device).total_memory)
        except (RuntimeError, AssertionError):  # no driver, another process's device...
            return None
    return memory_bytes()


def threads_refused(threads: int, cores: int | None = None) -> str | None:
    """Why ``threads`` torch threads are refused here (None when they are not): more than the
    usable cores, they only wait on each other (each process also starts a pool of that many
    threads, and a count beyond the OS's overflows torch)."""
    cores = cores or usable_cores()
    if threads <= cores:
        return None
    return (
        f"this machine has {cores} usable core{'s' if cores != 1 else ''}; accepted here: "
        f"0 (one thread per core) to {cores}"
    )


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), else every logical core."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return os.getloadavg()
    except (OSError, AttributeError):
        return None


def busy_reason(load_1min: float | None, threads: int, cores: int | None = None) -> str | None:
    """Why timings on this machine will be noisy, from the load other processes put on it
    (None when they leave the run's ``threads`` cores free): the 1-minute load average counts
    runnable threads, so anything above ``cores - threads`` competes for the run's cores."""
    if load_1min is None:
        return None
    cores = cores or usable_cores()
    if load_1min <= cores - threads + 0.5:
        return None
    return (
        f"the machine is busy: other processes' load {load_1min:.1f} on {cores} cores, and this "
        f"run uses {threads} thread{'s' if threads != 1 else ''}; timings will be noisy and slow "
        "cases more often skipped (compare ratios measured in the same run, or run on a quiet "
        "machine)"
    )


def oversubscribed(threads: int, cores: int | None = None) -> str | None:
    """Why ``threads`` torch threads will run slowly here (None when they fit the cores)."""
    cores = cores or usable_cores()
    if threads <= cores:
        return None
    return (
        f"{threads} threads on {cores} usable cores: torch's threads will wait on each other "
        f"(many times slower and noisier); use at most {cores}"
    )


class LoadWatch:
    """The machine's 1-minute load average before a run and during it, sampled every ``every``
    seconds on a daemon thread (it sleeps in between: no measurable cost). ``summary()`` is what
    the speed sidecar records: ``others_before`` is the load other processes put on the machine
    as the run started; ``others_during`` estimates it during the run (the median load seen, less
    the run's own threads). Linux counts threads waiting on the disk too, and the 1-minute
    average trails by about a minute."""

    def __init__(self, threads: int, every: float = 5.0) -> None:
        self.threads = threads
        self.every = every
        self.before = load_average()
        self.during: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="attnbench-load", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            now = load_average()
            if now is not None:
                self.during.append(now[0])

    def start(self) -> LoadWatch:
        if self.before is not None:
            self._thread.start()
        return self

    def stop(self) -> dict[str, Any] | None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)
        if self.before is None:
            return None
        after = load_average()
        if after is not None:
            self.during.append(after[0])
        during = sorted(self.during)
        median = during[len(during) // 2] if during else None
        return {
            "cores": usable_cores(),
            "threads": self.threads,
            "before_1_5_15min": [round(x, 2) for x in self.before],
            "after_1_5_15min": [round(x, 2) for x in after] if after is not None else None,
            "during_1min_median": round(median, 2) if median is not None else None,
            "during_1min_max": round(during[-1], 2) if during else None,
            "samples": len(during),
            "others_before": round(self.before[0], 2),
            "others_during": None if median is None else round(max(0.0, median - self.threads), 2),
        }


def device_name(device: torch.device) -> str:
    """What the ``device_name`` column holds: the GPU's name, or the CPU's model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def machine_class(device: torch.device, threads: int, clock: str) -> str:
    """``cpu|Intel(R) Xeon(R) Processor|threads=2|clock=wall``: runs of one class have comparable
    times."""
    return f"{device.type}|{device_name(device)}|threads={threads}|clock={clock}"


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cpu_signature": cpu_signature(),
        "logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_bytes": memory_bytes(),
        "platform": platform.platform(),
        "gpu": None,
        "gpu_memory_bytes": None,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_bytes"] = props.total_memory
    return info


def versions() -> dict[str, Any]:
    """The software a result was measured with (every experiment records this one dict)."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "triton": capabilities.package_version("triton"),
        "numpy": capabilities.package_version("numpy"),
        "attnbench": attnbench.__version__,
        "libraries": capabilities.library_versions(),  # the library-backed paths' packages
    }


def resolve_device(name: str, source: str = "--device") -> torch.device:
    """``auto``: the GPU when there is one, else the CPU; ``cpu``, ``cuda``, ``cuda:N``, ``mps``.
    A device that is not here is an error naming ``source`` (where the name came from)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise AttnbenchError(
            f"{source}: unknown device {name!r}; accepted: auto, cpu, cuda, cuda:N, mps"
        )
    missing = (device.type == "cuda" and not torch.cuda.is_available()) or (
        device.type == "mps" and not torch.backends.mps.is_available()
    )
    if device.type == "cuda" and not missing and device.index is not None:
        missing = device.index >= torch.cuda.device_count()
    if missing:
        raise AttnbenchError(
            f"{source}: device {name!r}: no GPU of that kind is visible to torch here; "
            "accepted here: auto, cpu"
        )
    return device


#: At most this many changed files are named in a git state.
CHANGED_LISTED = 40


def git_state(outputs: Path | None = None) -> dict[str, Any]:
    """sha, branch and dirty flag of the checkout the attnbench package was imported from, and
    which tracked files differ from that sha (``changed``, relative to the checkout, at most
    CHANGED_LISTED of them). Files under ``outputs`` (the run's own output folder, when it is
    inside the checkout: a committed result being remade) are listed apart (``outputs_changed``)
    and do not make the checkout dirty: the code that ran is what ``dirty`` is about."""
    root = Path(attnbench.__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None  # porcelain lines start with " "

    sha = git("rev-parse", "HEAD")
    if sha is None:
        return {"sha": None, "branch": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    state: dict[str, Any] = {"sha": sha.strip(), "branch": branch.strip() if branch else None}
    if status is None:
        return state | {"dirty": None}
    changed = [line[3:].split(" -> ")[-1] for line in status.splitlines() if line.strip()]
    inside = _inside(root, outputs)
    own = [f for f in changed if inside is not None and (f + "/").startswith(inside + "/")]
    code = [f for f in changed if f not in own]
    return state | {
        "dirty": bool(code),
        "changed": code[:CHANGED_LISTED] + (["..."] if len(code) > CHANGED_LISTED else []),
        "outputs_changed": len(own),
    }


def _inside(root: Path, folder: Path | None) -> str | None:
    """``folder`` relative to ``root`` (posix), or None when it is not inside it."""
    if folder is None:
        return None
    try:
        return Path(folder).resolve().relative_to(root).as_posix()
    except ValueError:
        return None
