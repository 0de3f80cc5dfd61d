"""The bidirectional (global) linear-attention Triton kernels (attnbench/kernels/triton_linear.py)
under Triton's CPU interpreter, against a dense float64 oracle written here from the formula,
outputs and gradients: every feature map, normalised and not, eps, scale, B and H > 1, D != Dv,
T = 37 with 16-wide tiles and several T splits (a ragged last tile and a short last split),
float32 and float16 (bfloat16 where the interpreter's tl.dot is right), very negative features,
states and row factors beyond float16's range; then the wired ``linear:triton`` and
``flash:triton`` bidirectional paths against their mechanisms' references.

Not collected by default (the name does not start with ``test_``):
tests/kernels/test_triton_interpret.py runs it in a fresh ``python -m pytest`` with
``TRITON_INTERPRET=1`` (see interpreted_triton.py for why a subprocess). Run it alone with
``TRITON_INTERPRET=1 pytest tests/kernels/interpreted_linear.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

from attnbench.core.precision import float32_sums
from attnbench.core.testing import compare_paths

if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("1", "true", "on", "yes"):
    pytest.skip("needs TRITON_INTERPRET=1 from the start", allow_module_level=True)
pytest.importorskip("triton", reason="Triton is not installed")

from attnbench.core.errors import AttnbenchError  # noqa: E402
from attnbench.kernels import triton_ops  # noqa: E402
from tests.helpers.dense_refs import make_qkv  # noqa: E402
from tests.helpers.interpreter import DTYPES, interpreter_bf16_dot_ok  # noqa: E402

TILE = 16  # the interpreter is slow; 16 is tl.dot's smallest tile
SPLITS = 2  # T = 37 in 16-wide tiles: 3 tiles, split 2 + 1 (the last split short and ragged)


@pytest.fixture
def dtype(request):
    if request.param == torch.bfloat16 and not interpreter_bf16_dot_ok():
        pytest.skip("Triton's interpreter computes tl.dot on bf16 wrongly (checked on GPU)")
    return request.param


def _phi(x, feature_map):
    """The feature maps, written out: elu(x) + 1 is x + 1 above 0 and e^x below."""
    if feature_map == "elu+1":
        return torch.where(x > 0, x + 1, torch.exp(x.clamp(max=0)))
    if feature_map == "relu":
        return torch.relu(x)
    assert feature_map == "identity"
    return x


@float32_sums(name="test:global-linear")
def global_linear_reference(q, k, v, *, feature_map, normalize, eps, scale):
    """Dense: A = phi(q) phi(k)^T (T x T), o = scale * A v / (A 1 + eps) (or scale * A v).
    Half inputs in float32 (float32_sums), as the mechanism's reference."""
    a = _phi(q, feature_map) @ _phi(k, feature_map).transpose(-1, -2)  # (B, H, T, T)
    o = a @ v  # (B, H, T, Dv)
    if normalize:
        o = o / (a.sum(-1, keepdim=True) + eps)
    return scale * o


def kernel(block=TILE, splits=SPLITS):
    def fast(q, k, v, **kw):
        return triton_ops.linear_attention_global(q, k, v, **kw, block=block, splits=splits)

    return fast


def check(fast, reference, inputs, kwargs=None):
    verdicts = compare_paths(fast, reference, inputs, kwargs or {})
    assert all(v.ok for v in verdicts), "; ".join(map(str, verdicts))


#: (feature_map, normalize, eps): every map with and without the normaliser (identity
#: normalised only on positive inputs, below: q . sum k has no sign).
CASES = [
    ("elu+1", True, 1e-6),
    ("elu+1", True, 0.5),
    ("elu+1", False, 0.0),
    ("relu", True, 1e-3),
    ("relu", False, 0.0),
    ("identity", False, 0.0),
]


def _case_id(case) -> str:
    fm, norm, eps = case
    return f"{fm}-{'norm' if norm else 'bare'}-eps{eps:g}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_fwd_bwd_float32(case):
    fm, norm, eps = case
    kwargs = {"feature_map": fm, "normalize": norm, "eps": eps, "scale": 0.7}
    inputs = make_qkv(2, 2, 37, 20, 12, torch.float32, seed=len(fm) + norm)
    check(kernel(), global_linear_reference, inputs, kwargs)


def test_identity_normalised_positive_inputs():
    """identity with the normaliser: defined where q . sum k > 0 (positive inputs here)."""
    x = make_qkv(2, 1, 37, 16, 24, torch.float32, seed=3)
    inputs = {"q": x["q"].abs() + 0.5, "k": x["k"].abs() + 0.5, "v": x["v"]}
    kwargs = {"feature_map": "identity", "normalize": True, "eps": 1e-6, "scale": 2.0}
    check(kernel(), global_linear_reference, inputs, kwargs)


HALF_CASES = [("elu+1", True, 1e-6), ("relu", False, 0.0), ("identity", False, 0.0)]


@pytest.mark.parametrize("dtype", DTYPES[1:], indirect=True)
@pytest.mark.parametrize("case", HALF_CASES, ids=[_case_id(c) for c in HALF_CASES])
def test_fwd_bwd_half(dtype, case):
    fm, norm, eps = case
    kwargs = {"feature_map": fm, "normalize": norm, "eps": eps, "scale": 0.25}
    check(kernel(), global_linear_reference, make_qkv(2, 2, 37, 16, 24, dtype, seed=11), kwargs)


@pytest.mark.parametrize(
    ("t", "block", "splits"),
    [(1, 16, None), (16, 16, 1), (37, 16, 3), (37, 16, 7), (70, 32, 2), (37, 64, None)],
    ids=["T1", "T16-one-tile", "T37-split-per-tile", "T37-more-splits-than-tiles", "T70-32",
         "T37-default-split"],
)  # fmt: skip
def test_tiles_and_splits(t, block, splits):
    """The result does not depend on the tile or the T splits (up to float32 rounding)."""
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 1e-6, "scale": 1.0}
    inputs = make_qkv(1, 2, t, 16, 16, torch.float32, seed=t)
    check(kernel(block, splits), global_linear_reference, inputs, kwargs)


def test_very_negative_features_do_not_cancel():
    """elu + 1 at x ~ -30: e^x ~ 1e-13, where (e^x - 1) + 1 is exactly 0 in float32 (then every
    feature is 0 and, with eps = 0, the output NaN). The kernel must give the weighted mean."""
    x = make_qkv(2, 2, 37, 16, 8, torch.float32, seed=5)
    inputs = {"q": x["q"] - 30.0, "k": x["k"] - 30.0, "v": x["v"]}
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 0.0, "scale": 1.0}
    check(kernel(), global_linear_reference, inputs, kwargs)
    with torch.no_grad():
        o = kernel()(**inputs, **kwargs)
    assert torch.isfinite(o).all() and o.abs().max() > 0.05  # a mean of N(0, 1) values


@pytest.mark.parametrize("dtype", DTYPES[1:], indirect=True)
def test_half_negative_features(dtype):
    """x ~ -9 in 16 bits: e^x ~ 1e-4, a normal float16; the operands keep it."""
    x = make_qkv(1, 2, 37, 16, 16, dtype, seed=6)
    inputs = {"q": x["q"] - 9.0, "k": x["k"] - 9.0, "v": x["v"]}
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 0.0, "scale": 1.0}
    check(kernel(), global_linear_reference, inputs, kwargs)


@pytest.mark.parametrize("dtype", DTYPES[1:], indirect=True)
def test_half_state_beyond_float16_range(dtype):
    """S = sum phi(k)^T v ~ 64 * 1.3 * 1000 ~ 8e4 > 65504: the float32 state enters the 16-bit
    dots as power-of-two-scaled hi + lo parts, so the normalised output (a mean of v ~ 1000)
    and the gradients come out right; one 16-bit cast of S would be inf."""
    x = make_qkv(1, 2, 64, 16, 16, dtype, seed=7)
    inputs = {"q": x["q"], "k": x["k"], "v": (x["v"].double() + 1000.0).to(dtype)}
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 1e-6, "scale": 1.0}
    check(kernel(), global_linear_reference, inputs, kwargs)


@pytest.mark.parametrize("dtype", DTYPES[1:], indirect=True)
def test_half_tiny_row_factors(dtype):
    """q, k ~ 200: den ~ 37 * 16 * 4e4 ~ 2e7, so the backward's row factor 1 / den ~ 4e-8 is
    below float16's smallest subnormal (6e-8): folded into do as is, dS and dv would be ~0.
    The kernel scales it by the tile's largest factor (a power of two) first."""
    x = make_qkv(1, 2, 37, 16, 16, dtype, seed=8)
    inputs = {
        "q": (x["q"].double() + 200.0).to(dtype),
        "k": (x["k"].double() + 200.0).to(dtype),
        "v": x["v"],
    }
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 1e-6, "scale": 1.0}
    check(kernel(), global_linear_reference, inputs, kwargs)


def test_value_dim_split(monkeypatch):
    """v wider than a kernel tile is split into slices (autograd sums their dq, dk)."""
    monkeypatch.setattr(triton_ops, "MAX_HEAD_DIM", 16)
    kwargs = {"feature_map": "relu", "normalize": True, "eps": 1e-6, "scale": 1.0}
    check(kernel(), global_linear_reference, make_qkv(1, 2, 21, 16, 40, torch.float32), kwargs)


def test_deterministic():
    """No atomics: two runs agree bit for bit, output and gradients."""
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 1e-6, "scale": 1.0}
    x = make_qkv(2, 1, 37, 16, 16, torch.float16, seed=9)
    runs = []
    for _ in range(2):
        leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
        o = kernel(splits=3)(**leaves, **kwargs)
        o.backward(torch.ones_like(o))
        runs.append([o.detach(), *(leaves[n].grad for n in "qkv")])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_refusals():
    q = torch.randn(1, 1, 8, 16)
    with pytest.raises(AttnbenchError, match="accepted: elu"):
        triton_ops.linear_attention_global(q, q, q, feature_map="softmax")
    with pytest.raises(AttnbenchError, match="power of two >= 16"):
        triton_ops.linear_attention_global(q, q, q, block=24)
    with pytest.raises(AttnbenchError, match="splits"):
        triton_ops.linear_attention_global(q, q, q, splits=0)
    with pytest.raises(AttnbenchError, match="finite"):
        triton_ops.linear_attention_global(q, q, q, eps=float("nan"))
    with pytest.raises(AttnbenchError, match="does not take torch.float64"):
        triton_ops.linear_attention_global(q.double(), q.double(), q.double())


# --------------------------------------------------------------------------------------------
# The wired registry paths, bidirectional: linear:triton and flash:triton's global part, with the
# mechanism's own resolved params, against the mechanism's own reference. T = 70 crosses the
# default 64-wide tile; 37 is ragged.
# --------------------------------------------------------------------------------------------

WIRED = [
    ("linear", {}, 70, torch.float32),
    ("linear", {"eps": 0.1}, 37, torch.float32),
    ("linear", {"normalize": False}, 37, torch.float32),
    ("linear", {"feature_map": "relu"}, 37, torch.float32),
    ("linear", {"feature_map": "relu", "normalize": False}, 70, torch.float32),
    ("linear", {"feature_map": "identity", "normalize": False}, 37, torch.float32),
    ("linear", {}, 37, torch.float16),
    ("linear", {"feature_map": "relu", "normalize": False}, 37, torch.float16),
    ("linear", {}, 37, torch.bfloat16),
    ("flash", {"chunk": 12, "norm": "n2"}, 37, torch.float32),
    ("flash", {"chunk": 16}, 70, torch.float32),
    ("flash", {"chunk": 16}, 37, torch.float16),
    ("flash", {"chunk": 16}, 37, torch.bfloat16),
]


def _wired_id(case) -> str:
    name, over, t, dtype = case
    params = "-".join(f"{k}={v}" for k, v in over.items()) or "defaults"
    return f"{name}:{params}-bidir-T{t}-{str(dtype).removeprefix('torch.')}"


@pytest.mark.parametrize("case", WIRED, ids=[_wired_id(c) for c in WIRED])
def test_wired_bidirectional(case):
    from attnbench import registry
    from attnbench.core.inputs import make_inputs
    from attnbench.core.spec import Shape

    name, overrides, t, dtype = case
    if dtype == torch.bfloat16 and not interpreter_bf16_dot_ok():
        pytest.skip("Triton's interpreter computes tl.dot on bf16 wrongly (checked on GPU)")
    mech = registry.get(name)
    params = mech.resolve(overrides)
    shape = mech.shape_for(Shape(2, 2, t, 16), params)
    inputs = make_inputs(mech, shape, params, dtype=dtype, seed=t)
    check(mech.path("triton"), mech.reference, inputs, {"causal": False, **params})


def test_wired_flash_value_dim_split(monkeypatch):
    """flash's e = 2 s = 32: the global part in slices of 16, autograd sums dq_lin, dk_lin."""
    from attnbench import registry
    from attnbench.core.inputs import make_inputs
    from attnbench.core.spec import Shape

    monkeypatch.setattr(triton_ops, "MAX_HEAD_DIM", 16)
    mech = registry.get("flash")
    params = mech.resolve({"chunk": 8})
    shape = mech.shape_for(Shape(1, 2, 29, 16), params)
    inputs = make_inputs(mech, shape, params, seed=4)
    check(mech.path("triton"), mech.reference, inputs, {"causal": False, **params})


def test_wired_linear_float16_overflow_refused():
    """The unnormalised float16 sum past 65504: refused in one line, never inf."""
    from attnbench import registry

    x = make_qkv(1, 1, 37, 16, 16, torch.float16, seed=10)
    big = {"q": x["q"].abs() + 8, "k": x["k"].abs() + 8, "v": x["v"].abs() + 8}
    path = registry.get("linear").path("triton")
    with pytest.raises(AttnbenchError, match="beyond float16's range"):
        path(**big, causal=False, feature_map="relu", normalize=False, eps=0.0)
