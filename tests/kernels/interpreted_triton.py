"""The Triton kernels under Triton's CPU interpreter, against dense references written here
literally from their formulas. Tiny shapes with 16-wide tiles, so every case crosses tiles and
has a ragged tail (T = 37).

Not collected by default (the name does not start with ``test_``):
tests/kernels/test_triton_interpret.py runs this file in a fresh ``python -m pytest`` with
``TRITON_INTERPRET=1`` in its environment.
Why a subprocess: Triton decides at import time whether functions are compiled or interpreted,
its own ``tl.zeros`` & co. included, so the variable must be set before anything in the process
imports triton (torch can, and the pytest process may already have). Reloading our kernel
modules is not enough: it was tried, and ``tl.zeros`` stayed a compiled-mode function.
Run it alone with ``TRITON_INTERPRET=1 pytest tests/kernels/interpreted_triton.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("1", "true", "on", "yes"):
    pytest.skip("needs TRITON_INTERPRET=1 from the start", allow_module_level=True)
pytest.importorskip("triton", reason="Triton is not installed")

from attnbench.kernels import triton_ops  # noqa: E402
from tests.helpers.dense_refs import (  # noqa: E402
    flash_global_reference,
    gau_reference,
    linear_reference,
    retention_reference,
)
from tests.helpers.interpreter import (  # noqa: E402
    DTYPES,
    check,
    interpreter_bf16_dot_ok,
    make,
)

TILE = 16  # the interpreter is slow; 16 is tl.dot's smallest tile


@pytest.fixture(scope="module")
def ops():
    return triton_ops


@pytest.fixture
def dtype(request, ops):
    if request.param == torch.bfloat16 and not interpreter_bf16_dot_ok():
        pytest.skip("Triton's interpreter computes tl.dot on bf16 wrongly (checked on GPU)")
    return request.param


# --------------------------------------------------------------------------------------------
# relu^2 attention (GAU)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("causal", "norm", "chunk"),
    [(False, "ns", 0), (True, "ns", 0), (True, "n2", 0), (False, "ns", 8), (True, "ns", 8)],
    ids=["bidir-ns", "causal-ns", "causal-n2", "bidir-chunk8", "causal-chunk8"],
)
def test_gau_fwd_bwd(ops, causal, norm, chunk):
    def fast(q, k, v, **kw):
        return ops.gau_relu2(q, k, v, **kw, blocks=(TILE, TILE))

    inputs = make(2, 1, 37, 20, 12, torch.float32, seed=chunk + causal)
    check(fast, gau_reference, inputs, {"causal": causal, "norm": norm, "chunk": chunk})


@pytest.mark.parametrize("dtype", DTYPES[1:], indirect=True)
def test_gau_half_precision(ops, dtype):
    def fast(q, k, v, **kw):
        return ops.gau_relu2(q, k, v, **kw, blocks=(TILE, TILE))

    check(fast, gau_reference, make(1, 2, 33, 16, 16, dtype, seed=4), {"causal": True})


def test_gau_value_dim_split(ops, monkeypatch):
    """v wider than one kernel call takes is split into slices (autograd sums their dq, dk)."""
    monkeypatch.setattr(ops, "MAX_VALUE_DIM", 16)

    def fast(q, k, v, **kw):
        return ops.gau_relu2(q, k, v, **kw, blocks=(TILE, TILE))

    check(fast, gau_reference, make(1, 1, 21, 16, 40, torch.float32, seed=5), {"causal": False})


def test_relu2_any_row_scale_flash_local(ops):
    """FLASH's local part: relu^2 inside chunks of c, divided by a fixed c * s (Su 2022)."""
    c = 8

    def fast(q, k, v):
        scale = torch.full((q.shape[-2],), 1.0 / (c * q.shape[-1]), dtype=torch.float64)
        return ops.relu2_attention(q, k, v, scale, causal=True, chunk=c, blocks=(TILE, TILE))

    def reference(q, k, v):
        t = q.shape[-2]
        i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
        mask = (j <= i) & ((i // c) == (j // c))  # (T, T)
        return (torch.relu(q @ k.transpose(-1, -2)) ** 2 * mask) @ v / (c * q.shape[-1])

    check(fast, reference, make(1, 2, 29, 16, 16, torch.float32, seed=12))


# --------------------------------------------------------------------------------------------
# Chunkwise retention / linear attention / FLASH's global part
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("d", "dv"), [(16, 8), (24, 32)], ids=["D16-DV8", "D24-DV32"])
def test_retention_fwd_bwd(ops, d, dv):
    gamma = ops.retnet_gammas(2)  # a decay per head

    def fast(q, k, v):
        return ops.retention_chunked(q, k, v, gamma, block=TILE)

    def reference(q, k, v):
        return retention_reference(q, k, v, gamma=gamma)

    check(fast, reference, make(2, 2, 37, d, dv, torch.float32, seed=d))


@pytest.mark.parametrize("dtype", DTYPES[1:], indirect=True)
def test_retention_half_precision(ops, dtype):
    gamma = ops.retnet_gammas(2)

    def fast(q, k, v):
        return ops.retention_chunked(q, k, v, gamma, block=TILE)

    def reference(q, k, v):
        return retention_reference(q, k, v, gamma=gamma)

    check(fast, reference, make(1, 2, 33, 16, 16, dtype, seed=6))


def test_linear_attention_normalised(ops):
    """gamma = 1 on positive features: o_t = sum_{s<=t} (q_t.k_s) v_s / sum_{s<=t} q_t.k_s."""

    def fast(q, k, v):
        return ops.linear_attention_chunked(q.exp(), k.exp(), v, block=TILE)

    def reference(q, k, v):
        return linear_reference(q.exp(), k.exp(), v)

    check(fast, reference, make(1, 2, 37, 16, 8, torch.float32, seed=7))


def test_flash_global_part(ops):
    """FLASH's causal global part: whole earlier chunks only, divided by the tokens summed."""

    def fast(q, k, v):
        return ops.flash_global_chunked(q, k, v, chunk=TILE)

    def reference(q, k, v):
        return flash_global_reference(q, k, v, chunk=TILE)

    check(fast, reference, make(2, 1, 37, 16, 24, torch.float32, seed=8))


def test_single_position(ops):
    """T = 1: one tile, mostly padding."""
    inputs = make(1, 1, 1, 8, 8, torch.float32, seed=9)
    check(
        lambda q, k, v: ops.gau_relu2(q, k, v, causal=True, blocks=(TILE, TILE)),
        lambda q, k, v: gau_reference(q, k, v, causal=True),
        inputs,
    )
    check(
        lambda q, k, v: ops.retention_chunked(q, k, v, 0.5, block=TILE),
        lambda q, k, v: retention_reference(q, k, v, gamma=[0.5]),
        inputs,
    )


def test_path_factories_wire_in_one_line(ops):
    """What the lead adds to a GAU mechanism's paths: the factory's path function reads the
    mechanism's own parameter names through the given accessors."""
    x = make(1, 2, 21, 16, 16, torch.float32, seed=10)
    gau = ops.gau_path(norm=lambda p: "n2" if p["normalise"] == "n^2" else "ns")
    with torch.no_grad():
        got = gau(**x, causal=True, normalise="n^2", other=1)
    torch.testing.assert_close(got, gau_reference(**x, causal=True, norm="n2"))


# --------------------------------------------------------------------------------------------
# The wired registry paths: each mechanism's ``triton`` path function, called with the
# mechanism's own resolved params, against the mechanism's own reference (tests the wiring: the
# param names, the normalisers, the 1/sqrt(d) of retention, FLASH's two parts).
# --------------------------------------------------------------------------------------------

#: (mechanism, param overrides, causal, T, dtype). T = 70 crosses the kernels' default 64-wide
#: tiles (the wired paths cannot be given the 16-wide test tiles); 37 gives a ragged chunk tail.
WIRED = [
    ("gau", {}, False, 70, torch.float32),
    ("gau", {"norm": "n2"}, True, 37, torch.float32),
    ("gau", {}, True, 37, torch.float16),
    ("flash", {"chunk": 16}, True, 37, torch.float32),  # partial last chunk of 5
    ("flash", {"chunk": 32, "norm": "n2"}, True, 70, torch.float32),
    ("flash", {"chunk": 12, "norm": "n2"}, False, 37, torch.float32),  # any chunk bidirectional
    ("flash", {"chunk": 16}, True, 37, torch.float16),
    ("linear", {}, True, 70, torch.float32),
    ("linear", {}, False, 37, torch.float32),
    ("linear", {"feature_map": "relu", "normalize": False}, True, 37, torch.float32),
    ("linear", {"feature_map": "identity", "normalize": False}, False, 37, torch.float32),
    ("linear", {}, True, 37, torch.float16),
    ("retention", {}, True, 70, torch.float32),
    ("retention", {"normalize": "rownorm"}, True, 37, torch.float32),
    ("retention", {"normalize": "rownorm"}, True, 37, torch.float16),
]


def _wired_id(case) -> str:
    name, over, causal, t, dtype = case
    params = "-".join(f"{k}={v}" for k, v in over.items()) or "defaults"
    direction = "causal" if causal else "bidir"
    return f"{name}:{params}-{direction}-T{t}-{str(dtype).removeprefix('torch.')}"


def test_every_triton_path_in_the_registry_is_covered():
    from attnbench import registry

    # attnbench's own Triton kernels; the libraries' (FLA, SageAttention) are covered by
    # tests/kernels/test_library_adapters.py on the CPU and tests/kernels/test_fused_gpu.py on a
    # GPU.
    wired = {
        m.name
        for m in registry.MECHANISMS
        for p in m.paths
        if any(r.name == "triton" for r in p.requires)
        and not any(r.name.startswith("package:") for r in p.requires)
    }
    assert wired == {case[0] for case in WIRED}


@pytest.mark.parametrize("case", WIRED, ids=[_wired_id(c) for c in WIRED])
def test_wired_triton_path_matches_reference(case):
    from attnbench import registry
    from attnbench.core.inputs import make_inputs
    from attnbench.core.spec import Shape

    name, overrides, causal, t, dtype = case
    mech = registry.get(name)
    params = mech.resolve(overrides)
    shape = mech.shape_for(Shape(1, 2, t, 16), params)
    inputs = make_inputs(mech, shape, params, dtype=dtype, seed=t + causal)
    check(mech.path("triton"), mech.reference, inputs, {"causal": causal, **params})
