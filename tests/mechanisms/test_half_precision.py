"""Half precision, round 2 (issue 34): gradients that must fit where the true gradient fits,
references that sum in float32, and extra inputs of another dtype.

Gradients: every path of every mechanism that has a backward, registry-wide, with a large
upstream gradient.

The forward property tests push the inputs to extremes but always back-propagate a unit
gradient; a path can still keep an intermediate gradient in float16 that is much larger than the
gradient it returns (GAU's and FLASH's tiled backward differentiated with respect to a row-scaled
q, sqrt(n s) times dq) and overflow where dq itself fits. Here q is scaled x5 and the upstream
gradient is of order 1000, sized so that the float64 oracle's largest gradient stays a decade
inside float16's range; every gradient must then be finite where the oracle's is, and close to
it. A path may instead refuse in one line (an output beyond the dtype's range).
"""

from __future__ import annotations

import pytest
import torch

from attnbench import registry
from attnbench.api import attention
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from tests.helpers.cases import directions

HALF = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]
#: Where the oracle's largest gradient is put: under a third of float16's 65504.
GRADIENT_TARGET = 20000.0
#: Gradient error allowed, in ulps of the dtype (torch.finfo.eps) relative to the largest oracle
#: gradient: the dtype's rounding of scores, probabilities and sums through a softmax made
#: sharp by q x5 (measured: up to 7 ulps in bfloat16, 4 in float16), far below what an overflow
#: or a lost scale gives (inf, NaN, or an error of the order of the gradient itself).
ULPS = 16


def cases() -> list:
    found = []
    for mech in registry.MECHANISMS:
        if not mech.backward:
            continue
        for path in mech.paths:
            if path.unavailable("cpu", True):
                continue
            for causal in directions(mech):
                tag = "causal" if causal else "bidir"
                found.append(pytest.param(mech, path, causal, id=f"{mech.name}:{path.name}-{tag}"))
    return found


def _grads(mech, path, x: dict[str, torch.Tensor], causal: bool, params, do: torch.Tensor):
    leaves = {n: t.detach().requires_grad_() for n, t in x.items() if t.is_floating_point()}
    out = path(**{**x, **leaves}, causal=causal, **params)
    grads = torch.autograd.grad(out, list(leaves.values()), do.to(out.dtype), allow_unused=True)
    return {n: g for n, g in zip(leaves, grads, strict=True) if g is not None}


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(("mech", "path", "causal"), cases())
def test_half_gradients_fit_where_the_true_gradients_fit(mech, path, causal, dtype):
    params = mech.resolve({})
    shape = mech.shape_for(Shape(1, 2, 515, 48), params)
    x = make_inputs(mech, shape, params, dtype=torch.float64, seed=0)
    x["q"] = x["q"] * 5
    x = {n: t.to(dtype) for n, t in x.items()}
    x64 = {n: t.double() for n, t in x.items()}  # the oracle reads the same rounded inputs
    out64 = mech.reference(**x64, causal=causal, **params)
    unit = torch.randn(out64.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    probe = _grads(mech, mech.reference, x64, causal, params, unit)
    largest = max(g.abs().max().item() for g in probe.values())
    # an upstream gradient of order 1000, rounded to the dtype as the path receives it
    do = (unit * min(1000.0, GRADIENT_TARGET / largest)).to(dtype).double()
    oracle = _grads(mech, mech.reference, x64, causal, params, do)
    try:
        got = _grads(mech, path, x, causal, params, do)
    except AttnbenchError as e:  # only a clear refusal of an output beyond float16's range
        assert dtype == torch.float16 and "beyond float16's range" in str(e), str(e)
        return
    for name, want in oracle.items():
        g = got[name].double()
        where = f"{mech.name}:{path.name} {'causal' if causal else 'bidir'} d{name}"
        assert torch.isfinite(g).all(), f"{where}: inf/NaN where the true gradient fits"
        scale = want.abs().max().item()
        error = (g - want).abs().max().item()
        allowed = ULPS * torch.finfo(dtype).eps * scale
        assert error <= allowed, f"{where}: error {error:.3g} of scale {scale:.3g} > {allowed:.3g}"


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("chunk", [256, 64])
def test_flash_efficient_float16_dq_where_it_fits(causal, chunk):
    """The issue's case: T = 515, head dim 48, q x5, an upstream gradient of order 1000 in
    float16 (at most x1000, so that the true dq stays under 30,000): dq fits float16; the
    row-scaled intermediate (sqrt(c s) times larger) does not, and it was kept in float16 (inf,
    NaN at chunk 64)."""
    mech = registry.get("flash")
    params = mech.resolve({"chunk": chunk})
    shape = mech.shape_for(Shape(1, 2, 515, 48), params)
    x = make_inputs(mech, shape, params, dtype=torch.float64, seed=0)
    x["q"] = x["q"] * 5
    x = {n: t.half() for n, t in x.items()}
    x64 = {n: t.double() for n, t in x.items()}
    out = mech.reference(**x64, causal=causal, **params)
    unit = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    dq_unit = _grads(mech, mech.reference, x64, causal, params, unit)["q"].abs().max().item()
    do = (unit * min(1000.0, 30000.0 / dq_unit)).half()  # order 1000, the true dq inside range
    want = _grads(mech, mech.reference, x64, causal, params, do.double())["q"]
    assert want.abs().max() < 65504
    got = _grads(mech, mech.path("efficient"), x, causal, params, do)["q"].double()
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= 16 * 2**-10 * want.abs().max()


# ------------------------------------------------------------------------------------------------
# References in float16: float32 sums, or a clear refusal
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", ["rownorm", "none"])
def test_retention_parallel_in_float16_agrees_with_the_other_forms(normalize):
    """q x 1e4, T = 129: with row normalisation the output fits and the parallel form agrees
    with chunkwise and recurrent (it returned NaN); without it the output is beyond float16 and
    every form refuses in one line naming itself (the parallel form returned inf)."""
    mech = registry.get("retention")
    params = mech.resolve({"normalize": normalize})
    x = make_inputs(mech, Shape(1, 2, 129, 16), params, dtype=torch.float64, seed=0)
    x["q"] = x["q"] * 1e4
    half = {n: t.half() for n, t in x.items()}
    if normalize == "none":
        for path in ("parallel", "chunkwise", "recurrent"):
            with pytest.raises(AttnbenchError, match=f"^retention:{path}: the output"):
                mech.path(path)(**half, causal=True, **params)
        return
    outs = {p: mech.path(p)(**half, causal=True, **params) for p in ("parallel", "chunkwise")}
    assert torch.isfinite(outs["parallel"]).all()
    torch.testing.assert_close(outs["parallel"], outs["chunkwise"], rtol=2e-3, atol=2e-3)


def test_mc_softmax_reference_sums_in_float32():
    mech = registry.get("mc-softmax")
    params = mech.resolve({})
    x = make_inputs(mech, mech.shape_for(Shape(1, 2, 97, 16), params), params,
                    dtype=torch.float64, seed=0)  # fmt: skip
    x["q_lin"] = x["q_lin"] * 1e4  # the old float16 reference returned NaN here
    half = {n: t.half() for n, t in x.items()}
    oracle = mech.reference(**{n: t.double() for n, t in half.items()}, causal=False, **params)
    out = mech.reference(**half, causal=False, **params)
    assert torch.isfinite(out).all()  # it returned inf/NaN
    assert (out.double() - oracle).abs().max() <= 8 * 2**-10 * oracle.abs().max()


# ------------------------------------------------------------------------------------------------
# Extra inputs of another dtype or device: one rule for every mechanism
# ------------------------------------------------------------------------------------------------

WITH_EXTRAS = [
    pytest.param(m, id=m.name) for m in registry.MECHANISMS if m.extras_for(m.resolve({}))
]


@pytest.mark.parametrize("mech", WITH_EXTRAS)
def test_extra_inputs_of_another_dtype_are_one_line_errors(mech):
    params = mech.resolve({})
    x = make_inputs(mech, mech.shape_for(Shape(1, 2, 33, 16), params), params,
                    dtype=torch.float16, seed=0)  # fmt: skip
    for spec in mech.extras_for(params):
        bad = {**x, spec.name: x[spec.name].float()}
        with pytest.raises(AttnbenchError) as info:
            attention(mech.name, **bad, causal=not mech.bidirectional)
        message = str(info.value)
        assert "\n" not in message and spec.name in message
        assert "float32" in message and "float16" in message
    out = attention(mech.name, **x, causal=not mech.bidirectional)  # the same dtype: fine
    assert out.dtype == torch.float16
