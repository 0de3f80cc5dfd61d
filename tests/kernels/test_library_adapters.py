"""The FLA, SageAttention and xFormers adapters on the CPU, where the libraries' kernels cannot
run (FLA's autotuned Triton kernels find no driver under the interpreter; SageAttention asserts
CUDA; xFormers' wheel is built for CUDA torch).

Each kernel is replaced by the library's own statement of what it computes: FLA's naive
implementations shipped in fla-core (fla/ops/*/naive.py), wrapped to the kernel's signature
(outputs and gradients, float32 and both half types); for SageAttention and xFormers, exact
softmax following their documentation, which also checks how it is called. What is tested is
the adapter (layout, scale, feature map, normaliser, decays, window, refusals) against the
mechanism's dense reference; the kernels themselves on a GPU (tests/kernels/test_fused_gpu.py).
"""

from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch

from attnbench import registry
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import compare_paths, judge_approximate
from attnbench.libraries import fla
from attnbench.variants.linear import elu_plus_one

with warnings.catch_warnings():  # "Triton is not supported on current platform": expected here
    warnings.simplefilter("ignore")
    naive = pytest.importorskip("fla.ops.linear_attn.naive", reason="needs fla-core")
    from fla.ops.attn.naive import naive_parallel_attn
    from fla.ops.retention.naive import naive_retention

CAUSAL = [True]  # FLA's kernels are causal only (bidirectional calls are refused, tested below)


def _linear(q, k, v, scale=None, normalize=False):
    """The chunk / recurrent kernel's contract, [B, T, H, D], by FLA's naive recurrence."""
    return naive.naive_recurrent_linear_attn(q, k, v, scale=scale, normalize=normalize)


def _retention(q, k, v, scale=None):
    """FLA's naive retention takes [B, H, T, D] and the default scale 1/sqrt(d)."""
    assert scale == pytest.approx(q.shape[-1] ** -0.5)
    return naive_retention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(
        1, 2
    ), None


def _parallel(q, k, v, scale=None, window_size=None):
    o, _ = naive_parallel_attn(q, k, v, scale=scale, window_size=window_size, causal=True)
    return o


@pytest.fixture
def fla_naive(monkeypatch):
    table = {
        "linear-chunk": _linear,
        "linear-recurrent": _linear,
        "retention-chunk": _retention,
        "retention-recurrent": _retention,
        "parallel": _parallel,
    }
    assert set(table) == set(fla.KERNELS)
    monkeypatch.setattr(fla, "kernel", table.__getitem__)


def _check(mech_name: str, path: str, overrides: dict, t: int, dtype, causal: bool = True):
    mech = registry.get(mech_name)
    params = mech.resolve(overrides)
    shape = mech.shape_for(Shape(2, 3, t, 16), params)
    x = make_inputs(mech, shape, params, seed=t, dtype=dtype, requires_grad=True)
    verdicts = compare_paths(
        mech.path(path), mech.reference, x, {"causal": causal, **params}, backward=mech.backward
    )
    assert all(v.ok for v in verdicts), "; ".join(map(str, verdicts))


#: FLA's naive implementations compute in float32 whatever comes in (so float64 inputs would
#: be judged against float32 arithmetic); the half types round their result as the kernels do.
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.usefixtures("fla_naive")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", fla.FORMS)
@pytest.mark.parametrize("t", [1, 37, 130])
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"feature_map": "relu", "normalize": False},
        {"feature_map": "identity", "normalize": False},
    ],
    ids=["elu+1", "relu-bare", "identity-bare"],
)
def test_fla_linear_is_the_linear_mechanism(form, t, overrides, dtype):
    if dtype == torch.float16 and overrides.get("normalize", True):
        pytest.skip("refused: FLA's normaliser overflows float16 (tested below)")
    _check("linear", f"fla-{form}", overrides, t, dtype)


@pytest.mark.usefixtures("fla_naive")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", fla.FORMS)
@pytest.mark.parametrize("t", [1, 37, 130])
def test_fla_retention_is_the_retention_mechanism(form, t, dtype):
    _check("retention", f"fla-{form}", {}, t, dtype)


@pytest.mark.usefixtures("fla_naive")
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("t", [1, 37, 130])
def test_fla_parallel_is_softmax_and_its_window_is_local(t, dtype):
    _check("softmax", "fla-parallel", {}, t, dtype)
    for window in (1, 5, 64, 200):
        _check("local", "fla-parallel", {"window": window}, t, dtype)


@pytest.mark.usefixtures("fla_naive")
def test_fla_refusals_name_what_fla_computes():
    x = make_inputs(registry.get("linear"), Shape(1, 2, 8, 4), {}, seed=0)
    refused = [("linear", "fla-chunk"), ("softmax", "fla-parallel"), ("local", "fla-parallel")]
    for mech, path in refused:
        m = registry.get(mech)
        with pytest.raises(AttnbenchError, match="causal only"):
            m.path(path)(x["q"], x["k"], x["v"], causal=False, **m.resolve({}))
    ret = registry.get("retention")
    with pytest.raises(AttnbenchError, match="normalize=none only"):
        params = ret.resolve({"normalize": "rownorm"})
        ret.path("fla-chunk")(x["q"], x["k"], x["v"], causal=True, **params)


@pytest.mark.usefixtures("fla_naive")
@pytest.mark.parametrize("form", fla.FORMS)
def test_fla_refuses_a_float16_normaliser_and_runs_the_rest(form):
    """FLA keeps phi(q) . sum phi(k) in the input dtype. The refusal is checked against that
    arithmetic: at T = 1023, d = 64 the elu+1 normaliser is past float16's maximum."""
    linear = registry.get("linear")
    params = linear.resolve({})
    x = make_inputs(linear, Shape(1, 2, 1023, 64), params, seed=0, dtype=torch.float32)
    phi_q, phi_k = (elu_plus_one(t) for t in (x["q"], x["k"]))
    normaliser = (phi_q * phi_k.cumsum(-2)).sum(-1)
    assert normaliser.max() > torch.finfo(torch.float16).max
    half = {name: t.half() for name, t in x.items()}
    path = linear.path(f"fla-{form}")
    with pytest.raises(AttnbenchError, match="float16 .* use bfloat16, normalize=False"):
        path(half["q"], half["k"], half["v"], causal=True, **params)
    bare = linear.resolve({"normalize": False})
    out = path(half["q"], half["k"], half["v"], causal=True, **bare)
    assert out.dtype == torch.float16 and out.shape == half["v"].shape


def test_fla_kernel_that_does_not_import_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(fla.KERNELS, "parallel", ("fla.ops.no_such_module", "parallel_attn"))
    with pytest.raises(AttnbenchError, match=r"fla-core: .* does not import .*attnbench\[fla\]"):
        fla.kernel("parallel")


# --------------------------------------------------------------------------------------------
# SageAttention
# --------------------------------------------------------------------------------------------

SOFTMAX = registry.get("softmax")


@pytest.fixture
def fake_sage(monkeypatch):
    """A ``sageattention`` module whose ``sageattn`` computes what sageattention 1.0.6's kernels
    do, in exact arithmetic: softmax attention, asserting the call the adapter must make (layout
    HND, scale 1/sqrt(d), no in-place smoothing, keys with zero mean over the sequence), and, as
    its non-causal kernel does, a partial last block of 64 keys padded with zero keys whose
    scores (0) count in the softmax."""
    calls = []

    def sageattn(q, k, v, tensor_layout, is_causal, sm_scale, smooth_k):
        assert tensor_layout == "HND" and smooth_k is False
        assert sm_scale == pytest.approx(q.shape[-1] ** -0.5)
        assert k.mean(dim=-2).abs().max() < 1e-6 * max(1.0, k.abs().max().item())
        calls.append(is_causal)
        if not is_causal:  # the package's padding: zero keys and values up to the block
            pad = -k.shape[-2] % 64
            k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (k, v))
        return SOFTMAX.reference(q, k, v, causal=is_causal)

    module = types.ModuleType("sageattention")
    module.sageattn = sageattn
    monkeypatch.setitem(sys.modules, "sageattention", module)
    return calls


@pytest.mark.parametrize(("causal", "t"), [(False, 64), (False, 192), (True, 37), (True, 64)])
def test_sage_adapter_smooths_a_copy_of_k_and_matches_softmax(fake_sage, causal, t):
    x = make_inputs(SOFTMAX, Shape(2, 3, t, 64), {}, seed=1, dtype=torch.float64)
    k_before = x["k"].clone()
    path = SOFTMAX.path("sage")
    kwargs = {"causal": causal}
    verdicts = compare_paths(path, SOFTMAX.reference, x, kwargs, tolerance=path.tolerance)
    assert all(v.ok for v in verdicts), "; ".join(map(str, verdicts))
    assert torch.equal(x["k"], k_before)  # the caller's keys are not modified
    assert fake_sage == [causal]


@pytest.mark.parametrize("t", [1, 37, 65, 257])
def test_sage_refuses_non_causal_lengths_its_kernel_pads_wrongly(fake_sage, t):
    """Where the package's non-causal kernel would count padding keys (any length that is not a
    multiple of 64), the path refuses with the reason rather than return a wrong answer, and
    the package is never called."""
    x = make_inputs(SOFTMAX, Shape(1, 2, t, 64), {}, seed=1, dtype=torch.float64)
    with pytest.raises(AttnbenchError, match=rf"multiple of 64 \(got {t}\)"):
        SOFTMAX.path("sage")(x["q"], x["k"], x["v"], causal=False)
    assert fake_sage == []
    # the fake is the package's arithmetic: called directly, it fails SageAttention's own bound,
    # which is what the refusal avoids
    sageattn = sys.modules["sageattention"].sageattn
    k = x["k"] - x["k"].mean(dim=-2, keepdim=True)
    wrong = sageattn(x["q"], k, x["v"], "HND", False, 64**-0.5, False)
    exact = SOFTMAX.reference(x["q"], x["k"], x["v"], causal=False)
    assert not judge_approximate("o", wrong, exact, exact, SOFTMAX.path("sage").tolerance).ok


def test_sage_refuses_head_dims_without_a_kernel_and_backward(fake_sage):
    x = make_inputs(SOFTMAX, Shape(1, 1, 8, 32), {}, seed=1)
    with pytest.raises(AttnbenchError, match=r"head dims \(64, 96, 128\)"):
        SOFTMAX.path("sage")(x["q"], x["k"], x["v"], causal=False)
    reasons = SOFTMAX.path("sage").not_supported_reasons("cuda", backward=True)
    assert any("forward only" in r for r in reasons)


def test_approximate_judge_uses_its_own_bound():
    oracle = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    near = oracle + torch.tensor([0.0, 0.05, 0.0], dtype=torch.float64)  # 2.5 % of max |oracle|
    far = oracle + torch.tensor([0.0, 0.07, 0.0], dtype=torch.float64)  # 3.5 %
    assert judge_approximate("o", near, oracle, oracle, 0.03).ok
    verdict = judge_approximate("o", far, oracle, oracle, 0.03)
    assert not verdict.ok and verdict.allowed == pytest.approx(0.06)


# --------------------------------------------------------------------------------------------
# xFormers
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake_xformers(monkeypatch):
    """``xformers.ops.fmha`` as its documentation states it: [B, M, H, K] in, softmax of
    scale * Q K^T plus the bias; ``LocalAttentionFromBottomRightMask`` lets query q see key k when
    q - window_left <= k + s <= q + window_right (s = queries - keys)."""

    class LowerTriangularMask:
        def visible(self, i, j):
            return j <= i

    class LocalAttentionFromBottomRightMask:
        def __init__(self, window_left, window_right):
            self.left, self.right = window_left, window_right

        def visible(self, i, j):
            return (i - self.left <= j) & (j <= i + self.right)

    def memory_efficient_attention(query, key, value, attn_bias=None, scale=None):
        assert query.stride(-1) == 1 and scale is not None
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))
        scores = (q @ k.transpose(-2, -1)) * scale
        if attn_bias is not None:
            i = torch.arange(q.shape[-2])[:, None]
            j = torch.arange(k.shape[-2])[None, :]
            scores = scores.masked_fill(~attn_bias.visible(i, j), float("-inf"))
        return (scores.softmax(-1) @ v).transpose(1, 2)

    fmha = types.SimpleNamespace(
        attn_bias=types.SimpleNamespace(
            LowerTriangularMask=LowerTriangularMask,
            LocalAttentionFromBottomRightMask=LocalAttentionFromBottomRightMask,
        ),
        memory_efficient_attention=memory_efficient_attention,
    )
    package, ops = types.ModuleType("xformers"), types.ModuleType("xformers.ops")
    ops.fmha = fmha
    package.ops = ops
    monkeypatch.setitem(sys.modules, "xformers", package)
    monkeypatch.setitem(sys.modules, "xformers.ops", ops)


#: What xformers 0.0.35's dispatcher raised on an H100 whose torch (2.11, CUDA 13) its wheel was
#: not built for (shortened).
NO_OPERATOR = """No operator found for `memory_efficient_attention_forward` with inputs:
     query       : shape=(2, 97, 4, 64) (torch.float16)
     attn_bias   : <class 'xformers.ops.fmha.attn_bias.LowerTriangularMask'>
     p           : 0.0
`fa3F@0.0.0` is not supported because:
    xFormers wasn't build with CUDA support
    operator wasn't built - see `python -m xformers.info` for more info
`fa2F@2.5.7-pt` is not supported because:
    requires device with capability == (8, 0) but your GPU has capability (9, 0)"""


def test_xformers_refuses_a_call_it_has_no_kernel_for(fake_xformers, monkeypatch):
    def no_operator(*args, **kwargs):
        raise NotImplementedError(NO_OPERATOR)

    monkeypatch.setattr(sys.modules["xformers.ops"].fmha, "memory_efficient_attention", no_operator)
    x = make_inputs(SOFTMAX, Shape(1, 2, 8, 64), {}, seed=1)
    with pytest.raises(AttnbenchError) as refused:
        SOFTMAX.path("xformers")(x["q"], x["k"], x["v"], causal=True)
    said = str(refused.value)
    assert said == (
        "xFormers has no kernel for this call (torch.float32, head dim 64, LowerTriangularMask): "
        "`fa3F@0.0.0` is not supported: xFormers wasn't build with CUDA support"
    )


def test_xformers_without_compiled_kernels_is_unavailable_with_the_builds(monkeypatch):
    """A wheel built for another torch imports but loads no kernels: the path is unavailable on
    CUDA, with the torch it was built for, and asked only where a CUDA device is."""
    from attnbench.core import capabilities

    info = types.SimpleNamespace(torch_version="2.10.0+cu128", cuda_version=1208)
    package = types.ModuleType("xformers")
    package._has_cpp_library = False
    package._cpp_lib = types.SimpleNamespace(
        _cpp_library_load_exception=types.SimpleNamespace(build_info=info)
    )
    monkeypatch.setitem(sys.modules, "xformers", package)
    monkeypatch.setattr(capabilities, "package_version", lambda dist: "0.0.35")
    monkeypatch.setattr(capabilities, "cuda_available", lambda: True)
    why = capabilities.reasons(["package:xformers"], "cuda")
    assert why.startswith("xformers 0.0.35 has no CUDA kernels here (built for torch "
                          "2.10.0+cu128 with CUDA 12.8; this is torch ")  # fmt: skip
    assert capabilities.reasons(["package:xformers"], "cpu") == ""
    package._has_cpp_library = True  # loaded, but a build without CUDA
    package._cpp_lib = types.SimpleNamespace(_built_with_cuda=False, _build_metadata=None)
    why = capabilities.reasons(["package:xformers"], "cuda")
    assert "(built for another torch or Python, or without CUDA;" in why
    cpu_build = types.SimpleNamespace(torch_version="2.10.0+cpu", cuda_version=None)
    package._cpp_lib = types.SimpleNamespace(_built_with_cuda=False, _build_metadata=cpu_build)
    why = capabilities.reasons(["package:xformers"], "cuda")
    assert "(built for torch 2.10.0+cpu without CUDA;" in why
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)  # ROCm: no CUDA, and fine
    assert capabilities.reasons(["package:xformers"], "cuda") == ""
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    package._cpp_lib._built_with_cuda = True
    assert capabilities.reasons(["package:xformers"], "cuda") == ""


@pytest.mark.usefixtures("fake_xformers")
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("t", [1, 37, 130])
def test_xformers_adapter_is_softmax_and_local(causal, t):
    _check("softmax", "xformers", {}, t, torch.float64, causal=causal)
    for window in (1, 5, 64, 200):
        _check("local", "xformers", {"window": window}, t, torch.float64, causal=causal)
