"""A speed run's provenance, the sidecar ``results.json``: the suite's settings, the command,
the machine, versions and git state, the conventions of every column, the CUDA state that
decides timings besides the code, the machine's load, and at the end the matmul calibration,
the row counts and what was not run. Written atomically, first when the run starts (so an
interrupted run has one) and again when it ends."""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path as FilePath
from typing import Any

import pandas as pd
import torch

from attnbench.bench.config import SpeedSuite
from attnbench.bench.failures import one_line
from attnbench.bench.profiles import KERNELS_NAME, TRACES_DIR
from attnbench.bench.results import SAMPLES_NAME
from attnbench.bench.summary import COMPLEXITY_NAME, CSV_NAME
from attnbench.measure import machine
from attnbench.measure.flops import BACKWARD_FACTOR, MatmulAnchor
from attnbench.measure.timing import NOISY_SPREAD, Clock
from attnbench.runtime.outputs import write_text
from attnbench.runtime.portable import portable

SCHEMA_VERSION = 1

CONVENTIONS = {
    "time": (
        "milliseconds per call (clock column: wall = elapsed, process-cpu = CPU time of the "
        "process, cuda-events = GPU time): median and p20/p80 over interleaved rounds, each "
        "sample the mean of a block of calls; fwd runs under torch.no_grad(); fwdbwd is forward + "
        "autograd.grad of all inputs for a fixed random output gradient. On CUDA, with the "
        "suite's l2 = 'warm' (the default), the L2 cache is not flushed: a sample is a block of "
        "calls lasting at least block_s whose calls reuse the same inputs, as a layer's repeated "
        "calls would; with l2 = 'cold' a buffer of at least twice the L2 is written before "
        "every call, outside the timed region, and each call is timed by its own pair of "
        "events; with graph = true the samples are replays of a CUDA graph of the call (the "
        "l2, graph and graph_reason columns say which)"
    ),
    "noisy": f"(p80 - p20) / median > {NOISY_SPREAD}",
    "ref_ratio": (
        "median over rounds of (this case's sample / the reference's sample in the same round), "
        "reference = the same direction, causal flag, shape and dtype"
    ),
    "flops": (
        "forward: Mechanism.forward_flops, 2*B*H*pairs*(D+Dv) with attended pairs counted exactly "
        "('pairs') unless the mechanism declares its formula ('formula'); "
        f"fwdbwd: (1 + {BACKWARD_FACTOR}) x forward (backward = {BACKWARD_FACTOR}x forward, "
        "no recomputation counted); flops_fa: the same in flash-attention's convention "
        "(fwdbwd = 3.5 x forward); flops_executed: a block-sparse kernel's (FlexAttention) "
        "FLOPs with every pair of each block its BlockMask keeps counted (fwdbwd 3.5 x)"
    ),
    "roofline": (
        "median over rounds of (achieved FLOP/s / FLOP/s of a square matmul timed in the same "
        "round, same device, dtype and threads); matmul_flop_per_s is that matmul's rate over "
        "the group's rounds; roofline_fa: the same with flops_fa (fwdbwd = 3.5 x forward)"
    ),
    "memory": (
        "peak bytes above the inputs in an untimed pass: mem_fwd without autograd, mem_fwdbwd "
        "forward with autograd + backward; method dispatch-live-bytes (CPU: live tensor storage "
        "counted by a dispatch mode) or cuda-max-allocated (CUDA allocator peak)"
    ),
}


def cuda_state(suite: SpeedSuite, device: torch.device) -> dict[str, Any]:
    """What decides CUDA timings besides the code: TF32 flags, the kernel SDPA's own dispatch
    picks for each (dtype, head dim) of the suite (what ``softmax:efficient`` runs), and the SM
    clock after a spin-up of the GPU (one second of matmuls, so the first group is not timed on
    an idle clock)."""
    from attnbench.kernels.sdpa import default_backend

    state: dict[str, Any] = {
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }
    anchor = MatmulAnchor(device, torch.bfloat16, min(suite.matmul_size, 4096))
    t_end = time.perf_counter() + 1.0
    while time.perf_counter() < t_end:
        anchor()
    torch.cuda.synchronize(device)
    try:
        state["sm_clock_mhz"] = torch.cuda.clock_rate(device)
    except Exception as e:  # needs pynvml; not essential
        state["sm_clock_mhz"] = f"not read ({one_line(e, 80)})"
    picks = {}
    for dtype in suite.torch_dtypes():
        for d in suite.head_dims:
            for causal in suite.causal:
                q = torch.randn(1, 2, 1024, d, device=device, dtype=dtype)
                tag = f"{str(dtype).removeprefix('torch.')} d={d} {'causal' if causal else 'bidir'}"
                try:
                    picks[tag] = default_backend(q, q, q, causal=causal)
                except Exception as e:
                    picks[tag] = f"not read ({one_line(e, 80)})"
    state["sdpa_default_backend"] = picks
    return state


def command_line() -> list[str]:
    """sys.argv as the user typed it: ``attnbench run speed ...`` also for ``python -m``."""
    argv = list(sys.argv)
    if argv and (argv[0].endswith("__main__.py") or FilePath(argv[0]).name == "attnbench"):
        argv[0] = "attnbench"
    return argv


def _statuses(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["status"] for r in rows))


def write_json(path: FilePath, data: Mapping[str, Any]) -> None:
    """A sidecar, its paths made portable (:func:`attnbench.runtime.portable.portable`)."""
    data = portable(data, FilePath(path).parent)
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def load_warnings(watch: machine.LoadWatch, threads: int, busy_threads: int) -> list[str]:
    """What makes this machine a poor place to time, before the run: more threads than cores,
    other processes keeping the cores busy."""
    return [
        w
        for w in (
            machine.oversubscribed(threads),
            machine.busy_reason(watch.before[0] if watch.before else None, busy_threads),
        )
        if w
    ]


def start_sidecar(
    suite: SpeedSuite,
    device: torch.device,
    threads: int,
    command: Sequence[str] | None,
    retained: bool,
    watch: machine.LoadWatch,
    before: list[str],
) -> dict[str, Any]:
    """The sidecar as the run starts (``finished`` still None). On CUDA this spins the GPU up
    (:func:`cuda_state`)."""
    sidecar: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "kind": "attnbench-speed",
        "suite": suite.settings(),
        "command": shlex.join(command if command is not None else command_line()),
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "finished": None,
        "machine": machine.machine(device),
        "malloc": "glibc: freed memory retained" if retained else "default",
        "machine_class": machine.machine_class(
            device, threads, Clock(device, suite.timing.clock).name
        ),
        "versions": machine.versions(),
        "git": machine.git_state(),
        "conventions": CONVENTIONS,
        "files": {
            "rows": CSV_NAME,
            "complexity": COMPLEXITY_NAME,
            "samples": SAMPLES_NAME,
            **({"kernels": KERNELS_NAME} if suite.profile_calls else {}),
            **({"traces": TRACES_DIR} if suite.profile_calls and suite.profile_trace else {}),
        },
        "load": {"before_1_5_15min": list(watch.before) if watch.before else None},
        "warnings": before,
    }
    if device.type == "cuda":
        sidecar["cuda"] = cuda_state(suite, device)
    return sidecar


def calibration(
    suite: SpeedSuite, mm_rates: Mapping[str, list[float]], sizes: Mapping[str, int]
) -> dict[str, dict[str, float]]:
    """Per dtype, the rate of the roofline's matmul over the groups (timed in every group's
    rounds) and its size: the one timed (``sizes``, sized by time), at most ``matmul_size``."""
    return {
        dtype: {
            "matmul_size": sizes.get(dtype, suite.matmul_size),
            "matmul_size_max": suite.matmul_size,
            "flop_per_s_median": float(pd.Series(rates).median()),
            "flop_per_s_min": min(rates),
            "flop_per_s_max": max(rates),
            "groups": len(rates),
        }
        for dtype, rates in mm_rates.items()
    }


def finish_sidecar(
    sidecar: dict[str, Any],
    *,
    wall: float,
    interrupted: bool,
    stopped: str | None,
    calibration: dict[str, dict[str, float]],
    rows: list[dict[str, Any]],
    not_run: list[str],
    load: dict[str, Any] | None,
) -> None:
    """The sidecar as the run ends: when, how it ended, the calibration, the row counts, what
    was not run and the load during the run."""
    sidecar.update(
        finished=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        wall_s=round(wall, 2),
        interrupted=interrupted,
        stopped=stopped,
        calibration=calibration,
        counts={s: sum(1 for r in rows if r["status"] == s) for s in _statuses(rows)},
        noisy_rows=sum(1 for r in rows if r.get("noisy")),
        not_run=not_run,
        load=load,
    )
