"""The fused paths wired into the registry, checked on a CPU.

* FlexAttention (``flex`` of local, atrous, sparse, strided, fixed, bigbird, longnet): the
  registry's path, compiled for the CPU (forward only), against the mechanism's own reference,
  at odd lengths, causal and not, default and sparse parameters.
* Triton (``triton`` of gau, flash, linear, retention): what each path refuses, before any kernel
  runs. The wired path functions themselves are run under Triton's interpreter in
  tests/kernels/interpreted_triton.py, on a GPU in tests/kernels/test_fused_gpu.py.
* ``attnbench list`` and ``attnbench check`` with a fused path on a machine without CUDA.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench import registry
from attnbench.api import attention
from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import compare_paths
from attnbench.variants.sparse.longnet import multiplicity
from tests.helpers.cases import CPU_FLEX, needs_cpu_flex

NO_CUDA = not torch.cuda.is_available()
#: Mechanism -> its fused path and what that path needs.
FLEX_WIRED = ("local", "atrous", "sparse", "strided", "fixed", "bigbird", "longnet")
TRITON_WIRED = ("gau", "flash", "linear", "retention")

#: Non-default parameters that make the pattern sparse at T = 37 (the defaults' windows and
#: strides of 64 see nearly everything at such lengths, so they are run once).
SPARSE_PARAMS: dict[str, list[dict]] = {
    "local": [{"window": 3}],
    "atrous": [{"r": 3}],
    "sparse": [{"window": 2, "r": 5}],
    "strided": [{"s": 4}],
    "fixed": [{"s": 6, "c": 2}],
    "bigbird": [
        {"block": 4, "window_blocks": 1, "global_blocks": 1, "random_blocks": 2, "seed": 3}
    ],
    # Overlapping branches (pairs of multiplicity 2 and 3), and branches leaving rows uncovered.
    "longnet": [{"segments": "4:1,8:2,16:4"}, {"segments": "6:2,9:3"}],
}
#: (T, causal) for each sparse parameter set; the defaults run at (37, causal). Each new length,
#: direction and parameter set compiles the CPU kernel and its BlockMask afresh (seconds each).
GRID = ((7, True), (37, False), (37, True))


def test_fused_paths_are_wired():
    for name in FLEX_WIRED + TRITON_WIRED:
        mech = registry.get(name)
        kind = "flex" if name in FLEX_WIRED else "triton"
        path = mech.path(kind)
        assert path.kind == "fused" and path.memory
        assert {r.name for r in path.requires} == ({kind} if kind == "flex" else {"cuda", kind})
        assert mech.default_path.kind == "efficient", name
    fused = registry.get("linear").path("triton-fused")  # beside linear:triton, for the GPU runs
    assert fused.kind == "fused" and fused.memory
    assert {r.name for r in fused.requires} == {"cuda", "triton"}


@needs_cpu_flex
@pytest.mark.parametrize("name", FLEX_WIRED)
def test_flex_path_matches_reference_on_cpu(name):
    """The registry's flex path (compiled for the CPU, forward) against the mechanism's dense
    reference. The sparse cases are checked to really be sparse at T = 37, so a path that ignored
    the BlockMask would fail."""
    mech = registry.get(name)
    fn = mech.path("flex")
    cases = [({}, 37, True)] + [(p, t, c) for p in SPARSE_PARAMS[name] for t, c in GRID]
    failed = []
    for overrides, t, causal in cases:
        params = mech.resolve(overrides)
        if overrides and t == 37:
            dense = t * (t + 1) // 2 if causal else t * t
            assert mech.count_pairs(t, causal, params) < dense, (overrides, t, causal)
        inputs = make_inputs(mech, Shape(2, 2, t, 16), params, seed=t + causal)
        kwargs = {"causal": causal, **params}
        verdicts = compare_paths(fn, mech.reference, inputs, kwargs, backward=False)
        failed += [f"{overrides} T{t} causal={causal}: {v}" for v in verdicts if not v.ok]
    assert not failed, "; ".join(failed)


def test_longnet_cases_need_the_multiplicity_bias():
    """The longnet cases above have pairs covered by several branches, so the flex path's
    log-multiplicity score_mod is exercised (without it they would fail)."""
    mech = registry.get("longnet")
    idx = torch.arange(37)
    for overrides in SPARSE_PARAMS["longnet"]:
        params = mech.resolve(overrides)
        m = multiplicity(idx[:, None], idx[None, :], 37, False, params)
        assert int(m.max()) >= 2, overrides


# --------------------------------------------------------------------------------------------
# Refusals: one line saying why and which path to use
# --------------------------------------------------------------------------------------------


def _inputs(name: str, overrides: dict, t: int = 8) -> tuple[dict, dict]:
    mech = registry.get(name)
    params = mech.resolve(overrides)
    inputs = make_inputs(mech, mech.shape_for(Shape(1, 2, t, 16), params), params)
    return inputs, params


@pytest.mark.parametrize(
    ("name", "overrides", "causal", "match"),
    [
        ("gau", {"scoring": "softmax"}, True, "scoring=softmax: the kernel computes relu2 only"),
        ("gau", {"scoring": "softmax_plus"}, False, "efficient path runs the softmax scorings"),
        ("flash", {"chunk": 12}, True, "power of two >= 16 .got chunk=12.; use the efficient"),
        ("flash", {"chunk": 8}, True, "power of two >= 16"),
        ("retention", {}, False, "causal only"),
    ],
)
def test_triton_path_refusals_are_one_line(name, overrides, causal, match):
    inputs, params = _inputs(name, overrides)
    fn = registry.get(name).path("triton")
    with pytest.raises(AttnbenchError, match=match) as info:
        fn(**inputs, causal=causal, **params)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(not NO_CUDA, reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize(
    ("name", "path"), [("linear", "triton"), ("linear", "triton-fused"), ("flash", "triton")]
)
def test_triton_path_function_on_cpu_tensors_says_why(name, path, monkeypatch):
    """What passes the parameter checks still needs CUDA tensors (or the interpreter)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    inputs, params = _inputs(name, {"chunk": 16} if name == "flash" else {})
    with pytest.raises(AttnbenchError, match="needs CUDA tensors"):
        registry.get(name).path(path)(**inputs, causal=True, **params)


@pytest.mark.skipif(not NO_CUDA, reason="checks the message on a machine without CUDA")
def test_api_fused_path_without_cuda():
    inputs, params = _inputs("retention", {})
    with pytest.raises(AttnbenchError, match="needs CUDA") as info:
        attention("retention", **inputs, causal=True, path="triton")
    assert "\n" not in str(info.value) and "paths that can: " in str(info.value)


@needs_cpu_flex
def test_api_flex_on_cpu_is_forward_only():
    """The flex path runs on CPU tensors (compiled) without gradients, and refuses them in one
    line naming the paths that can."""
    inputs, params = _inputs("local", {"window": 3})
    with torch.no_grad():
        out = attention("local", **inputs, causal=True, path="flex", window=3)
        ref = attention("local", **inputs, causal=True, path="reference", window=3)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grads = {k: v.detach().requires_grad_() for k, v in inputs.items()}
    with pytest.raises(AttnbenchError, match="forward only") as info:
        attention("local", **grads, causal=True, path="flex", window=3)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------------------------
# The CLI
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not NO_CUDA, reason="checks the reasons shown on a machine without CUDA")
def test_list_shows_wired_fused_paths_needing_cuda():
    result = CliRunner().invoke(app, ["list", "--format", "json"])
    assert result.exit_code == 0, result.output
    entries = {e["name"]: e for e in json.loads(result.stdout)}
    for name in TRITON_WIRED:
        fused = {p["name"]: p for p in entries[name]["paths"]}["triton"]
        assert fused["kind"] == "fused" and not fused["available"]
        assert fused["reason"].startswith("needs CUDA"), fused
    for name in FLEX_WIRED:  # compiled for the CPU, forward only, where it can be compiled
        fused = {p["name"]: p for p in entries[name]["paths"]}["flex"]
        assert fused["kind"] == "fused" and fused["available"] == (CPU_FLEX is None), fused
    table = CliRunner().invoke(app, ["list", "--family", "sparse"])
    words = " ".join(table.stdout.replace("│", " ").split())  # the table may wrap a cell
    assert table.exit_code == 0 and "not here (needs CUDA)" in words, table.stdout


@pytest.mark.skipif(not NO_CUDA, reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize(
    "args",
    [
        ["check", "retention", "--causal", "--path", "chunkwise", "--path", "triton"],
        ["check", "softmax", "--path", "sdpa-flash", "--n", "9"],
    ],
    ids=["triton", "sdpa"],
)
def test_check_unavailable_path_asked_for_is_one_line_exit_2(args):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot run here: needs CUDA" in lines[0], result.stderr
    assert "paths that can: " in lines[0] and "triton" not in lines[0].split("can: ")[1]


@needs_cpu_flex
def test_check_flex_on_cpu_compares_the_forward():
    """On the CPU the flex path runs forward only: ``check`` compares its output, no gradient."""
    result = CliRunner().invoke(app, ["check", "local", "--path", "flex", "--n", "37"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "flex" in line]
    assert rows and all("grad" not in line for line in rows), result.stdout
    assert any("output" in line for line in rows), result.stdout


@pytest.mark.skipif(not NO_CUDA, reason="checks the message on a machine without CUDA")
def test_check_without_path_skips_unavailable_ones_and_device_cuda_needs_a_gpu():
    result = CliRunner().invoke(app, ["check", "gau", "--n", "9", "--head-dim", "8"])
    assert result.exit_code == 0, result.output
    words = result.stdout.split()  # a table cell wraps with the terminal's width
    assert "skipped:" in words and "CUDA" in words and "efficient" in words
    result = CliRunner().invoke(app, ["check", "local", "--device", "cuda"])
    assert result.exit_code == 2
    assert "no CUDA GPU is visible" in result.stderr.strip()


@needs_cpu_flex
def test_speed_run_times_flex_on_cpu_and_says_memory_was_not_measured(tmp_path):
    """A speed run of the CPU flex path: forward rows ok at every length (its peak memory not
    measured, and the row says why: compiled code refuses the dispatch mode that counts CPU
    storage, and a refused call once left every later flex call failing), forward + backward
    rows unsupported (forward only), the efficient path beside it measured as before."""
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["run", "speed", "--impl", "local:flex", "--impl", "local:efficient",
              "--lengths", "48,96", "--device", "cpu", "--threads", "1", "--rounds", "2",
              "--set", "params.local.window=8", "--no-plot", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(out / "results.csv")
    flex = rows[rows["path"] == "flex"]
    fwd, fwdbwd = flex[flex["direction"] == "fwd"], flex[flex["direction"] == "fwdbwd"]
    assert len(fwd) == 4 and (fwd["status"] == "ok").all(), fwd[["status", "reason"]]
    assert fwd["mem_fwd_bytes"].isna().all()
    assert fwd["mem_method"].str.startswith("not measured: compiled").all()
    assert (fwdbwd["status"] == "unsupported").all()
    assert fwdbwd["reason"].str.contains("forward only").all()
    efficient = rows[(rows["path"] == "efficient") & (rows["direction"] == "fwd")]
    assert (efficient["status"] == "ok").all() and (efficient["mem_fwd_bytes"] > 0).all()
