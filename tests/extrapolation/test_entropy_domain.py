"""Where Su 2021's n -> infinity entropy expression holds at finite n, and the scale-sweep fit
made only there (attnbench issue 32, item 5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnbench.extrapolation.analysis.entropy import (
    FINITE_N_TOLERANCE,
    SCALE_SWEEP,
    approximation_bound,
    finite_n_cosines,
    finite_n_departure,
    fit_scale_sweep,
    mean_row_offset,
    theory_fit_c,
    theory_offset,
)

D = 64


def softmax_offset_of_random_keys(n: int, lambda_d: float, rows: int, seed: int) -> float:
    """Independent float64 reference: mean over rows of (entropy of softmax(lambda q.k)) - log n,
    q fixed of norm sqrt(d), n fresh keys per row uniform on the sphere of radius sqrt(d)
    (normalised Gaussians), the entropy as -sum p log p; drawn in chunks of rows."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.zeros(D, dtype=torch.float64)
    q[0] = math.sqrt(D)
    total, chunk = 0.0, max(1, 2**21 // (n * D))
    for start in range(0, rows, chunk):
        k = torch.randn(min(chunk, rows - start), n, D, generator=gen, dtype=torch.float64)
        k = k / k.norm(dim=-1, keepdim=True) * math.sqrt(D)
        p = torch.softmax(lambda_d / D * (k @ q), dim=-1)
        total += (-(p * torch.log(p)).sum(-1)).sum().item()
    return total / rows - math.log(n)


def sweep_rows(n: int, offsets: dict[float, float]) -> list[dict[str, object]]:
    """Synthetic scale-sweep rows at length n with H - log n given per lambda*d."""
    return [
        {"source": "random-scale", "n": n, "log_n": math.log(n), "lambda_d": x,
         "entropy": math.log(n) + y}
        for x, y in offsets.items()
    ]  # fmt: skip


def test_finite_n_entropy_matches_an_independent_softmax_of_random_keys():
    """The Monte Carlo behind the bound (Beta-distributed cosines, entropy via log-sum-exp) equals
    a plain softmax of random keys; at n = 16, lambda*d = 12 both sit ~0.29 nats above the
    n -> infinity expression, far beyond the tolerance."""
    reference = softmax_offset_of_random_keys(16, 12.0, rows=8000, seed=1)
    ours = mean_row_offset(finite_n_cosines(16, D), 12.0)
    assert ours == pytest.approx(reference, abs=0.015)  # ~4 standard errors
    assert reference - theory_offset(12.0, D) > 0.2


def test_expression_holds_at_16_and_fails_at_24_for_n_4096():
    """At n = 4096 (d = 64) an independent simulation departs from the expression by less than
    the tolerance at lambda*d = 16 and by several times it at 24: the domain ends in between."""
    inside = softmax_offset_of_random_keys(4096, 16.0, rows=160, seed=2) - theory_offset(16.0, D)
    outside = softmax_offset_of_random_keys(4096, 24.0, rows=160, seed=3) - theory_offset(24.0, D)
    assert abs(inside) < FINITE_N_TOLERANCE  # standard error ~0.015
    assert outside > 2 * FINITE_N_TOLERANCE  # ~0.24, standard error ~0.05


def test_approximation_bound_grows_with_n_and_ends_where_the_departure_reaches_the_tolerance():
    bounds = {n: approximation_bound(n, D, high=64.0) for n in (256, 1024, 4096)}
    assert bounds[256] < bounds[1024] < bounds[4096]
    assert 16.0 < bounds[4096] < 24.0
    cosines = finite_n_cosines(4096, D)
    assert abs(finite_n_departure(cosines, bounds[4096], D)) <= FINITE_N_TOLERANCE
    assert abs(finite_n_departure(cosines, bounds[4096] + 0.1, D)) > FINITE_N_TOLERANCE
    assert approximation_bound(4096, D, high=12.0) == 12.0  # all of a short range is inside


def test_sweep_fit_leaves_out_lambda_d_beyond_the_bound_at_n_4096():
    """Rows that follow Su 2021's linear law H = log n - 0.24 lambda d + 0.3 exactly: the fit
    recovers c = 0.24 and b from the points within the bound only, and lists the others."""
    bound = approximation_bound(4096, D, high=max(SCALE_SWEEP))
    rows = sweep_rows(4096, {x: -0.24 * x + 0.3 for x in SCALE_SWEEP})
    rows[-1]["entropy"] += 5.0  # a point beyond the bound cannot move the fit
    regime = fit_scale_sweep(rows, D, bound)
    assert regime["c"] == pytest.approx(0.24, abs=1e-12)
    assert regime["b"] == pytest.approx(0.3, abs=1e-12)
    assert max(regime["lambda_d_range"]) <= bound < 24.0
    assert regime["outside_fit"] == [x for x in SCALE_SWEEP if x > bound]
    assert 24.0 in regime["outside_fit"] and 64.0 in regime["outside_fit"]
    assert regime["points"] + len(regime["outside_fit"]) == len(SCALE_SWEEP)


def test_sweep_fit_on_rows_from_the_expression_recovers_its_c():
    """Rows equal to Su 2021's expression: the fitted c is the expression's own least-squares c
    at the same points, which an independent np.polyfit of the same values gives too."""
    bound = approximation_bound(4096, D, high=max(SCALE_SWEEP))
    rows = sweep_rows(4096, {x: theory_offset(x, D) for x in SCALE_SWEEP})
    regime = fit_scale_sweep(rows, D, bound)
    used = [x for x in SCALE_SWEEP if x <= bound]
    slope, _ = np.polyfit(used, [theory_offset(x, D) for x in used], 1)
    assert regime["c"] == pytest.approx(-slope, abs=1e-9)
    assert regime["theory_c"] == pytest.approx(-slope, abs=1e-9)
    assert regime["rms_residual"] < 0.1  # the expression is nearly straight below the bound
    assert regime["theory_c_sweep"] > regime["theory_c"] + 0.05  # steeper over the whole sweep
    assert theory_fit_c(np.array(used), D) == pytest.approx(-slope, abs=1e-9)


def test_caveat_names_the_bound_and_the_failure():
    bound = approximation_bound(4096, D, high=max(SCALE_SWEEP))
    rows = sweep_rows(4096, {x: theory_offset(x, D) for x in SCALE_SWEEP})
    caveat = fit_scale_sweep(rows, D, bound)["caveat"]
    assert caveat.startswith(f"beyond lambda*d ~ {bound:.1f} at n = 4096 the expression's")
    assert "n -> infinity approximation fails" in caveat and "outside the fit" in caveat
    short = fit_scale_sweep(rows[:4], D, 64.0)  # a sweep wholly inside: no failure claimed
    assert "holds up to lambda*d = 14" in short["caveat"]
