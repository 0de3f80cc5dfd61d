"""The sparse engine's two executors: on the CPU the parts run on PyTorch's fused flash kernel
(``attnbench.variants.sparse.cpu_fused``), elsewhere chunk by chunk. ``test_sparse.py`` checks the
efficient paths as a CPU user runs them (the fused executor); here, the chunked executor (what a
GPU runs) is checked on the CPU too, the fused one in float64 to rounding (its backward uses the
merged softmax's output and log-sum-exp for every part: exact, not approximate), its mask cache
across lengths and dtypes, and that it never holds an n x n tensor.

The fused executor at the edges (issue 64), every pattern, causal and not, odd lengths, against
the float64 oracle by the rule: outputs at scores up to 1e4 (the merge of the parts), and
outputs and gradients in float16 and bfloat16, with an upstream gradient of 1e-6 in float16.
Gradients at large scores: tests/mechanisms/test_saturated_scores.py."""

from __future__ import annotations

import pytest
import torch

from attnbench import registry
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import compare_paths
from attnbench.measure.memory import cpu_peak
from attnbench.variants.sparse import cpu_fused
from tests.helpers.scores import inputs_at_scores
from tests.helpers.sparse import AT_1000, SMALL, SPARSE

DIRECTIONS = pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
ODD = pytest.mark.parametrize("n", [37, 97])


def _inputs(name: str, params: dict, n: int, dtype=torch.float32, shape=(2, 3, 8), seed=0):
    mech = registry.get(name)
    p = mech.resolve(params)
    B, H, D = shape
    inputs = make_inputs(mech, Shape(B, H, n, D), p, dtype=dtype, seed=seed)
    return mech, p, (inputs["q"], inputs["k"], inputs["v"])


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("n", [7, 97, 1000])
@pytest.mark.parametrize("name", SPARSE)
def test_the_chunked_executor_matches_the_reference(name, n, causal, monkeypatch):
    monkeypatch.setattr(cpu_fused, "supports", lambda *_: False)
    params = AT_1000[name] if n == 1000 else SMALL[name]
    mech = registry.get(name)
    p = mech.resolve(params)
    inputs = make_inputs(mech, Shape(2, 3, n, 8), p, seed=n)
    kwargs = {"causal": causal, **p}
    verdicts = compare_paths(mech.path("efficient"), mech.reference, inputs, kwargs)
    assert all(v.ok for v in verdicts), [str(v) for v in verdicts if not v.ok]


@pytest.mark.parametrize("scores", [1e3, 1e4], ids=lambda s: f"S{s:g}")
@DIRECTIONS
@pytest.mark.parametrize("name", SPARSE)
def test_the_chunked_executor_at_large_scores(name, causal, scores, monkeypatch):
    """Outputs and gradients at saturated scores (exact: integer q and k). The chunked backward
    sums do . o = sum_j p_j dp_j from the dp it subtracts it from: with rowsum(do * o) instead,
    a saturated row kept the two sums' rounding difference, which |q| multiplied into dk (issue
    64: up to 1,000x the rule at S = 6e4)."""
    monkeypatch.setattr(cpu_fused, "supports", lambda *_: False)
    mech = registry.get(name)
    p = mech.resolve(SMALL[name])
    x = inputs_at_scores(mech, Shape(2, 2, 37, 16), p, scores, seed=37, exact=True)
    verdicts = compare_paths(mech.path("efficient"), mech.reference, x, {"causal": causal, **p})
    assert all(v.ok for v in verdicts), [str(v) for v in verdicts if not v.ok]


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("n", [37, 203])  # odd, not a multiple of any block
@pytest.mark.parametrize("name", SPARSE)
def test_fused_outputs_and_gradients_are_exact_in_float64(name, n, causal):
    mech, p, (q, k, v) = _inputs(name, SMALL[name], n, dtype=torch.float64, seed=5)
    grads = []
    for fn in (mech.path("efficient").fn, mech.reference):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = fn(*leaves, causal=causal, **p)
        weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        (out * weight).sum().backward()
        grads.append((out.detach(), *(x.grad for x in leaves)))
    for fast, ref in zip(*grads, strict=True):
        torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-12)


def test_the_mask_cache_tells_lengths_dtypes_and_parameters_apart():
    name = "bigbird"  # random blocks: a stale mask would show at once
    cpu_fused._CACHE.clear()
    one, two = {"block": 4, "seed": 1}, {"block": 4, "seed": 2}
    f32, f64 = torch.float32, torch.float64
    cases = [(40, one, f32), (56, one, f32), (40, two, f32), (40, one, f64), (40, one, f32)]
    for n, params, dtype in cases:
        mech, p, (q, k, v) = _inputs(name, params, n, dtype=dtype)
        fast = mech.path("efficient").fn(q, k, v, causal=False, **p)
        torch.testing.assert_close(fast, mech.reference(q, k, v, causal=False, **p))
    assert len(cpu_fused._CACHE) == 4  # the last case found its masks
    for i in range(2 * cpu_fused.CACHE_SIZE):
        mech, p, (q, k, v) = _inputs("local", {"window": 2}, 20 + i)
        mech.path("efficient").fn(q, k, v, causal=False, **p)
    assert len(cpu_fused._CACHE) == cpu_fused.CACHE_SIZE


@pytest.mark.parametrize("name", ["local", "bigbird"])
def test_fused_peak_memory_stays_far_below_one_score_matrix(name):
    n, H, D = 4096, 2, 16
    mech, p, (q, k, v) = _inputs(name, {}, n, shape=(1, H, D))
    fn = mech.path("efficient").fn
    fn(q, k, v, causal=False, **p)  # masks built and cached outside the measurement
    peak = cpu_peak(lambda: fn(q, k, v, causal=False, **p)).bytes
    scores = H * n * n * 4  # one float32 n x n matrix per head
    assert peak < scores / 8, f"{name}: {peak / 2**20:.1f} MiB at n = {n}"


@pytest.mark.parametrize("scores", [1e3, 1e4], ids=lambda s: f"S{s:g}")
@DIRECTIONS
@ODD
@pytest.mark.parametrize("name", SPARSE)
def test_fused_outputs_at_large_scores(name, n, causal, scores):
    """The parts' outputs merged by their log-sum-exps at scores up to 1e4 (integer q and k, so
    every score is exact: the comparison sees the merge, not the rounding of the scores). Before
    the merge renormalised by the rows' largest log-sum-exp, LongNet missed the rule by 100x at
    1e4, BigBird by 16x."""
    mech = registry.get(name)
    p = mech.resolve(SMALL[name])
    x = inputs_at_scores(mech, Shape(2, 2, n, 16), p, scores, seed=n, exact=True)
    kwargs = {"causal": causal, **p}
    verdicts = compare_paths(mech.path("efficient"), mech.reference, x, kwargs, backward=False)
    assert all(v.ok for v in verdicts), [str(v) for v in verdicts]


@pytest.mark.parametrize(
    ("dtype", "grad_scale"),
    [(torch.float16, 1.0), (torch.bfloat16, 1.0), (torch.float16, 1e-6)],
    ids=["float16", "bfloat16", "float16-tiny-upstream"],
)
@DIRECTIONS
@ODD
@pytest.mark.parametrize("name", SPARSE)
def test_fused_half_precision_outputs_and_gradients(name, n, causal, dtype, grad_scale):
    """Half inputs: the kernel's backward runs in float32 and each gradient is rounded once (in
    half precision a key's gradient was rounded per part, then per sum: BigBird's dv was 5x the
    naive error at an upstream gradient of 1e-6 in float16, which the rule's floor, relative to
    max(scale, 1) before issue 64, could not see)."""
    mech, p, (q, k, v) = _inputs(name, SMALL[name], n, dtype=dtype, shape=(2, 2, 8), seed=n)
    kwargs = {"causal": causal, **p}
    x = {"q": q, "k": k, "v": v}
    fn = mech.path("efficient")
    verdicts = compare_paths(fn, mech.reference, x, kwargs, grad_scale=grad_scale)
    assert all(v.ok for v in verdicts), [str(v) for v in verdicts if not v.ok]
