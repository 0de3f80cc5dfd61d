"""What keeps a first GPU run from failing or misleading, checked on the CPU: the Triton kernel's
retry on a shared-memory refusal, FlexAttention's dynamo limits, the rotary frequencies following
their positions' device, and the CUDA peak-memory reset. (``attnbench gpu-check`` itself is
tested in tests/gpucheck/.)"""

from __future__ import annotations

import pytest
import torch


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
