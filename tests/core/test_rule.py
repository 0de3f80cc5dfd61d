"""The rule every faster path is judged by (attnbench.core.testing): its floor is relative to the
size of the quantity compared (issue 64), so a computation scaled by 1e-6 is judged as strictly
as at unit scale, while a gradient that cancels to 0 is judged at the upstream gradient's size."""

from __future__ import annotations

import pytest
import torch

from attnbench.core.testing import FACTOR_GRAD, compare_paths, floor, judge
from attnbench.variants.dense import softmax_attention


def _tensors(size: float, error: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An oracle of max-abs ``size``, a baseline off by nothing and a path off by ``error``."""
    oracle = torch.linspace(-size, size, 64, dtype=torch.float64)
    fast = (oracle + error).float()
    return fast, oracle.float(), oracle


@pytest.mark.parametrize("size", [1.0, 1e-3, 1e-6])
def test_the_floor_scales_with_the_quantity_compared(size):
    """The same relative error fails at every scale (the old floor, relative to max(scale, 1),
    let any error below 4e-6 through on a tensor of size 1e-6: a 400 % error)."""
    terms = 100
    relative = 2 * floor(torch.float32, terms)  # twice what the floor allows
    fast, base, oracle = _tensors(size, relative * size)
    assert not judge("dv", fast, base, oracle, FACTOR_GRAD, terms).ok
    fast, base, oracle = _tensors(size, 0.5 * floor(torch.float32, terms) * size)
    assert judge("dv", fast, base, oracle, FACTOR_GRAD, terms).ok


def test_an_all_zero_gradient_is_judged_at_the_upstream_gradients_size():
    """dq at T = 1 is exactly 0 while its terms are of the upstream gradient's order: the floor
    is relative to ``unit`` there, not to 0 (which would fail every rounding error)."""
    oracle = torch.zeros(8, dtype=torch.float64)
    fast = torch.full((8,), 1e-8)
    unit = 1e-2  # the upstream gradient's RMS
    assert judge("dq", fast, oracle.float(), oracle, FACTOR_GRAD, 8, unit).ok
    assert not judge("dq", fast, oracle.float(), oracle, FACTOR_GRAD, 8, 1e-4).ok


def test_a_tiny_upstream_gradient_is_judged_relative_to_itself():
    """compare_paths with ``grad_scale``: the upstream gradient is rounded to the test dtype
    before the oracle reads it (in float16, 1e-6 is subnormal: unrounded, the oracle would judge
    the rounding of the upstream gradient, not the path); the reference itself passes, and a
    backward 50 % off fails on every gradient (the old floor passed it: 50 % of 1e-6 is far below
    16 ulps of float16 at unit scale; in float16 a 1e-6 gradient is subnormal, so the naive
    baseline itself is a few percent off)."""
    g = torch.Generator().manual_seed(0)
    x = {n: torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float16) for n in "qkv"}

    def half_off(q, k, v, *, causal):
        return _ScaleGrad.apply(_reference(q, k, v, causal=causal))

    kwargs = {"causal": False}
    exact = compare_paths(_reference, _reference, x, kwargs, grad_scale=1e-6)
    assert all(v.ok for v in exact), [str(v) for v in exact]
    wrong = compare_paths(half_off, _reference, x, kwargs, grad_scale=1e-6)
    assert {v.name for v in wrong if not v.ok} == {"dq", "dk", "dv"}


def _reference(q, k, v, *, causal):
    return softmax_attention(q, k, v)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward passes 1.5 x the gradient (a 50 % gradient error)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 1.5
