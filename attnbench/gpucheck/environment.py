"""The environment record of ``attnbench gpu-check`` (``OUT/env.json``): what decides whether a
GPU result can be compared with another, written before anything runs.

The GPU (name, memory, multiprocessors, compute capability, L2 size), the driver and clocks as
``nvidia-smi`` reports them, the versions (torch, CUDA, cuDNN, Triton, the library-backed paths'
packages), which SDPA backend takes a bf16 call at head dims 64 and 128 and which one SDPA picks
by itself, the TF32 flags, dynamo's recompile limits, the compile caches, and the processes
already using the GPU (timings are only worth keeping with the GPU to the run alone).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from attnbench.measure import machine

Run = Callable[..., subprocess.CompletedProcess]
SMI_QUERY = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw"


def nvidia_smi(run: Run = subprocess.run, *args: str) -> str:
    """``nvidia-smi``'s answer (CSV), or why there is none."""
    cmd = ["nvidia-smi", *(args or (f"--query-gpu={SMI_QUERY}", "--format=csv"))]
    try:
        done = run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi not available ({e})"
    return (done.stdout or "").strip() or (done.stderr or "").strip()


def gpu_processes(run: Run = subprocess.run, own: int | None = None) -> list[str]:
    """The other processes using the GPU (``pid, name, memory``), this one left out."""
    text = nvidia_smi(
        run, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"
    )
    if text.startswith("nvidia-smi not available"):
        return []
    own = os.getpid() if own is None else own
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return [line for line in lines if line.split(",")[0].strip() != str(own)]


def gpu_properties(device: torch.device) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "memory_bytes": props.total_memory,
        "multiprocessors": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "l2_bytes": int(getattr(props, "L2_cache_size", 0) or 0),
    }


def sdpa_backends(device: torch.device) -> dict[str, str]:
    """For a bf16 call at head dims 64 and 128: whether each pinned SDPA backend takes it (or
    torch's reason), and which backend SDPA's own dispatch runs (``softmax:efficient``)."""
    from attnbench.kernels.sdpa import BACKENDS, backend_reasons, default_backend

    out = {}
    for d in (64, 128):
        q = torch.randn(1, 4, 256, d, device=device, dtype=torch.bfloat16)
        for name in BACKENDS:
            why = backend_reasons(name, q, q, q, False, False)
            out[f"{name} d={d}"] = "available" if not why else "; ".join(why)
        out[f"default d={d}"] = default_backend(q, q, q, causal=False)
    return out


def dynamo_limits() -> dict[str, Any]:
    import torch._dynamo.config as dynamo_config

    keys = ("recompile_limit", "accumulated_recompile_limit", "fail_on_recompile_limit_hit")
    return {key: getattr(dynamo_config, key, None) for key in keys}


def environment(caches: Mapping[str, str], run: Run = subprocess.run) -> dict[str, Any]:
    """The record (see the module docstring); ``caches``: the compile caches' description."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_model": machine.cpu_model(),
        "logical_cores": os.cpu_count(),
        "versions": machine.versions(),
        "cuda_available": torch.cuda.is_available(),
        "compile_caches": dict(caches),
        "tf32": {
            "matmul": torch.backends.cuda.matmul.allow_tf32,
            "cudnn": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        },
        "dynamo": dynamo_limits(),
    }
    if info["cuda_available"]:
        device = torch.device("cuda")
        info["gpu"] = gpu_properties(device)
        info["gpu_count"] = torch.cuda.device_count()
        info["sdpa"] = sdpa_backends(device)
        info["nvidia_smi"] = nvidia_smi(run)
        info["other_gpu_processes"] = gpu_processes(run)
    return info


def write_environment(path: Path, info: Mapping[str, Any]) -> Path:
    from attnbench.runtime.outputs import write_text

    write_text(path, json.dumps(info, indent=2, default=str) + "\n")
    return path
