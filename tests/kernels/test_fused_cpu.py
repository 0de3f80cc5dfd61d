"""Fused paths, checked on a CPU: SDPA backends, FlexAttention (forward), bad input, ``list``.

The Triton kernels are checked under Triton's interpreter in test_triton_interpret.py; the same
paths on a GPU, in fp16 and bf16 with gradients, in test_fused_gpu.py (``pytest -m gpu``).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from attnbench import registry
from attnbench.api import attention
from attnbench.cli import app
from attnbench.core import capabilities
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import compare_paths
from attnbench.kernels import flex, sdpa, triton_ops
from tests.helpers.cases import needs_cpu_flex
from tests.helpers.dense_refs import dense_masked, dilated_rule, make_qkv, window_rule

SDPA_MECHS = ("softmax", "softmax-logn", "mqa", "gqa")
SDPA_PATHS = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn")
NO_CUDA = not torch.cuda.is_available()


# --------------------------------------------------------------------------------------------
# SDPA backends
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SDPA_MECHS)
def test_sdpa_paths_registered_and_default_unchanged(name):
    mech = registry.get(name)
    for path in SDPA_PATHS:
        assert mech.path(path).kind == "fused"
    assert mech.default_path.name == "efficient"


@pytest.mark.skipif(not NO_CUDA, reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("name", SDPA_MECHS)
@pytest.mark.parametrize("path", SDPA_PATHS)
def test_sdpa_path_without_cuda_says_why(name, path):
    q = torch.randn(1, 2, 5, 8)
    k = q[:, :1] if registry.get(name).shares_kv else q
    kwargs = {"kv_heads": 1} if name == "gqa" else {}
    with pytest.raises(AttnbenchError, match="needs CUDA") as info:
        attention(name, q, k, k, path=path, **kwargs)
    assert "\n" not in str(info.value)
    assert "paths that can: reference, efficient" in str(info.value)


@pytest.mark.parametrize(("name", "causal"), [("softmax", False), ("softmax-logn", True)])
def test_sdpa_flash_function_matches_reference_on_cpu(name, causal):
    """torch's flash backend also exists on the CPU, so the path function itself (the log-n
    factor folded into q, the pinned backend) is checked here, outputs and gradients."""
    mech = registry.get(name)
    params = mech.resolve({"base": "e", "min_n": 4} if name == "softmax-logn" else {})
    inputs = make_inputs(mech, Shape(2, 3, 23, 16), params, seed=3)
    verdicts = compare_paths(
        mech.path("sdpa-flash"), mech.reference, inputs, {"causal": causal, **params}
    )
    assert all(v.ok for v in verdicts), "; ".join(map(str, verdicts))


def test_sdpa_flash_gqa_on_cpu():
    mech = registry.get("gqa")
    params = mech.resolve({"kv_heads": 2})
    shape = mech.shape_for(Shape(1, 4, 19, 16), params)
    inputs = make_inputs(mech, shape, params, seed=5)
    verdicts = compare_paths(
        mech.path("sdpa-flash"), mech.reference, inputs, {"causal": True, **params}
    )
    assert all(v.ok for v in verdicts), "; ".join(map(str, verdicts))


@pytest.mark.skipif(not NO_CUDA, reason="the efficient backend exists on CUDA")
def test_sdpa_unavailable_backend_is_one_line_not_a_fallback():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(AttnbenchError, match="SDPA efficient backend cannot run this call") as e:
        sdpa.sdpa_with_backend("efficient", q, q, q, causal=False)
    assert "\n" not in str(e.value) and "float32" in str(e.value)
    with pytest.raises(AttnbenchError, match="accepted: flash, efficient, cudnn"):
        sdpa.backend_path("math")


# --------------------------------------------------------------------------------------------
# FlexAttention (CPU: compiled to C++, forward only)
# --------------------------------------------------------------------------------------------


@needs_cpu_flex
@pytest.mark.parametrize(
    ("rule", "params"), [(window_rule, {"w": 3}), (dilated_rule, {"r": 4})], ids=["window", "dil"]
)
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_flex_path_matches_dense_mask_forward(rule, params, causal):
    inputs = {
        name: torch.randn(2, 2, 37, 16, generator=torch.Generator().manual_seed(i))
        for i, name in enumerate("qkv")
    }
    kwargs = {"causal": causal, **params}
    verdicts = compare_paths(
        flex.flex_path(rule), dense_masked(rule), inputs, kwargs, backward=False
    )
    assert all(v.ok for v in verdicts), "; ".join(map(str, verdicts))


@needs_cpu_flex
def test_flex_fused_wires_a_sparse_mechanism_in_one_line():
    """How the sparse mechanisms get their fused path: ``flex_fused(visible)`` in ``paths``."""
    from attnbench.core.spec import Mechanism, PathSpec, positive_int

    mech = Mechanism(
        name="toy-local",
        family="sparse",
        description="sliding window, for this test",
        sources=(),
        params=(positive_int("w", 3, "keys on each side"),),
        paths=(
            PathSpec("reference", "reference", dense_masked(window_rule), memory="O(n^2)"),
            flex.flex_fused(window_rule),
        ),
        visible=window_rule,
    )
    assert mech.path("flex").kind == "fused"
    x = make_qkv(1, 2, 21, 16, 16, torch.float32, seed=11)
    with torch.no_grad():  # the registry path needs CUDA; its function runs eagerly here
        fast = mech.path("flex")(**x, causal=True, w=2)
        ref = attention(mech, **x, causal=True, path="reference", w=2)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)


@needs_cpu_flex
def test_flex_block_mask_is_built_once_per_key():
    params = {"w": 2}
    a = flex.block_mask_for(window_rule, 33, True, params, torch.device("cpu"))
    b = flex.block_mask_for(window_rule, 33, True, dict(params), torch.device("cpu"))
    c = flex.block_mask_for(window_rule, 33, False, params, torch.device("cpu"))
    assert a is b and a is not c
    assert flex.block_mask_for(None, 33, False, {}, torch.device("cpu")) is None


def test_flex_compile_cache_is_reset_before_dynamo_limit(monkeypatch):
    """A single process meeting many signatures (a test session, a long sweep) starts the
    compile cache afresh before dynamo's per-function limit, never at a repeated signature."""
    import torch._dynamo

    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    monkeypatch.setattr(flex, "_signatures", set())
    half = flex.RECOMPILE_LIMIT // 2
    for i in range(half):
        assert not flex.note_signature(("sig", i))
    assert not flex.note_signature(("sig", 0))  # seen: no new cache entry
    assert not resets
    assert flex.note_signature(("sig", half))  # the next new one resets first
    assert resets == [1] and flex._signatures == {("sig", half)}
    for i in range(10 * flex.RECOMPILE_LIMIT):
        flex.note_signature(("more", i))
        assert len(flex._signatures) <= half


def test_flex_signature_tells_apart_what_dynamo_guards_on():
    q = torch.randn(1, 2, 8, 4)
    base = flex._signature(q, q, q, "rule")
    assert flex._signature(q.clone(), q, q, "rule") == base
    assert flex._signature(q.half(), q, q, "rule") != base
    assert flex._signature(q.transpose(-1, -2).contiguous().transpose(-1, -2), q, q, "rule") != base
    assert flex._signature(q, q, q, "other") != base
    with torch.no_grad():
        assert flex._signature(q, q, q, "rule") != base  # grad mode
    g = q.clone().requires_grad_()
    with_grad = {flex._signature(*x, "rule") for x in ((g, q, q), (q, g, q), (q, q, g))}
    assert len(with_grad) == 3 and base not in with_grad  # which tensor requires grad


@needs_cpu_flex
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_logn_flex_path_matches_reference_forward(causal):
    mech = registry.get("softmax-logn")
    params = mech.resolve({"base": "e", "clip": True, "min_n": 8})
    inputs = make_inputs(mech, Shape(1, 2, 29, 16), params, seed=7)
    verdicts = compare_paths(
        mech.path("flex"),
        mech.reference,
        inputs,
        {"causal": causal, **params},
        backward=False,
    )
    assert all(v.ok for v in verdicts), "; ".join(map(str, verdicts))


@needs_cpu_flex
def test_flex_backward_on_cpu_says_why():
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    logn = registry.get("softmax-logn").path("flex")
    with pytest.raises(AttnbenchError, match="no backward on CPU"):
        logn(q, q, q, causal=False, base=512.0, clip=False, min_n=1)
    with pytest.raises(AttnbenchError, match="no backward on CPU"):
        flex.flex_path(window_rule)(q, q, q, causal=False, w=1)
    with torch.no_grad():
        assert logn(q, q, q, causal=False, base=512.0, clip=False, min_n=1).shape == (1, 2, 5, 8)


@needs_cpu_flex
def test_a_failed_flex_call_does_not_poison_the_next():
    """The CPU kernel refuses to run under a dispatch mode (attnbench's CPU memory counter is
    one); the failure must not leave dynamo refusing every later call of the process."""
    from attnbench.measure.memory import LiveBytes

    q = torch.randn(1, 2, 40, 16)
    fn = flex.flex_path(window_rule)
    with torch.no_grad():
        expected = fn(q, q, q, causal=False, w=3)
        with pytest.raises(Exception), LiveBytes():  # noqa: B017 (torch's own error type)
            fn(q, q, q, causal=False, w=3)
        torch.testing.assert_close(fn(q, q, q, causal=False, w=3), expected)


@needs_cpu_flex
def test_flex_registry_path_runs_forward_on_cpu(monkeypatch):
    """On a CPU the registry's flex path is FlexAttention compiled by Inductor to C++, forward
    only; without a C++ compiler, or for float64 (no compiled template takes it), or asked for a
    backward, it says why in one line."""
    mech = registry.get("softmax-logn")
    path = mech.path("flex")
    assert path.unavailable("cpu") is None
    assert "forward only" in path.unavailable("cpu", backward=True)
    q = torch.randn(1, 2, 5, 8)
    out = attention("softmax-logn", q, q, q, path="flex")
    assert out.shape == (1, 2, 5, 8)
    with pytest.raises(AttnbenchError, match="does not take torch.float64; accepted: float16") as e:
        attention("softmax-logn", q.double(), q.double(), q.double(), path="flex")
    assert "\n" not in str(e.value)
    monkeypatch.setattr(capabilities.shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    assert "needs g++ or clang++" in path.unavailable("cpu")
    with pytest.raises(AttnbenchError, match="needs g\\+\\+ or clang\\+\\+"):
        attention("softmax-logn", q, q, q, path="flex")


# --------------------------------------------------------------------------------------------
# Triton paths: what they refuse, before Triton is even imported
# --------------------------------------------------------------------------------------------


def test_triton_paths_need_cuda(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.randn(1, 1, 8, 16)
    for path, params in (
        (triton_ops.gau_path(), {}),
        (registry.get("retention").path("triton"), registry.get("retention").defaults),
        (registry.get("linear").path("triton"), registry.get("linear").defaults),
    ):
        assert path.kind == "fused"
        if NO_CUDA:
            assert path.unavailable("cpu").startswith("needs CUDA")
        with pytest.raises(AttnbenchError, match="needs CUDA tensors"):
            path(q, q, q, causal=True, **params)


@pytest.mark.parametrize(
    ("shape_q", "shape_v", "dtype", "match"),
    [
        ((1, 1, 8, 16), (1, 1, 8, 16), torch.float64, "does not take torch.float64"),
        ((1, 1, 8, 256), (1, 1, 8, 16), torch.float32, "head dim 256 is beyond"),
    ],
    ids=["fp64", "hd256"],
)
def test_triton_bad_input_one_line(monkeypatch, shape_q, shape_v, dtype, match):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # past the device check, to the next one
    q = torch.randn(shape_q, dtype=dtype)
    v = torch.randn(shape_v, dtype=dtype)
    for call in (
        lambda: triton_ops.gau_relu2(q, q, v, causal=False),
        lambda: triton_ops.retention_chunked(q, q, v, 0.9),
    ):
        with pytest.raises(AttnbenchError, match=match) as info:
            call()
        assert "\n" not in str(info.value)


def test_triton_value_dim_and_gamma_limits(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 200)
    with pytest.raises(AttnbenchError, match="value dim 200 is beyond"):
        triton_ops.retention_chunked(q, q, v, 0.9)
    with pytest.raises(AttnbenchError, match="0 < gamma <= 1"):
        triton_ops.retention_chunked(q, q, q, [0.9, 1.5])
    with pytest.raises(AttnbenchError, match="one per head"):
        triton_ops.retention_chunked(q, q, q, [0.9, 0.8, 0.7])
    with pytest.raises(AttnbenchError, match="power of two >= 16"):
        triton_ops.flash_global_chunked(q, q, q, chunk=24)
    with pytest.raises(AttnbenchError, match="accepted: ns, n2"):
        triton_ops.gau_relu2(q, q, q, causal=False, norm="n")


# --------------------------------------------------------------------------------------------
# The CLI and a machine without Triton
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not NO_CUDA, reason="checks the reasons shown on a machine without CUDA")
def test_list_shows_fused_paths_needing_cuda():
    result = CliRunner().invoke(app, ["list", "--format", "json"])
    assert result.exit_code == 0, result.output
    entries = {e["name"]: e for e in json.loads(result.stdout)}
    for name in SDPA_MECHS:
        paths = {p["name"]: p for p in entries[name]["paths"]}
        for path in SDPA_PATHS:
            assert paths[path]["kind"] == "fused" and not paths[path]["available"]
            assert paths[path]["reason"].startswith("needs CUDA")
    assert entries["softmax-logn"]["paths"][-1]["name"] == "flex"
    table = CliRunner().invoke(app, ["list"])
    words = " ".join(table.stdout.replace("│", " ").split())  # the table may wrap a cell
    assert table.exit_code == 0 and "not here (needs CUDA)" in words, table.stdout


def test_cpu_side_works_without_triton():
    """``import attnbench``, the registry, ``list`` and the reference and efficient paths with
    Triton unimportable (eager flex, also Triton-free, is left out: its first call costs ~9 s)."""
    script = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from attnbench import registry\n"
        "from attnbench.api import attention\n"
        "from attnbench.cli import app\n"
        "from attnbench.core.inputs import make_inputs\n"
        "from attnbench.core.spec import Shape\n"
        "from typer.testing import CliRunner\n"
        "for m in registry.MECHANISMS:\n"
        "    p = m.defaults\n"
        "    x = make_inputs(m, m.shape_for(Shape(1, 2, 9, 8), p), p)\n"
        "    for path in m.paths:\n"
        "        if path.kind != 'fused' and not path.unavailable('cpu'):\n"
        "            with torch.no_grad():\n"
        "                attention(m, **x, causal=m.causal, path=path.name)\n"
        "r = CliRunner().invoke(app, ['list'])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'triton' not in [k for k, v in sys.modules.items() if v is not None]\n"
        "print('ok')\n"
    )
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
