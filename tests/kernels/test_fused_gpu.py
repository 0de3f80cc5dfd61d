"""Every fused path on a CUDA GPU, judged by flash-attention's rule (attnbench.core.testing):
error at most 2x a same-dtype naive computation's (3x for gradients), fp16 and bf16, causal and
not, odd lengths. Run with ``pytest -m gpu`` (the default run deselects the marker).

Two groups: (1) every ``fused`` path in the registry against its mechanism's reference, so a
mechanism wired to a fused path later is covered with no edit here; (2) the kernels themselves
against the dense formulas in tests/helpers/dense_refs.py (GAU relu^2, retention, linear attention,
FLASH's global part, FlexAttention with hand-written patterns), and their refusals.
"""

from __future__ import annotations

import pytest
import torch

from attnbench import registry
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import compare_paths
from tests.helpers.dense_refs import (
    dense_masked,
    dilated_rule,
    flash_global_reference,
    gau_reference,
    linear_reference,
    make_qkv,
    retention_reference,
    window_rule,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]
#: (T, head dim): odd lengths, one tile or many, the head dims of flash-attention's sweep.
GRID = [(1, 64), (97, 64), (257, 128), (1023, 64), (383, 80)]
CAUSAL = [pytest.param(False, id="bidir"), pytest.param(True, id="causal")]


def assert_ok(verdicts) -> None:
    failed = [str(v) for v in verdicts if not v.ok]
    assert not failed, "; ".join(failed)


# --------------------------------------------------------------------------------------------
# (1) every fused path in the registry
# --------------------------------------------------------------------------------------------


#: Non-default parameters the registry loop also runs, on EXTRA_GRID, so that each fused path's
#: handling of its mechanism's parameters is checked on the GPU (sparser patterns than the
#: defaults at these lengths, the other normalisations, FLASH's chunk). A set a path refuses
#: (FLASH's causal chunk 100) is skipped with the path's reason.
EXTRA_PARAMS: dict[str, list[dict]] = {
    "local": [{"window": 100}],
    "atrous": [{"r": 5}],
    "sparse": [{"window": 33, "r": 50}],
    "strided": [{"s": 30}],
    "fixed": [{"s": 48, "c": 5}],
    "bigbird": [{"block": 32, "random_blocks": 2, "seed": 7}],
    "longnet": [{"segments": "64:1,128:2,256:4"}],
    "gau": [{"norm": "n2"}],
    "flash": [{"chunk": 64, "norm": "n2"}, {"chunk": 100}],
    "linear": [{"feature_map": "relu", "normalize": False}],
    "retention": [{"normalize": "rownorm"}],
}
EXTRA_GRID = [(97, 64), (1023, 128)]


def _library(path) -> bool:
    """Whether a path runs another project's package (its requirement ``package:NAME``)."""
    return any(r.name.startswith("package:") for r in path.requires)


def registry_cases() -> list:
    cases = []
    for mech in registry.MECHANISMS:
        for path in mech.paths:
            if path.kind != "fused":
                continue
            runs = [({}, GRID)] + [(p, EXTRA_GRID) for p in EXTRA_PARAMS.get(mech.name, [])]
            for causal in [c for c, ok in ((False, mech.bidirectional), (True, mech.causal)) if ok]:
                for overrides, grid in runs:
                    label = "".join(f"-{k}={v}" for k, v in overrides.items())
                    for t, d in grid:
                        direction = "causal" if causal else "bidir"
                        tag = f"{mech.name}:{path.name}{label}-{direction}-T{t}-D{d}"
                        marks = [pytest.mark.library] if _library(path) else []
                        cases.append(
                            pytest.param(mech, path, overrides, causal, t, d, id=tag, marks=marks)
                        )
    return cases


def test_extra_params_name_registered_fused_mechanisms():
    fused = {m.name for m in registry.MECHANISMS if any(p.kind == "fused" for p in m.paths)}
    assert set(EXTRA_PARAMS) <= fused


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("mech", "path", "overrides", "causal", "t", "d"), registry_cases())
def test_registry_fused_path(mech, path, overrides, causal, t, d, dtype):
    backward = mech.backward and path.backward  # a forward-only path: its output alone
    reason = path.unavailable("cuda", backward)
    if reason:
        pytest.skip(reason)
    params = mech.resolve(overrides)
    shape = mech.shape_for(Shape(2, 4, t, d), params)
    inputs = make_inputs(mech, shape, params, dtype=dtype, device="cuda", seed=t)
    try:
        verdicts = compare_paths(
            path,
            mech.reference,
            inputs,
            {"causal": causal, **params},
            backward=backward,
            tolerance=path.tolerance,  # an approximate path's own bound
        )
    except AttnbenchError as e:  # an SDPA backend this GPU / dtype / head dim lacks; a refusal
        if path.name == "xformers" and d in (64, 128):
            # its kernels loaded (else the path was unavailable above), and every one of them
            # takes half precision at these head dims: a refusal here is the adapter's fault
            pytest.fail(f"xFormers refused a call its kernels take: {e}")
        pytest.skip(str(e))
    assert_ok(verdicts)


@pytest.mark.library
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "d"), [(64, 64), (256, 128), (1024, 64), (1024, 96)])
def test_sage_bidirectional_at_whole_key_blocks(t, d, dtype):
    """SageAttention without a causal mask, at the key lengths its kernel takes (multiples of
    64; the others are refused, and GRID's odd lengths only see the refusal)."""
    mech = registry.get("softmax")
    path = mech.path("sage")
    reason = path.unavailable("cuda", False)
    if reason:
        pytest.skip(reason)
    inputs = make_inputs(mech, Shape(2, 4, t, d), {}, dtype=dtype, device="cuda", seed=t)
    verdicts = compare_paths(path, mech.reference, inputs, {"causal": False}, backward=False,
                             tolerance=path.tolerance)  # fmt: skip
    assert_ok(verdicts)


# --------------------------------------------------------------------------------------------
# (2) the kernels against the dense formulas
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize(
    ("t", "d", "dv", "norm", "chunk"),
    [
        (97, 64, 64, "ns", 0),
        (1023, 128, 128, "ns", 0),
        (1023, 128, 128, "n2", 0),
        (383, 128, 200, "ns", 0),  # v wider than a tile: split into 128 + 72
        (1023, 64, 96, "ns", 256),  # FLASH's local part, c = 256
        (1, 32, 48, "ns", 0),
    ],
)
def test_gau_kernel(t, d, dv, norm, chunk, causal, dtype):
    from attnbench.kernels.triton_ops import gau_relu2

    def fast(q, k, v, **kw):
        return gau_relu2(q, k, v, **kw)

    inputs = make_qkv(2, 2, t, d, dv, dtype, "cuda", seed=t + d)
    assert_ok(
        compare_paths(fast, gau_reference, inputs, {"causal": causal, "norm": norm, "chunk": chunk})
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("t", "d", "dv"), [(1, 64, 64), (97, 64, 64), (1023, 128, 128), (777, 64, 96)]
)
def test_retention_kernel(t, d, dv, dtype):
    from attnbench.kernels.triton_ops import retention_chunked, retnet_gammas

    gamma = retnet_gammas(4)
    inputs = make_qkv(2, 4, t, d, dv, dtype, "cuda", seed=t)
    assert_ok(
        compare_paths(
            lambda q, k, v: retention_chunked(q, k, v, gamma),
            lambda q, k, v: retention_reference(q, k, v, gamma=gamma),
            inputs,
            {},
        )
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [97, 1023])
def test_linear_kernel_normalised(t, dtype):
    from attnbench.kernels.triton_ops import linear_attention_chunked

    inputs = make_qkv(2, 2, t, 64, 64, dtype, "cuda", seed=t)
    inputs["q"], inputs["k"] = inputs["q"].sigmoid(), inputs["k"].sigmoid()  # positive features
    assert_ok(
        compare_paths(
            lambda q, k, v: linear_attention_chunked(q, k, v), linear_reference, inputs, {}
        )
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [97, 1023])
def test_flash_global_kernel(t, dtype):
    from attnbench.kernels.triton_ops import flash_global_chunked

    inputs = make_qkv(2, 2, t, 64, 128, dtype, "cuda", seed=t)
    assert_ok(
        compare_paths(
            lambda q, k, v: flash_global_chunked(q, k, v, chunk=64),
            lambda q, k, v: flash_global_reference(q, k, v, chunk=64),
            inputs,
            {},
        )
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize(
    ("rule", "params"), [(window_rule, {"w": 100}), (dilated_rule, {"r": 5})], ids=["win", "dil"]
)
@pytest.mark.parametrize("t", [97, 1023])
def test_flex_kernel_fwd_bwd(rule, params, causal, t, dtype):
    from attnbench.kernels.flex import flex_path

    inputs = make_qkv(2, 4, t, 64, 64, dtype, "cuda", seed=t)
    assert_ok(
        compare_paths(flex_path(rule), dense_masked(rule), inputs, {"causal": causal, **params})
    )


# --------------------------------------------------------------------------------------------
# Refusals on the GPU: one line each
# --------------------------------------------------------------------------------------------


def test_gpu_refusals_are_one_line():
    from attnbench.kernels import flex, sdpa, triton_ops

    q64 = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float64)
    wide = torch.randn(1, 2, 16, 256, device="cuda", dtype=torch.float16)
    q32 = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float32)
    calls = [
        (lambda: triton_ops.gau_relu2(q64, q64, q64, causal=False), "does not take"),
        (lambda: triton_ops.gau_relu2(wide, wide, wide, causal=False), "head dim 256"),
        (lambda: triton_ops.retention_chunked(q64, q64, q64, 0.9), "does not take"),
        (lambda: flex.flex_path(window_rule)(q64, q64, q64, causal=False, w=3), "does not take"),
        (lambda: sdpa.sdpa_with_backend("flash", q32, q32, q32, causal=False), "flash backend"),
    ]
    for call, match in calls:
        with pytest.raises(AttnbenchError, match=match) as info:
            call()
        assert "\n" not in str(info.value)


def test_flex_runs_compiled_not_eager():
    """Eager flex materialises the n x n scores; the compiled kernel never does. At n = 8192 with
    4 heads the scores alone are 1 GiB in float32: a compiled call stays far below."""
    import torch._dynamo.config as dynamo_config

    from attnbench.kernels.flex import flex_path

    assert not dynamo_config.suppress_errors  # a failed compile raises instead of running eager
    q = torch.randn(1, 4, 8192, 64, device="cuda", dtype=torch.bfloat16)
    fn = flex_path(window_rule)
    fn(q, q, q, causal=False, w=256)  # compile
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn(q, q, q, causal=False, w=256)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base < 64 * 2**20
