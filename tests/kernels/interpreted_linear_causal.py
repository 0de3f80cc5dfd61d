"""The fused causal linear-attention kernels (attnbench/kernels/triton_linear_causal.py: phi, the
normaliser and eps inside the chunk kernels) under Triton's CPU interpreter, against a dense
float64 oracle written here from the formula, outputs and the gradients of q, k and v: every
feature map, normalised and not, several eps, B and H > 1, D != Dv, T = 150 in 16-wide tiles
(10 tiles, the last ragged; the states split into D and Dv tiles), T shorter than a tile, the
default 64-wide tile, inputs in a [B, T, H, D] layout; float32, float16 and bfloat16 (the
interpreter's bf16 tl.dot replaced by the GPU's arithmetic, exact products summed in float32:
tests/helpers/interpreter.py); very negative features, row factors 1 / den below float16's
subnormals, values with a mean; then the wired ``linear:triton-fused`` path against the
mechanism's reference, causal and bidirectional.

Tolerances: flash-attention's rule (attnbench.core.testing) against the float64 oracle, the same
for every dtype: an error at most 2x (output) or 3x (gradients) the naive reference's own error
in the test dtype (half inputs summed in float32, as the mechanism's reference does), plus a
floor of 2^-19 (float32), 2^-6 (float16) or 2^-4 (bfloat16) of the compared tensor's largest
entry, and 4 float32 ulps times sqrt(T D) for the order of the sums.

Not collected by default (the name does not start with ``test_``):
tests/kernels/test_triton_interpret.py runs it in a fresh process with ``TRITON_INTERPRET=1``
(see interpreted_triton.py for why). Alone: ``TRITON_INTERPRET=1 pytest
tests/kernels/interpreted_linear_causal.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

from attnbench.core.precision import float32_sums

if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("1", "true", "on", "yes"):
    pytest.skip("needs TRITON_INTERPRET=1 from the start", allow_module_level=True)
pytest.importorskip("triton", reason="Triton is not installed")

from attnbench.core.errors import AttnbenchError  # noqa: E402
from attnbench.kernels import linear_causal_ops, triton_linear_causal  # noqa: E402
from tests.helpers.dense_refs import make_qkv  # noqa: E402
from tests.helpers.interpreter import (  # noqa: E402
    DTYPES,
    check,
    interpret_bf16_dots_as_the_gpu,
    interpreter_bf16_dot_ok,
)

interpret_bf16_dots_as_the_gpu()

TILE = 16  # the interpreter is slow; 16 is tl.dot's smallest tile


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


@float32_sums(name="test:causal-linear")
def causal_linear_reference(q, k, v, *, feature_map, normalize, eps):
    """Dense: A = phi(q) phi(k)^T, zero above the diagonal; o = A v / (A 1 + eps) (or A v).
    Half inputs in float32 (float32_sums), as the mechanism's reference."""
    a = (_phi(q, feature_map) @ _phi(k, feature_map).transpose(-1, -2)).tril()  # (B, H, T, T)
    o = a @ v
    if normalize:
        o = o / (a.sum(-1, keepdim=True) + eps)
    return o


def kernel(block=TILE):
    def fast(q, k, v, **kw):
        return linear_causal_ops.linear_attention_causal(q, k, v, **kw, block=block)

    return fast


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
def test_fwd_bwd_float32_many_tiles(case):
    """D = 40, Dv = 24: the state passes in 32-wide D tiles (two, the second ragged) and one
    Dv tile; 10 position tiles, the last of 6."""
    fm, norm, eps = case
    kwargs = {"feature_map": fm, "normalize": norm, "eps": eps}
    check(kernel(), causal_linear_reference, make_qkv(2, 2, 150, 40, 24, torch.float32,
                                                      seed=len(fm) + norm), kwargs)  # fmt: skip


def test_wide_heads_cross_every_tile():
    """D = 80 (a 128-wide q/k tile, two 64-wide D slices in dq/dk), Dv = 80 (two Dv tiles in
    the output and dv kernels and in dq/dk's loops, three 32-wide state tiles)."""
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 1e-6}
    check(kernel(), causal_linear_reference, make_qkv(1, 2, 70, 80, 80, torch.float32, seed=2),
          kwargs)  # fmt: skip


def test_identity_normalised_positive_inputs():
    x = make_qkv(2, 1, 37, 16, 24, torch.float32, seed=3)
    inputs = {"q": x["q"].abs() + 0.5, "k": x["k"].abs() + 0.5, "v": x["v"]}
    kwargs = {"feature_map": "identity", "normalize": True, "eps": 1e-6}
    check(kernel(), causal_linear_reference, inputs, kwargs)


#: Every map in 16 bits, with and without the normaliser (identity normalised: see above).
HALF_CASES = [c for c in CASES if c[2] != 0.5]


@pytest.mark.parametrize("dtype", DTYPES[1:], indirect=True)
@pytest.mark.parametrize("case", HALF_CASES, ids=[_case_id(c) for c in HALF_CASES])
def test_fwd_bwd_half(dtype, case):
    fm, norm, eps = case
    kwargs = {"feature_map": fm, "normalize": norm, "eps": eps}
    check(kernel(), causal_linear_reference, make_qkv(2, 2, 70, 16, 24, dtype, seed=11), kwargs)


@pytest.mark.parametrize(
    ("t", "block"), [(0, 16), (1, 16), (5, 16), (150, None)], ids=["T0", "T1", "T5", "T150-tile64"]
)
def test_lengths_and_the_default_tile(t, block):
    """T = 0: nothing launched, an empty output and zero gradients; T = 1 and 5: one tile,
    mostly padding, no state ever added to; T = 150 on the default 64-wide tile (3 tiles, the
    last of 22)."""
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 1e-6}
    check(kernel(block), causal_linear_reference, make_qkv(2, 2, t, 16, 16, torch.float32,
                                                           seed=t), kwargs)  # fmt: skip


def test_strided_inputs():
    """q, k, v views of [B, T, H, D] tensors (the layout of a projection's output): the
    kernels read the batch, head and position strides, only the last dim contiguous."""
    x = make_qkv(2, 3, 37, 16, 24, torch.float32, seed=4)
    inputs = {n: t.transpose(1, 2).contiguous().transpose(1, 2) for n, t in x.items()}
    assert not inputs["q"].is_contiguous() and inputs["q"].stride(-1) == 1
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 1e-6}
    check(kernel(), causal_linear_reference, inputs, kwargs)


def test_very_negative_features_do_not_cancel():
    """elu + 1 at x ~ -30, eps = 0: e^x ~ 1e-13 (never (e^x - 1) + 1, which is 0 in float32,
    and then 0 / 0); the output is the weighted mean of v."""
    x = make_qkv(2, 2, 37, 16, 8, torch.float32, seed=5)
    inputs = {"q": x["q"] - 30.0, "k": x["k"] - 30.0, "v": x["v"]}
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 0.0}
    check(kernel(), causal_linear_reference, inputs, kwargs)


@pytest.mark.parametrize("dtype", DTYPES[1:], indirect=True)
def test_half_tiny_row_factors(dtype):
    """q, k ~ 200: den ~ 37 * 16 * 4e4 ~ 2e7, so 1 / den ~ 4e-8 is below float16's smallest
    subnormal (6e-8): folded into do as is, dv, dk and the backward states would be ~0. The
    kernels scale it by the tile's largest factor (a power of two) first."""
    x = make_qkv(1, 2, 37, 16, 16, dtype, seed=8)
    inputs = {"q": (x["q"].double() + 200.0).to(dtype), "k": (x["k"].double() + 200.0).to(dtype),
              "v": x["v"]}  # fmt: skip
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 1e-6}
    check(kernel(), causal_linear_reference, inputs, kwargs)


@pytest.mark.parametrize("dtype", DTYPES[1:], indirect=True)
def test_half_values_with_a_mean(dtype):
    """v ~ 4 + N(0, 1): delta = do . o reads the 16-bit o, and the dS terms cancel by the mean;
    the error stays within the rule at this mean (see the kernel module's docstring)."""
    x = make_qkv(1, 2, 70, 16, 16, dtype, seed=9)
    inputs = {**x, "v": (x["v"].double() + 4.0).to(dtype)}
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 1e-6}
    check(kernel(), causal_linear_reference, inputs, kwargs)


def test_deterministic():
    """No atomics: two runs agree bit for bit, output and gradients."""
    kwargs = {"feature_map": "elu+1", "normalize": True, "eps": 1e-6}
    x = make_qkv(2, 1, 37, 16, 16, torch.float16, seed=10)
    runs = []
    for _ in range(2):
        leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
        o = kernel()(**leaves, **kwargs)
        o.backward(torch.ones_like(o))
        runs.append([o.detach(), *(leaves[n].grad for n in "qkv")])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_states_are_their_sums():
    """The forward states: h_i = sum_{s < 16 i} phi(k_s)^T v_s and z_i = sum_{s < 16 i}
    phi(k_s), one slot per tile."""
    x = make_qkv(2, 3, 70, 24, 40, torch.float64, seed=12)
    q, k, v = (x[n].float() for n in "qkv")
    _, h, z, _ = triton_linear_causal.forward(q, k, v, "relu", True, 0.0, TILE)
    fk = x["k"].relu()
    for i in range(h.shape[1]):
        want = fk[:, :, : i * TILE].transpose(-1, -2) @ x["v"][:, :, : i * TILE]  # (B, H, D, Dv)
        torch.testing.assert_close(h[:, i].view(2, 3, 24, 40).double(), want, rtol=1e-5, atol=1e-4)
        want = fk[:, :, : i * TILE].sum(2)  # (B, H, D)
        torch.testing.assert_close(z[:, i].view(2, 3, 24).double(), want, rtol=1e-5, atol=1e-4)


def test_refusals():
    q = torch.randn(1, 1, 8, 16)
    with pytest.raises(AttnbenchError, match="accepted: elu"):
        linear_causal_ops.linear_attention_causal(q, q, q, feature_map="softmax")
    with pytest.raises(AttnbenchError, match="power of two >= 16"):
        linear_causal_ops.linear_attention_causal(q, q, q, block=24)
    with pytest.raises(AttnbenchError, match="a number >= 0"):
        linear_causal_ops.linear_attention_causal(q, q, q, eps=float("nan"))
    with pytest.raises(AttnbenchError, match="does not take torch.float64"):
        linear_causal_ops.linear_attention_causal(q.double(), q.double(), q.double())
    with pytest.raises(AttnbenchError, match="value dim 130"):
        linear_causal_ops.linear_attention_causal(q, q, torch.randn(1, 1, 8, 130))


# --------------------------------------------------------------------------------------------
# The wired path, linear:triton-fused, with the mechanism's own params and reference
# --------------------------------------------------------------------------------------------

WIRED = [
    ({}, True, 70, torch.float32),
    ({"eps": 0.1}, True, 37, torch.float32),
    ({"normalize": False}, True, 37, torch.float32),
    ({"feature_map": "relu"}, True, 37, torch.float32),
    ({}, True, 37, torch.float16),
    ({}, True, 37, torch.bfloat16),
    ({}, False, 37, torch.float32),
]


def _wired_id(case) -> str:
    over, causal, t, dtype = case
    params = "-".join(f"{k}={v}" for k, v in over.items()) or "defaults"
    direction = "causal" if causal else "bidir"
    return f"{params}-{direction}-T{t}-{str(dtype).removeprefix('torch.')}"


@pytest.mark.parametrize("case", WIRED, ids=[_wired_id(c) for c in WIRED])
def test_wired_triton_fused(case):
    from attnbench import registry
    from attnbench.core.inputs import make_inputs
    from attnbench.core.spec import Shape

    overrides, causal, t, dtype = case
    if dtype == torch.bfloat16 and not interpreter_bf16_dot_ok():
        pytest.skip("Triton's interpreter computes tl.dot on bf16 wrongly (checked on GPU)")
    mech = registry.get("linear")
    params = mech.resolve(overrides)
    inputs = make_inputs(mech, mech.shape_for(Shape(2, 2, t, 16), params), params, dtype=dtype,
                         seed=t)  # fmt: skip
    check(mech.path("triton-fused"), mech.reference, inputs, {"causal": causal, **params})


def test_wired_float16_overflow_refused():
    """The unnormalised float16 sum past 65504: refused in one line, never inf."""
    from attnbench import registry

    x = make_qkv(1, 1, 37, 16, 16, torch.float16, seed=13)
    big = {"q": x["q"].abs() + 8, "k": x["k"].abs() + 8, "v": x["v"].abs() + 8}
    path = registry.get("linear").path("triton-fused")
    with pytest.raises(AttnbenchError, match="beyond float16's range"):
        path(**big, causal=True, feature_map="relu", normalize=False, eps=0.0)
