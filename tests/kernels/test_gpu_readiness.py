"""What keeps a first GPU run from failing or misleading, checked on the CPU: the runbook's steps
in dry mode, the Triton kernel's retry on a shared-memory refusal, FlexAttention's dynamo limits,
and the rotary frequencies following their positions' device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_runbook_every_step_in_dry_mode(tmp_path):
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "all", str(tmp_path), "--dry-run",
         "--budget-s", "240"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    steps = ["env", "tests-fused", "tests-flex", "dense", "sparse", "triton", "extrapolate",
             "flash-batch1", "profile", "order", "paper-rows", "tests-libraries", "libraries",
             "sage", "local-libraries", "gaps", "tests-all", "tests-rest",
             "libraries-long"]  # fmt: skip
    for number, name in enumerate(steps):
        assert (tmp_path / f"{number}-{name}" / "DONE").is_file(), done.stdout
    sweeps = ["3-dense", "4-sparse", "5-triton", "7-flash-batch1", "10-paper-rows"]
    sweeps += [f"9-order/{order}" for order in ("fixed", "reversed", "rotate")]
    sweeps += ["12-libraries", "13-sage", "14-local-libraries", "18-libraries-long"]
    sweeps += [f"15-gaps/{sub}" for sub in ("triton-64k", "flash-batch1", "dense-hd64")]
    for step in sweeps:
        rows = (tmp_path / step / "results" / "results.csv").read_text().splitlines()
        assert len(rows) > 1 and all(",error," not in r for r in rows), step
    profiles = sorted(p.name for p in (tmp_path / "8-profile").glob("*.txt"))
    # dry: each profiled path's mechanism by a CPU path (linear and softmax twice, same files)
    assert len(profiles) == 6 and all("fwd" in p for p in profiles), profiles
    assert 'order = "fixed"' in (tmp_path / "9-order" / "fixed" / "suite.toml").read_text()
    assert 'order = "reversed"' in (tmp_path / "9-order" / "reversed" / "suite.toml").read_text()
    assert "collected" in (tmp_path / "1-tests-fused" / "pytest.log").read_text()
    # The extrapolation step: the trainings as parallel shard processes, each one's step time.
    times = json.loads((tmp_path / "6-extrapolate" / "step_times.json").read_text())
    assert set(times) == {"O-seed0", "E-seed0"} and all(
        t["ms_per_step"] > 0 for t in times.values()
    )
    libraries = (tmp_path / "11-tests-libraries" / "pytest.log").read_text()
    assert "fla-chunk" in libraries and "softmax:sage" in libraries and "sdpa" not in libraries
    every = (tmp_path / "16-tests-all" / "pytest.log").read_text()  # no -k: every GPU test
    assert " -k " not in every.splitlines()[0] and "fla-chunk" in every and "flex" in every
    rest = (tmp_path / "17-tests-rest" / "pytest.log").read_text()  # round 3's unreached
    assert "retention:triton" in rest and "test_gau_kernel" in rest and "sdpa-cudnn" not in rest
    # Resume: a finished step is not run again.
    again = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "0", str(tmp_path), "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0 and "already done" in again.stdout


def test_runbook_resumes_a_speed_step_stopped_by_its_budget(tmp_path):
    """A sweep stopped at its budget (no DONE) continues with --resume next time; --force
    starts it over."""
    extra: list[str] = []

    def step():
        return subprocess.run(
            [sys.executable, "scripts/gpu_check.py", "7", str(tmp_path), "--dry-run", *extra],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    assert step().returncode == 0
    folder = tmp_path / "7-flash-batch1"
    csv_path = folder / "results" / "results.csv"
    rows = csv_path.read_text().splitlines()
    assert len(rows) > 2
    # As if stopped by the budget before its last case: no DONE, the last row missing.
    (folder / "DONE").unlink()
    csv_path.write_text("\n".join(rows[:-1]) + "\n")
    assert step().returncode == 0
    assert "--resume" in (folder / "speed-resumed.log").read_text().splitlines()[0]
    resumed = csv_path.read_text().splitlines()
    assert resumed[:-1] == rows[:-1] and len(resumed) == len(rows)  # kept, and the rest run
    # Rows of another machine (or other versions, or another commit) are never continued.
    sidecar = folder / "results" / "results.json"
    info = json.loads(sidecar.read_text())
    info["versions"]["torch"] = "0.0"
    sidecar.write_text(json.dumps(info))
    (folder / "DONE").unlink()
    (folder / "speed.log").unlink()
    assert step().returncode == 0
    assert "--overwrite" in (folder / "speed.log").read_text().splitlines()[0]
    (folder / "DONE").unlink()
    (folder / "speed.log").unlink()
    extra.append("--force")
    assert step().returncode == 0
    assert "--overwrite" in (folder / "speed.log").read_text().splitlines()[0]


def test_runbook_rejects_an_unknown_step(tmp_path):
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "77", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0 and "unknown step '77'" in done.stderr


def test_chunk_kernel_retries_with_one_stage_when_shared_memory_runs_out(monkeypatch):
    triton_retention = pytest.importorskip("attnbench.kernels.triton_retention")
    refusal = triton_retention.OUT_OF_RESOURCES[0]
    launches = []

    class FakeKernel:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(kwargs.get("num_stages"))
                if kwargs.get("num_stages") != 1:
                    try:
                        raise refusal(270336, 232448, "shared memory")
                    except TypeError:  # another Triton's signature
                        raise refusal("shared memory") from None

            return launch

    monkeypatch.setattr(triton_retention, "_chunk_states", FakeKernel())
    monkeypatch.setattr(triton_retention, "_STAGES", {})
    q = torch.randn(1, 2, 300, 128)
    plan = triton_retention._plan(q, q, None, 256, None)  # a user's 256-long chunk, float32
    default = triton_retention._STATES_CONFIG[2]
    triton_retention._states(q, q, None, plan, reverse=False)
    assert launches == [default, 1]  # the default first, then one stage
    triton_retention._states(q, q, None, plan, reverse=False)
    assert launches == [default, 1, 1]  # remembered for this configuration


def test_flex_raises_dynamo_limits_and_fails_on_a_limit_hit():
    from attnbench.kernels import flex

    pytest.importorskip("torch.nn.attention.flex_attention")
    import torch._dynamo.config as dynamo_config

    flex._kernel(torch.device("cuda"))  # torch.compile is lazy: nothing runs on a GPU here
    assert dynamo_config.recompile_limit >= flex.RECOMPILE_LIMIT
    if hasattr(dynamo_config, "accumulated_recompile_limit"):
        assert dynamo_config.accumulated_recompile_limit >= flex.ACCUMULATED_RECOMPILE_LIMIT
    if hasattr(dynamo_config, "fail_on_recompile_limit_hit"):
        assert dynamo_config.fail_on_recompile_limit_hit is True


def test_a_recompile_limit_hit_is_an_error_not_a_silent_eager_run():
    """What fail_on_recompile_limit_hit buys: past the limit dynamo raises instead of running
    the function eagerly (for flex: unfused, O(n^2) memory, timed as if fused)."""
    import torch._dynamo
    import torch._dynamo.config as dynamo_config

    if not hasattr(dynamo_config, "fail_on_recompile_limit_hit"):
        pytest.skip("this torch has no fail_on_recompile_limit_hit")

    def f(x):
        return x * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, dynamic=False, backend="eager")
    with dynamo_config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
        compiled(torch.ones(2))
        with pytest.raises(Exception, match="(?i)recompil"):
            compiled(torch.ones(3))  # a second shape: one recompilation over the limit
    torch._dynamo.reset()


def test_rotary_frequencies_follow_the_positions_device():
    """Evaluation-time rows failed on CUDA once: the frequencies were made on the CPU."""
    from attnbench.layers import Rotary

    angles = Rotary(64).angles(torch.arange(5, device="meta"))
    assert angles.device.type == "meta" and angles.shape == (5, 32)


def test_the_backend_sdpa_picks_is_read_from_the_profiler():
    from attnbench.kernels.sdpa import default_backend

    q = torch.randn(1, 2, 16, 8)
    assert default_backend(q, q, q, causal=True) in ("flash", "efficient", "math", "cudnn")


def test_cuda_peak_resets_the_allocator_peak_per_case_and_excludes_the_inputs(monkeypatch):
    """cuda_peak on a fake allocator: the peak statistic is reset before each measured call,
    and what was allocated before it (the inputs) is subtracted."""
    from attnbench.measure import memory

    state = {"allocated": 1000, "peak": 5000, "resets": 0}

    def reset(device=None):
        state["resets"] += 1
        state["peak"] = state["allocated"]

    def call():
        state["peak"] = max(state["peak"], state["allocated"] + 300)  # a 300-byte temporary
        return "out"

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: state["peak"])
    first = memory.cuda_peak(call, torch.device("cuda"))
    second = memory.cuda_peak(call, torch.device("cuda"))
    assert first.bytes == second.bytes == 300  # not the 5000 peak left by earlier work
    assert state["resets"] == 2 and first.method == memory.METHOD_CUDA
