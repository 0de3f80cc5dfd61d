"""Paths compiled by torch.compile (attnbench.kernels.inductor): the compiled linear attention, its
traceable feature map, the recompile bookkeeping and the refusal without a C++ compiler. The
compiled path's agreement with the dense reference (outputs, gradients, dtypes, odd lengths) is
checked with every other path by tests/mechanisms."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench import registry
from attnbench.core import capabilities
from attnbench.kernels import inductor
from attnbench.variants import linear
from tests.helpers.cases import needs_cpu_inductor


def test_traceable_feature_map_is_elu_plus_one_without_cancellation():
    x = torch.tensor(
        [-80.0, -40.0, -17.5, -1.0, -1e-8, 0.0, 1e-8, 0.5, 3.0, 80.0], dtype=torch.float64
    )
    exact = torch.tensor(
        [math.exp(v) if v <= 0 else v + 1 for v in x.tolist()], dtype=torch.float64
    )
    for dtype in (torch.float64, torch.float32):
        got = linear.traceable_phi(x.to(dtype), "elu+1").double()
        # relative: e^-80 must come out as e^-80, not as (e^-80 - 1) + 1 = 0
        torch.testing.assert_close(got, exact, rtol=4 * torch.finfo(dtype).eps * 80, atol=0)
    for name in ("relu", "identity"):
        torch.testing.assert_close(linear.traceable_phi(x, name), linear.phi(x, name))


def test_traceable_feature_map_gradient_is_finite_and_exact():
    """d/dx = e^x below 0 and 1 above; never inf * 0 where a branch overflows (x = 800)."""
    x = torch.tensor(
        [-30.0, -2.0, -0.25, 0.25, 2.0, 800.0], dtype=torch.float64, requires_grad=True
    )
    (grad,) = torch.autograd.grad(linear.traceable_phi(x, "elu+1").sum(), x)
    expected = torch.where(x > 0, torch.ones_like(x), x.exp()).detach()
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad, expected, rtol=1e-14, atol=0)


@needs_cpu_inductor
def test_compiled_path_runs_compiled_and_equals_the_eager_chunkwise_path():
    mech = registry.get("linear")
    path = mech.path("compiled")
    assert path.compiled and path.unavailable("cpu") is None
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 3, 77, 16, dtype=torch.float64).unbind(0)
    params = mech.resolve({"chunk": 16})
    for causal in (False, True):
        got = path(q, k, v, causal=causal, **params)
        want = mech.path("chunkwise")(q, k, v, causal=causal, **params)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    assert linear._traceable_chunkwise in inductor._compiled


def test_compiled_cache_starts_afresh_before_dynamo_limit(monkeypatch):
    """Each shape is a new specialisation: a sweep over many starts dynamo afresh before its
    per-function limit (where dynamo would refuse the call), never at a repeated signature."""
    from torch import _dynamo

    resets = []
    monkeypatch.setattr(_dynamo, "reset", lambda: resets.append(1))
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic: fn)  # no compiling here
    monkeypatch.setattr(inductor, "_compiled", {})
    monkeypatch.setattr(inductor, "_signatures", {})

    def double(x):
        return 2 * x

    half = inductor.RECOMPILE_LIMIT // 2
    for n in range(1, half + 1):
        assert double(torch.ones(n)).sum() == inductor.run_compiled(double, torch.ones(n)).sum()
    inductor.run_compiled(double, torch.ones(1))  # seen: no new specialisation
    assert not resets
    inductor.run_compiled(double, torch.ones(half + 1))  # the next new one resets first
    assert resets == [1] and len(inductor._signatures[double]) == 1
    for n in range(2, 3 * inductor.RECOMPILE_LIMIT):
        inductor.run_compiled(double, torch.ones(n, 2))
        assert len(inductor._signatures[double]) <= half


def test_signature_tells_apart_what_dynamo_guards_on():
    q = torch.randn(2, 3)
    base = inductor.call_signature(q, True, 0.5)
    assert inductor.call_signature(q.clone(), True, 0.5) == base
    assert inductor.call_signature(q.double(), True, 0.5) != base
    assert inductor.call_signature(q.t().contiguous().t(), True, 0.5) != base  # strides
    assert inductor.call_signature(q, False, 0.5) != base
    assert inductor.call_signature(q.clone().requires_grad_(), True, 0.5) != base
    with torch.no_grad():
        assert inductor.call_signature(q, True, 0.5) != base  # grad mode


def test_compiled_path_without_a_cpp_compiler_says_why(monkeypatch):
    monkeypatch.setattr(capabilities, "cpp_compiler", lambda: None)
    why = registry.get("linear").path("compiled").unavailable("cpu")
    assert why and "C++" in why and "g++" in why


def test_compiled_path_without_a_vector_isa_says_why(monkeypatch):
    """Inductor's C++ kernels use at::vec: torch without a vector ISA (ATEN_CPU_CAPABILITY=default)
    cannot compile them, for the compiled paths as for FlexAttention."""
    monkeypatch.setattr(capabilities, "cpu_vector_isa", lambda: "DEFAULT")
    for path in (registry.get("linear").path("compiled"), registry.get("local").path("flex")):
        why = path.unavailable("cpu")
        assert why and "vector instruction set" in why and "ATEN_CPU_CAPABILITY" in why


@pytest.mark.parametrize("device_type", ["mps", "meta"])
def test_compiled_paths_name_the_devices_they_run_on(device_type):
    assert "CPU or CUDA" in capabilities.inductor(device_type, False)
