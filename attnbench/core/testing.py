"""How a faster path is judged against its reference: flash-attention's rule, in one place.

The oracle is the reference path run in float64 on the same inputs. The baseline is the reference
path run naively in the test dtype. A path passes when its error against the oracle is at most
``FACTOR_OUTPUT`` (outputs) or ``FACTOR_GRAD`` (gradients) times the baseline's own error, plus a
small floor per dtype (the baseline's error can be zero or luckily tiny: in float64 the baseline
*is* the oracle). Errors are max-abs; the floor is relative to the size of the quantity compared:
the oracle's max-abs, and for a gradient never less than the root mean square of the upstream
gradient that every gradient is linear in (a gradient can cancel to 0, e.g. dq at T = 1 or at a
saturated softmax, while the products it is summed from are of the upstream gradient's order;
an all-zero oracle must not make every rounding error infinitely large). Nothing in the rule is
absolute: a computation scaled by 1e-6 (a tiny upstream gradient, tiny values) is judged as
strictly as at unit scale.

The floor is what two valid orders of the same sums may differ by, so that a path that sums in
another order (another CPU's vector width, another thread count, a tiled kernel) is not failed
where the naive baseline happens to be exact (it is exactly the oracle in float64, and for some
tiny shapes in float32 too):

    floor = (ROUNDING[dtype] + SUM_ULPS * eps(acc) * sqrt(terms)) * scale

``ROUNDING`` covers rounding the inputs and the result to the test dtype (16 ulps; 8 for
bfloat16); the second term is the random-walk error of summing ``terms`` products in the
accumulation dtype ``acc`` (float32 for float32 and the half types, whose products are summed in
float32 on every path here; float64 for float64), with ``terms`` the longest reduction behind one
element of the judged tensor: at least T * D (a row's keys times the head dim), and for a tensor
smaller than the inputs (a parameter shared by batch and heads, e.g. AFT's w) the input elements
per element of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

FACTOR_OUTPUT = 2.0
FACTOR_GRAD = 3.0

#: Rounding inputs and results to the test dtype: 16 units in the last place (8 for bfloat16,
#: whose 8-bit mantissa makes 16 ulps a 6 % error).
ROUNDING: dict[torch.dtype, float] = {
    torch.float64: 2.0**-48,
    torch.float32: 2.0**-19,
    torch.float16: 2.0**-6,
    torch.bfloat16: 2.0**-4,
}
#: Units in the last place of the accumulation dtype, times sqrt(terms), for a reordered sum.
SUM_ULPS = 4
#: The accumulation dtype of each test dtype (see the module docstring).
ACCUMULATION: dict[torch.dtype, torch.dtype] = {
    torch.float64: torch.float64,
    torch.float32: torch.float32,
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
}


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def floor(dtype: torch.dtype, terms: int) -> float:
    """The relative error floor (times the tensor's scale) for ``terms`` summed products."""
    acc = ACCUMULATION.get(dtype, dtype)
    return ROUNDING[dtype] + SUM_ULPS * eps(acc) * max(1, terms) ** 0.5


#: The floor of a reduction of one term, per dtype (what the floor can never go below).
FLOOR: dict[torch.dtype, float] = {d: floor(d, 1) for d in ACCUMULATION}


@dataclass(frozen=True)
class Verdict:
    name: str
    error: float  # the path's max-abs error against the oracle
    baseline: float  # the naive same-dtype reference's max-abs error
    allowed: float
    ok: bool
    scale: float = 0.0  # the size of the quantity compared, the floor's unit

    def __str__(self) -> str:
        return (
            f"{self.name}: error {self.error:.3g} vs allowed {self.allowed:.3g} "
            f"(naive baseline {self.baseline:.3g})"
        )


def max_error(x: Tensor, oracle: Tensor) -> float:
    if x.numel() == 0:
        return 0.0
    return (x.double() - oracle).abs().max().item()


def judge_approximate(
    name: str, fast: Tensor, baseline: Tensor, oracle: Tensor, tolerance: float
) -> Verdict:
    """An approximate path: its max-abs error at most ``tolerance`` times the oracle's max-abs
    (its own stated bound; the naive baseline's error is reported beside it, not used)."""
    scale = max(oracle.abs().max().item(), FLOOR[torch.float64]) if oracle.numel() else 1.0
    error = max_error(fast, oracle)
    allowed = tolerance * scale
    return Verdict(name, error, max_error(baseline, oracle), allowed, error <= allowed, scale)


def judge(
    name: str,
    fast: Tensor,
    baseline: Tensor,
    oracle: Tensor,
    factor: float,
    terms: int = 1,
    unit: float = 0.0,
) -> Verdict:
    """``terms``: the longest sum behind one element; ``unit``: the least scale the floor is
    relative to (for a gradient, the upstream gradient's RMS; see the module docstring)."""
    e_fast = max_error(fast, oracle)
    e_base = max_error(baseline, oracle)
    scale = max(oracle.abs().max().item() if oracle.numel() else 0.0, unit)
    allowed = factor * e_base + floor(fast.dtype, terms) * scale
    ok = e_fast <= allowed and bool(torch.isfinite(fast).all())
    return Verdict(name, e_fast, e_base, allowed, ok, scale)


def run_with_grads(
    fn: Callable[..., Tensor], inputs: Mapping[str, Tensor], grad_out: Tensor, kwargs: Mapping
) -> tuple[Tensor, dict[str, Tensor]]:
    """Output and the gradient of <output, grad_out> for every input that requires grad."""
    leaves = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in inputs.items()}
    o = fn(**leaves, **kwargs)
    wants = [k for k, v in leaves.items() if v.requires_grad]
    grads = torch.autograd.grad(
        o, [leaves[k] for k in wants], grad_out.to(o.device, o.dtype), allow_unused=True
    )
    return o.detach(), {
        k: (g if g is not None else torch.zeros_like(leaves[k]))
        for k, g in zip(wants, grads, strict=True)
    }


def compare_paths(
    fast: Callable[..., Tensor],
    reference: Callable[..., Tensor],
    inputs: Mapping[str, Tensor],
    kwargs: Mapping,
    *,
    seed: int = 1,
    backward: bool = True,
    tolerance: float | None = None,
    grad_scale: float = 1.0,
) -> list[Verdict]:
    """Judge ``fast`` against ``reference`` on ``inputs`` (outputs and, if asked, gradients of
    <output, g> with g ~ N(0, grad_scale^2), drawn from ``seed``).
    ``tolerance``: an approximate path's own bound (``PathSpec.tolerance``): its output alone,
    judged by :func:`judge_approximate`."""
    if tolerance is not None:
        with torch.no_grad():
            oracle = reference(**{k: v.double() for k, v in inputs.items()}, **kwargs)
            base = reference(**inputs, **kwargs)
            out = fast(**inputs, **kwargs)
        return [judge_approximate("output", out, base, oracle, tolerance)]
    dtype = inputs["q"].dtype
    row = inputs["q"].shape[-2] * inputs["q"].shape[-1]  # T * D: one row's keys x head dim
    total = sum(t.numel() for t in inputs.values())

    def terms(t: Tensor) -> int:
        return max(row, total // max(1, t.numel()))

    oracle_inputs = {k: v.detach().double().requires_grad_(backward) for k, v in inputs.items()}
    test_inputs = {k: v.detach().requires_grad_(backward) for k, v in inputs.items()}
    if not backward:
        with torch.no_grad():
            o_ref = reference(**oracle_inputs, **kwargs)
            o_base = reference(**test_inputs, **kwargs)
            o_fast = fast(**test_inputs, **kwargs)
        return [judge("output", o_fast, o_base, o_ref, FACTOR_OUTPUT, terms(o_ref))]
    with torch.no_grad():
        probe = reference(**test_inputs, **kwargs)
    gen = torch.Generator().manual_seed(seed)
    grad_out = torch.randn(probe.shape, generator=gen, dtype=torch.float64) * grad_scale
    grad_out = grad_out.to(probe.dtype).double()  # the upstream gradient all three runs read
    upstream = grad_out.square().mean().sqrt().item() if grad_out.numel() else 0.0
    o_ref, g_ref = run_with_grads(reference, oracle_inputs, grad_out, kwargs)
    o_base, g_base = run_with_grads(reference, test_inputs, grad_out.to(dtype), kwargs)
    o_fast, g_fast = run_with_grads(fast, test_inputs, grad_out.to(dtype), kwargs)
    verdicts = [judge("output", o_fast, o_base, o_ref, FACTOR_OUTPUT, terms(o_ref))]
    for name in g_ref:
        g = g_ref[name]
        verdicts.append(
            judge(f"d{name}", g_fast[name], g_base[name], g, FACTOR_GRAD, terms(g), upstream)
        )
    return verdicts
