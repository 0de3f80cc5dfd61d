"""The GPU runbook: numbered steps that check and measure attnbench on a CUDA machine.

    PYTHONPATH=. python scripts/gpu_check.py STEP OUT [--dry-run] [--force] [--budget-s 540]

STEP is a number or a name (``all`` runs every step in order); OUT is a folder. Each step writes
its logs, CSVs and sidecars to ``OUT/<number>-<name>/`` and a ``DONE`` file when it finished; a
step whose ``DONE`` exists is skipped (resume), unless ``--force``; a speed step stopped by its
budget continues its sweep with ``attnbench run speed --resume`` when run again. Steps are
independent: any can run alone, in any order, each in its own command. Every step stops itself
within ``--budget-s`` seconds (default 540, under a 10-minute command): a speed sweep is sent
SIGINT, which ends it cleanly with every finished row on disk.

  0 env          GPU, driver, versions, clocks, SDPA backends, dynamo limits, TF32 flags
  1 tests-fused  pytest -m gpu on the fused paths that are not FlexAttention (SDPA, Triton)
  2 tests-flex   pytest -m gpu on the FlexAttention paths
  3 dense        softmax efficient / sdpa-flash / sdpa-efficient / sdpa-cudnn, n = 1k..64k,
                 causal and not, bf16, head dims 128 then 64, fwd and fwd+bwd
  4 sparse       local (window 512), bigbird, longnet, atrous and softmax-logn flex at 8k and
                 32k against dense flash and dense cuDNN
  5 triton       causal linear, retention and gau (Triton) against causal flash and cuDNN,
                 n = 1k..64k: the crossovers
  6 extrapolate  a few hundred steps of each ``run extrapolate --preset paper`` training, all six
                 as parallel shard processes (as the real run shares the GPU): the step time
  7 flash-batch1 FLASH (Triton) at batch 1, n = 8k and 64k
  8 profile      torch.profiler: top kernels of one call of causal linear:triton (and FLA's
                 chunk kernel) at 8k, SDPA default and cuDNN at 16k, and
                 bidirectional flash:triton at 16k
  9 order        the same dense cases timed with a round's order fixed, reversed and rotated
  10 paper-rows  the paper model's attention (hidden 384, 6 x 64) per extrapolation row, forward
  11 tests-libraries  pytest -m "gpu and library": the library-backed paths (FLA, SageAttention,
                 xFormers)
  12 libraries   FLA's causal chunk / recurrent kernels beside attnbench's Triton kernels and
                 dense flash / cuDNN, 1k..64k
  13 sage        SageAttention (8-bit, forward) beside the exact dense kernels, 1k..64k
  14 local-libraries  the causal window by flex, FLA, xFormers and local-attention, 8k and 32k
  15 gaps        round 2's missing rows: Triton causal 64k, FLASH batch 1 64k, dense hd64 causal
  16 tests-all   pytest -m gpu: every GPU test in one run (steps 1, 2 and 11 together)
  17 tests-rest  pytest -m gpu on what round 3's step 16 did not reach, and the refusals since
  18 libraries-long  step 12 at n = 16k and 64k (round 3 reached 1k and 4k)
  19 tests-kernels  pytest -m gpu on the kernel tests rounds 3 and 4 did not reach (no FLA:
                 nothing autotunes for minutes)
  20 tests-fla   pytest -m gpu on FLA's registry cases round 4 did not reach
  21 libraries-fwd  causal linear attention and retention, ours and FLA's chunk kernels,
                 forward, beside causal flash and cuDNN at 8k, 16k and 64k (round 4: 8k, 16k)

``--dry-run`` runs every step on the CPU with tiny shapes and the paths a CPU has (the tests
steps only collect), so that CI finds a typo in this script, not the GPU. Nothing here needs a
network or an install: only what ``PYTHONPATH=. python -m attnbench`` needs.

Compile caches: TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR default to ``.gpucache/`` in the
repository (ignored by git), so a second command on the same machine reuses the first one's
compiled kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BUDGET_S = 540


@dataclass(frozen=True)
class Context:
    out: Path  # this step's folder
    dry: bool
    budget_s: float
    python: str = sys.executable
    force: bool = False  # start a stopped step over instead of resuming it

    def attnbench(self, *args: str) -> list[str]:
        return [self.python, "-m", "attnbench", *args]


def env_vars() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    cache = ROOT / ".gpucache"
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    env.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
    # The allocator's segments grow instead of fragmenting across lengths (memory rows).
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    return env


def run(ctx: Context, name: str, cmd: list[str], budget_s: float | None = None) -> int:
    """Run ``cmd`` with its output in ``OUT/<step>/<name>.log``; SIGINT at the budget (a clean
    stop for attnbench), SIGKILL 30 s later. Returns the exit code (124 when stopped)."""
    budget = budget_s if budget_s is not None else ctx.budget_s
    log = ctx.out / f"{name}.log"
    with log.open("w") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env_vars(), cwd=ROOT)
        code = wait_until(proc, time.monotonic() + budget)
        if code == 124:
            f.write(f"\n[gpu_check] stopped after {budget:.0f} s (budget)\n")
        return code


# --------------------------------------------------------------------------------------------
# Step 0: the environment
# --------------------------------------------------------------------------------------------


def step_env(ctx: Context) -> int:
    import torch

    info: dict = {"python": sys.version.split()[0], "platform": platform.platform()}
    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    from attnbench.core import capabilities

    info["libraries"] = capabilities.library_versions()
    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_bytes"] = props.total_memory
        info["multiprocessors"] = props.multi_processor_count
        info["capability"] = f"{props.major}.{props.minor}"
        info["cudnn"] = torch.backends.cudnn.version()
        info["sdpa"] = sdpa_backends()
    info["tf32"] = {
        "matmul": torch.backends.cuda.matmul.allow_tf32,
        "cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    import torch._dynamo.config as dynamo_config

    info["dynamo"] = {
        key: getattr(dynamo_config, key, None)
        for key in ("recompile_limit", "accumulated_recompile_limit", "fail_on_recompile_limit_hit")
    }
    info["nvidia_smi"] = nvidia_smi()
    (ctx.out / "env.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    print(json.dumps(info, indent=2, default=str))
    return 0


def sdpa_backends() -> dict[str, str]:
    """For a bf16 call at head dim 64 and 128: which pinned SDPA backend runs, and which one
    F.scaled_dot_product_attention picks on its own (softmax:efficient's)."""
    import torch

    from attnbench.kernels.sdpa import BACKENDS, backend_reasons, default_backend

    out = {}
    for d in (64, 128):
        q = torch.randn(1, 4, 256, d, device="cuda", dtype=torch.bfloat16)
        for name in BACKENDS:
            why = backend_reasons(name, q, q, q, False, False)
            out[f"{name} d={d}"] = "available" if not why else "; ".join(why)
        out[f"default d={d}"] = default_backend(q, q, q, causal=False)
    return out


def nvidia_smi() -> str:
    query = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw"
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi not available ({e})"
    return done.stdout.strip() or done.stderr.strip()


# --------------------------------------------------------------------------------------------
# Steps 1 and 2: the GPU tests
# --------------------------------------------------------------------------------------------


def pytest_step(
    ctx: Context, selection: str, marker: str = "gpu", workers: int = 8, per_test_s: int = 300
) -> int:
    """pytest on the GPU tests (``selection``: a ``-k`` expression, empty for all of them),
    with up to ``workers`` xdist workers (GPU_TEST_WORKERS overrides) and at most ``per_test_s``
    seconds a test."""
    cmd = [ctx.python, "-m", "pytest", "-o", "addopts=", "-m", marker,
           *(["-k", selection] if selection else []),
           "-p", "no:cacheprovider", "-q", "-rfEs", "--tb=short", "tests/kernels/test_fused_gpu.py",
           f"--junitxml={ctx.out / 'junit.xml'}"]  # fmt: skip
    if ctx.dry:
        cmd.append("--collect-only")
    else:
        # The budget's SIGINT still prints the summary of what failed so far (pytest handles
        # KeyboardInterrupt); a per-test limit keeps one stuck compile from taking the step.
        if _has_module("xdist"):
            workers = int(os.environ.get("GPU_TEST_WORKERS", workers))
            cmd += ["-n", str(min(workers, os.cpu_count() or 1))]
        if _has_module("pytest_timeout"):
            cmd += ["--timeout", str(per_test_s)]
    return run(ctx, "pytest", cmd)


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# --------------------------------------------------------------------------------------------
# Steps 3-5: speed sweeps, each a suite file written beside its results
# --------------------------------------------------------------------------------------------


def suite_text(
    name: str, mechanisms: list[str], lengths: list[int], head_dims: list[int],
    causal: list[bool], reference: str, dry: bool, params: dict[str, dict] | None = None,
    tokens: int = 16384, hidden: int = 2048, order: str = "rotate",
    directions: tuple[str, ...] = ("fwd", "fwdbwd"), group_budget_s: float = 10.0,
) -> str:  # fmt: skip
    """A speed suite file: by default flash-attention's sweep shape (16k tokens a batch, hidden
    2048), bf16 on CUDA; in dry mode float32 on the CPU with tiny lengths and shapes."""
    if dry:
        lengths, head_dims = [64, 128], [32]
        device, dtype, tokens, hidden = "cpu", "float32", 256, 64
        group_budget_s = 2.0
    else:
        device, dtype = "cuda", "bfloat16"
    lines = [
        f'name = "{name}"',
        "[grid]",
        f"mechanisms = {json.dumps(mechanisms)}",
        f'device = "{device}"',
        f'dtypes = ["{dtype}"]',
        f"directions = {json.dumps(list(directions))}",
        f"causal = {json.dumps(causal)}",
        f"lengths = {json.dumps(lengths)}",
        f'reference = "{reference}"',
        "[shape]",
        f"tokens = {tokens}",
        f"hidden = {hidden}",
        f"head_dims = {json.dumps(head_dims)}",
        "[limits]",
        f"max_call_s = {1.0 if dry else 2.0}",
        "[timing]",
        "warmup_calls = 5",
        "warmup_s = 0.1",
        f"rounds = {3 if dry else 10}",
        "min_rounds = 3",
        f"block_s = {0.002 if dry else 0.02}",
        f"group_budget_s = {group_budget_s}",
        f"matmul_size = {256 if dry else 8192}",
        f'order = "{order}"',
    ]
    for mech, values in (params or {}).items():
        lines.append(f"[params.{mech}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def speed_step(ctx: Context, name: str, cpu_mechanisms: list[str], sub: str = "",
               budget_s: float | None = None, **suite) -> int:  # fmt: skip
    """One speed sweep: its suite file, results and log in ``OUT/<step>/[sub/]``."""
    if ctx.dry:  # the CPU has no fused paths: the same step shape with CPU paths
        suite["mechanisms"] = cpu_mechanisms
        suite["reference"] = cpu_mechanisms[0]
    where = ctx.out / sub if sub else ctx.out
    where.mkdir(parents=True, exist_ok=True)
    path = where / "suite.toml"
    text = suite_text(name, dry=ctx.dry, **suite)
    # A sweep stopped by its budget continues where it stopped (--resume keeps every finished
    # row), unless --force or the suite changed since.
    partial = where / "results" / "results.csv"
    resume = (partial.is_file() and not ctx.force and path.is_file() and path.read_text() == text
              and same_setup(where / "results" / "results.json"))  # fmt: skip
    path.write_text(text)
    cmd = ctx.attnbench("run", "speed", "--suite", str(path), "--out", str(where / "results"),
                        "--resume" if resume else "--overwrite")  # fmt: skip
    budget = ctx.budget_s if budget_s is None else budget_s
    started = time.perf_counter()
    log = f"{sub or 'speed'}{'-resumed' if resume else ''}"
    code = run(ctx, log, cmd, budget_s=budget)
    for attempt in range(1, 4):
        # 75: a sticky CUDA error ended the sweep; its process's CUDA context is gone, so the
        # rest runs in a fresh process, keeping every finished row (--resume).
        left = budget - (time.perf_counter() - started)
        if code != STICKY_EXIT or left < 30:
            break
        again = [c for c in cmd if c not in ("--overwrite", "--resume")] + ["--resume"]
        code = run(ctx, f"{sub or 'speed'}-resume{attempt}", again, budget_s=left)
    return code


def same_setup(sidecar: Path) -> bool:
    """Whether a stopped sweep's sidecar was written on this kind of machine (its GPU and CPU
    model), with these versions and this commit: only then are its rows continued, never mixed
    with rows of another machine or of other code."""
    from attnbench.measure import machine

    try:
        old = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return False
    import torch

    here = machine.machine(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    old_machine = old.get("machine") or {}
    same_machine = all(old_machine.get(key) == here.get(key) for key in ("gpu", "cpu_model"))
    return (
        same_machine
        and old.get("versions") == machine.versions()
        and (old.get("git") or {}).get("sha") == machine.git_state().get("sha")
    )


#: ``attnbench run speed``'s exit code after a sticky CUDA error (attnbench.cli.speed_cmd).
STICKY_EXIT = 75


#: The four SDPA backends: SDPA's own choice and the three pinned ones.
DENSE = ["softmax:efficient", "softmax:sdpa-flash", "softmax:sdpa-efficient", "softmax:sdpa-cudnn"]
#: The dense references every sparse or linear path is judged against: flash alone flatters
#: them, since cuDNN (SDPA's default on Hopper) is about twice as fast.
DENSE_REFS = ["softmax:sdpa-flash", "softmax:sdpa-cudnn"]


def step_dense(ctx: Context, name: str = "gpu-dense", **grid) -> int:
    """The four SDPA backends, causal and bidirectional, 1k..64k, head dims 64 and 128
    (``grid``: other lengths, head dims, causal flags, a sub-folder, a budget)."""
    grid = {"lengths": [1024, 4096, 16384, 65536], "head_dims": [128, 64],
            "causal": [True, False], **grid}  # fmt: skip
    return speed_step(
        ctx, name, ["softmax:efficient", "softmax-logn:efficient"],
        mechanisms=DENSE, reference="softmax:sdpa-cudnn", group_budget_s=6.0, **grid,
    )  # fmt: skip


def step_sparse(ctx: Context) -> int:
    """FlexAttention patterns at 8k and 32k against both dense references (bidirectional)."""
    return speed_step(
        ctx, "gpu-sparse",
        ["softmax:efficient", "local:efficient", "atrous:efficient"],
        mechanisms=[*DENSE_REFS, "local:flex", "local:local-attention", "bigbird:flex",
                    "longnet:flex", "atrous:flex", "softmax-logn:flex"],
        lengths=[8192, 32768], head_dims=[128], causal=[False],
        reference="softmax:sdpa-flash", params={"local": {"window": 512}},
    )  # fmt: skip


def step_triton(ctx: Context, name: str = "gpu-triton", **grid) -> int:
    """Causal linear attention and retention (Triton, chunkwise) against causal dense flash and
    cuDNN at 1k..64k: where each crosses over; and the Triton GAU kernel."""
    grid = {"lengths": [1024, 4096, 16384, 65536], **grid}
    return speed_step(
        ctx, name, ["softmax:efficient", "linear:chunkwise", "retention:chunkwise"],
        mechanisms=[*DENSE_REFS, "linear:triton", "retention:triton", "gau:triton"],
        head_dims=[128], causal=[True], reference="softmax:sdpa-cudnn", group_budget_s=6.0,
        **grid,
    )  # fmt: skip


def step_flash_batch1(ctx: Context, name: str = "gpu-flash-batch1", **grid) -> int:
    """FLASH (Triton) at batch 1, n = 8k and 64k: time(64k) / time(8k), linear would be 8."""
    grid = {"causal": [False, True], **grid}
    return speed_step(
        ctx, name, ["softmax:efficient", "flash:efficient"],
        mechanisms=["flash:triton", *DENSE_REFS],
        lengths=[8192, 65536], head_dims=[128], reference="", tokens=1, **grid,
    )  # fmt: skip


def step_order(ctx: Context) -> int:
    """Does the place in a timing round bias a ratio? The same dense cases timed with the
    round's order fixed, reversed and rotated (three runs, one after the other)."""
    worst = 0
    for order in ("fixed", "reversed", "rotate"):
        code = speed_step(
            ctx, f"gpu-order-{order}",
            ["softmax:efficient", "softmax-logn:efficient"], sub=order,
            budget_s=ctx.budget_s / 3,
            mechanisms=["softmax:efficient", "softmax:sdpa-cudnn", "softmax:sdpa-flash"],
            lengths=[4096, 16384], head_dims=[128], causal=[False],
            reference="softmax:sdpa-cudnn", order=order, group_budget_s=8.0,
        )  # fmt: skip
        worst = worst or code
    return worst


def step_paper_rows(ctx: Context) -> int:
    """The fused forward of each extrapolation row's attention at the paper model's shape
    (hidden 384, 6 heads of 64, bf16, 32k tokens a batch as in its evaluation), n = 64..4096:
    O and its RoPE variants (NTK, PI, YaRN: the same attention) run softmax, O+logn and E
    softmax-logn, O+local local (window L/2 = 32)."""
    return speed_step(
        ctx, "gpu-paper-rows",
        ["softmax:efficient", "softmax-logn:efficient", "local:efficient"],
        mechanisms=["softmax:efficient", "softmax:sdpa-cudnn", "softmax:sdpa-flash",
                    "softmax-logn:sdpa-cudnn", "softmax-logn:flex", "local:flex"],
        lengths=[64, 128, 256, 512, 1024, 2048, 4096], head_dims=[64], causal=[False],
        reference="softmax:sdpa-cudnn", params={"local": {"window": 32}},
        tokens=32768, hidden=384, directions=("fwd",), group_budget_s=3.0,
    )  # fmt: skip


#: FLA's kernels and ours for the same causal operators, beside causal dense flash and cuDNN.
LIBRARY_CAUSAL = ["linear:triton", "linear:fla-chunk", "linear:fla-recurrent",
                  "retention:triton", "retention:fla-chunk", "softmax:fla-parallel",
                  "softmax:xformers"]  # fmt: skip


def step_libraries(ctx: Context, name: str = "gpu-libraries",
                   lengths: tuple[int, ...] = (1024, 4096, 16384, 65536),
                   paths: list[str] = LIBRARY_CAUSAL, **suite) -> int:  # fmt: skip
    """FLA's chunk and recurrent kernels against attnbench's Triton kernels and dense
    flash / cuDNN, causal, 1k..64k, head dim 128, fwd and fwd+bwd: one run, so every ratio is
    taken round by round. ``paths`` and ``suite`` (directions, group budget): a narrower sweep."""
    return speed_step(
        ctx, name,
        ["softmax:efficient", "linear:chunkwise", "retention:chunkwise"],
        mechanisms=[*DENSE_REFS, *paths],
        lengths=list(lengths), head_dims=[128], causal=[True],
        reference="softmax:sdpa-cudnn", **{"group_budget_s": 6.0, **suite},
    )  # fmt: skip


def step_sage(ctx: Context) -> int:
    """SageAttention (8-bit, approximate, forward only) against the exact dense kernels and
    xFormers, causal and not, head dims 128 and 64."""
    return speed_step(
        ctx, "gpu-sage",
        ["softmax:efficient", "softmax:reference"],
        mechanisms=["softmax:sage", *DENSE_REFS, "softmax:efficient", "softmax:xformers"],
        lengths=[1024, 4096, 16384, 65536], head_dims=[128, 64], causal=[True, False],
        reference="softmax:sdpa-cudnn", directions=("fwd",), group_budget_s=4.0,
    )  # fmt: skip


def step_local_libraries(ctx: Context) -> int:
    """The causal local window (512) by FlexAttention, FLA's windowed parallel_attn, xFormers
    and lucidrains' local-attention, against dense flash and cuDNN, 8k and 32k."""
    return speed_step(
        ctx, "gpu-local-libraries",
        ["softmax:efficient", "local:efficient", "local:local-attention"],
        mechanisms=[*DENSE_REFS, "local:flex", "local:fla-parallel", "local:xformers",
                    "local:local-attention"],
        lengths=[8192, 32768], head_dims=[128], causal=[True],
        reference="softmax:sdpa-cudnn", params={"local": {"window": 512}},
    )  # fmt: skip


def step_gaps(ctx: Context) -> int:
    """The rows round 2's budgets cut: causal Triton linear / retention / GAU at 64k, FLASH at
    batch 1 and 64k, dense head dim 64 causal at 64k (each its own sweep, a third of the
    budget)."""
    third = ctx.budget_s / 3
    codes = [  # every sweep runs, whatever the one before returned
        step_triton(ctx, "gpu-gaps-triton-64k", sub="triton-64k", budget_s=third,
                    lengths=[65536]),
        step_flash_batch1(ctx, "gpu-gaps-flash-batch1", sub="flash-batch1", budget_s=third,
                          causal=[False]),
        step_dense(ctx, "gpu-gaps-dense-hd64", sub="dense-hd64", budget_s=third,
                   lengths=[65536], head_dims=[64], causal=[True]),
    ]  # fmt: skip
    return next((code for code in codes if code), 0)


#: The GPU tests round 3 (2026-11-27) did not reach in its one pytest (step 16 stopped at its
#: budget), and the ones added after it: a ``-k`` expression for step 17.
ROUND3_UNREACHED = " or ".join([
    "fla-chunk", "fla-recurrent", "fla-parallel", "retention:triton", "longnet:flex",
    "test_gau_kernel", "test_flex_kernel_fwd_bwd", "test_retention_kernel",
    "test_linear_kernel_normalised", "test_flash_global_kernel", "test_flex_runs_compiled",
    "test_gpu_refusals", "sage", "xformers",
])  # fmt: skip

#: What round 4's step 17 (2026-11-27) did not reach: 111 tests, listed in
#: results/speed/nvidia-h100/README.md. The kernel tests first, apart from FLA's cases, whose
#: first calls autotune for minutes and took round 4's budget.
ROUND4_KERNELS = " or ".join([
    "test_gau_kernel", "test_flex_kernel_fwd_bwd", "test_retention_kernel",
    "test_linear_kernel_normalised", "test_flash_global_kernel", "test_flex_runs_compiled",
    "test_gpu_refusals", "test_sage_bidirectional",
])  # fmt: skip
ROUND4_FLA = "fla-chunk or fla-recurrent"
#: What round 5 (2026-11-28) left: 19 of FLA's registry cases, all but one of its chunk kernels
#: (17 never started, 2 stopped at the per-test limit while FLA's backward autotuned in 11 workers
#: at once). Fewer workers and a longer per-test limit: compiling, not testing, is the cost.
ROUND5_FLA = "linear:fla-chunk or retention:fla-chunk"


def step_libraries_fwd(ctx: Context) -> int:
    """Causal linear attention and retention forward, ours and FLA's chunk kernels, beside
    causal dense flash and cuDNN at 8k, 16k and 64k (16k tokens a batch): the ratio the issue
    asks for at 8k, and where each crosses cuDNN."""
    return step_libraries(
        ctx, "gpu-libraries-fwd", (8192, 16384, 65536),
        ["linear:triton", "linear:fla-chunk", "retention:triton", "retention:fla-chunk"],
        directions=("fwd",), group_budget_s=4.0,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Step 8: what costs the time (torch.profiler)
# --------------------------------------------------------------------------------------------

#: (mechanism:path, n, causal, batch): the slow paths whose time a profile explains, FLA's
#: kernel for the same operator, and SDPA's own choice beside the pinned cuDNN backend (which
#: kernels does the default run, and what else?).
PROFILED = [("linear:triton", 8192, True, 2), ("flash:triton", 16384, False, 1),
            ("linear:fla-chunk", 8192, True, 2), ("softmax:efficient", 16384, False, 1),
            ("softmax:sdpa-cudnn", 16384, False, 1)]  # fmt: skip


def step_profile(ctx: Context) -> int:
    """One call each of PROFILED (forward, then forward+backward), after warm-up, under
    torch.profiler: the top kernels by GPU time in ``<name>.txt`` and ``<name>.csv``."""
    cmd = [ctx.python, str(Path(__file__).resolve()), "_profile", str(ctx.out)]
    if ctx.dry:
        cmd.append("--dry-run")
    return run(ctx, "profile", cmd)


def profile_main(out: Path, dry: bool) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from attnbench import registry
    from attnbench.core.inputs import make_inputs
    from attnbench.core.spec import Shape

    device = "cpu" if dry else "cuda"
    dtype = torch.float32 if dry else torch.bfloat16
    activities = [ProfilerActivity.CPU] + ([] if dry else [ProfilerActivity.CUDA])
    for item, n, causal, batch in PROFILED:
        mech, fn = registry.resolve(item)
        if dry:  # a CPU path of the same mechanism
            fn = next(p for p in mech.paths if p.kind != "fused")
            n = 256
        why = fn.unavailable(device, backward=True)
        if why:
            print(f"{item}: not profiled ({why})")
            continue
        params = mech.defaults
        shape = mech.shape_for(Shape(batch, 16 if not dry else 2, n, 128 if not dry else 32),
                               params)  # fmt: skip
        x = make_inputs(mech, shape, params, dtype=dtype, device=device, requires_grad=True)
        leaves = [t for t in x.values() if isinstance(t, torch.Tensor) and t.requires_grad]
        for direction in ("fwd", "fwdbwd"):

            def call(fn=fn, x=x, causal=causal, params=params, leaves=leaves, bwd=direction):
                if bwd == "fwd":  # as the speed suite times a forward: no autograd graph
                    with torch.no_grad():
                        return fn(**x, causal=causal, **params)
                out_ = fn(**x, causal=causal, **params)
                torch.autograd.grad(out_, leaves, torch.ones_like(out_))
                return out_

            for _ in range(3):  # compile, autotune, settle
                call()
            if device == "cuda":
                torch.cuda.synchronize()
            with profile(activities=activities) as prof:
                call()
                if device == "cuda":
                    torch.cuda.synchronize()
            averages = prof.key_averages()
            table = None
            for key in ("device_time_total", "cuda_time_total", "cpu_time_total"):
                try:  # the name of the GPU-time column changed across torch versions
                    table = averages.table(sort_by=key, row_limit=25)
                    break
                except (AttributeError, KeyError, ValueError):
                    continue
            table = table or "(no sortable time column in this torch's profiler)\n"
            tag = f"{mech.name}-{fn.name}-{'causal' if causal else 'bidir'}-n{n}-{direction}"
            (out / f"{tag}.txt").write_text(
                f"# {item} n={n} causal={causal} batch={batch} heads={shape.heads} "
                f"head_dim={shape.head_dim} {dtype} {direction}: one call after 3 warm-ups\n"
                + table
                + "\n"
            )
            rows = ["name,calls,device_time_total_us,cpu_time_total_us"]
            for e in averages:
                dev = getattr(e, "device_time_total", None)
                if dev is None:
                    dev = getattr(e, "cuda_time_total", 0.0)
                rows.append(f'"{e.key}",{e.count},{dev:.1f},{e.cpu_time_total:.1f}')
            (out / f"{tag}.csv").write_text("\n".join(rows) + "\n")
            print(f"{tag}: written")
    return 0


# --------------------------------------------------------------------------------------------
# Step 6: the extrapolation preset's step time
# --------------------------------------------------------------------------------------------


def step_extrapolate(ctx: Context) -> int:
    """The paper preset's trainings (O and E, seeds 0-2) as parallel shard processes, one
    training each (``--shard I/N``), sharing the GPU as the real run's shards do: one ``run
    extrapolate`` process trains its units one after another on a GPU. A few hundred steps
    each: the step time under that sharing, from each shard's training curve."""
    preset, steps, warmup = ("cpu", "4", "2") if ctx.dry else ("paper", "300", "100")
    variants, seeds = ("O", "E"), 1 if ctx.dry else 3
    shards = len(variants) * seeds
    common = ("run", "extrapolate", "--preset", preset, "--variants", ",".join(variants),
              "--seeds", str(seeds), "--steps", steps, "--warmup", warmup,
              "--checkpoints", str(ctx.out / "checkpoints"), "--overwrite")  # fmt: skip
    procs = []
    for i in range(shards):
        cmd = ctx.attnbench(
            *common, "--shard", f"{i}/{shards}", "--out", str(ctx.out / f"shard-{i}")
        )
        log = (ctx.out / f"shard-{i}.log").open("w")
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                       env=env_vars(), cwd=ROOT), log))  # fmt: skip
    deadline = time.monotonic() + ctx.budget_s
    codes = [wait_until(proc, deadline) for proc, _ in procs]
    for (_, log), code in zip(procs, codes, strict=True):
        if code == 124:
            log.write(f"\n[gpu_check] stopped after {ctx.budget_s:.0f} s (budget)\n")
        log.close()
    times = {}
    for i in range(shards):
        last = last_curve_row(ctx.out / f"shard-{i}" / "curves.csv")
        if last:
            ms = 1e3 * float(last["train_time_s"]) / max(1, int(last["step"]))
            key = f"{last['variant']}-seed{last['seed']}"
            times[key] = {"steps": int(last["step"]), "ms_per_step": round(ms, 2),
                          "tokens_per_s": float(last["tokens_per_s"])}  # fmt: skip
            print(f"{key}: {ms:.1f} ms per step over {last['step']} steps, {shards} shards at once")
    (ctx.out / "step_times.json").write_text(json.dumps(times, indent=2) + "\n")
    return max(codes) if codes else 0


def wait_until(proc: subprocess.Popen, deadline: float) -> int:
    """The process's exit code, or 124 after SIGINT at ``deadline`` (SIGKILL 30 s later)."""
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 124


def last_curve_row(path: Path) -> dict[str, str] | None:
    """The last row of a training's curves CSV (None when it has none)."""
    import csv

    if not path.is_file():
        return None
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else None


# --------------------------------------------------------------------------------------------


STEPS: dict[str, tuple[int, Callable[[Context], int]]] = {
    "env": (0, step_env),
    "tests-fused": (1, lambda ctx: pytest_step(ctx, "not flex")),
    "tests-flex": (2, lambda ctx: pytest_step(ctx, "flex")),
    "dense": (3, step_dense),
    "sparse": (4, step_sparse),
    "triton": (5, step_triton),
    "extrapolate": (6, step_extrapolate),
    "flash-batch1": (7, step_flash_batch1),
    "profile": (8, step_profile),
    "order": (9, step_order),
    "paper-rows": (10, step_paper_rows),
    "tests-libraries": (11, lambda ctx: pytest_step(ctx, "", marker="gpu and library")),
    "libraries": (12, step_libraries),
    "sage": (13, step_sage),
    "local-libraries": (14, step_local_libraries),
    "gaps": (15, step_gaps),
    # Every GPU test in one pytest (fused, flex and library paths), for a lease too short for
    # steps 1, 2 and 11 one after another: more workers, the GPU shared by them alone.
    "tests-all": (16, lambda ctx: pytest_step(ctx, "", workers=14)),
    "tests-rest": (17, lambda ctx: pytest_step(ctx, ROUND3_UNREACHED, workers=14)),
    # Round 3 reached n = 1k and 4k of step 12 (FLA autotunes for minutes on first calls).
    "libraries-long": (18, lambda ctx: step_libraries(ctx, "gpu-libraries-long", (16384, 65536))),
    "tests-kernels": (19, lambda ctx: pytest_step(ctx, ROUND4_KERNELS, workers=14)),
    "tests-fla": (20, lambda ctx: pytest_step(ctx, ROUND4_FLA, workers=14)),
    "libraries-fwd": (21, step_libraries_fwd),
    "tests-fla-chunk": (22, lambda ctx: pytest_step(ctx, ROUND5_FLA, workers=4, per_test_s=420)),
}


def resolve(step: str) -> list[str]:
    if step == "all":
        return list(STEPS)
    for name, (number, _) in STEPS.items():
        if step in (name, str(number)):
            return [name]
    accepted = ", ".join(f"{n} {name}" for name, (n, _) in STEPS.items())
    raise SystemExit(f"error: unknown step {step!r}; accepted: {accepted}, all")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_profile"]:  # step 8's worker process
        return profile_main(Path(argv[1]), "--dry-run" in argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", help="a step number or name, or 'all'")
    ap.add_argument("out", type=Path, help="output folder (one subfolder per step)")
    ap.add_argument("--dry-run", action="store_true", help="tiny CPU version of each step")
    ap.add_argument("--force", action="store_true", help="run steps that are already DONE")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="seconds a step may take before it is stopped cleanly")  # fmt: skip
    args = ap.parse_args(argv)
    names = resolve(args.step)
    worst = 0
    for name in names:
        number, fn = STEPS[name]
        out = args.out / f"{number}-{name}"
        if (out / "DONE").is_file() and not args.force:
            print(f"step {number} {name}: already done ({out / 'DONE'}); --force to redo")
            continue
        out.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        code = fn(Context(out, args.dry_run, args.budget_s, force=args.force))
        wall = time.perf_counter() - started
        status = "ok" if code == 0 else ("stopped at the budget" if code == 124 else f"exit {code}")
        print(f"step {number} {name}: {status} in {wall:.0f} s -> {out}")
        if code == 0:
            (out / "DONE").write_text(f"{wall:.1f} s\n")
        worst = worst or code
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
