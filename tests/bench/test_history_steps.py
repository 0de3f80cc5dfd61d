"""Step and drift detection along the commits (:mod:`attnbench.bench.history.steps`): PELT
against an exhaustive search, and the synthetic series of issue 61 (a 1.3x step, a drift of
1.05x per commit over 8 commits, A/A series)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from attnbench.bench.history.steps import _p_value, detect, pelt, segment

NOISE = 0.02  # log units: between-run noise of the CI grid's cases (sigma 0.011-0.038 here)


def exhaustive(x: np.ndarray, sigma: float, beta: float, min_size: int = 2) -> list[int]:
    """The change points minimising RSS / sigma^2 + beta per change, by trying every split."""
    n, best, found = len(x), math.inf, []
    for k in range(n):
        for points in itertools.combinations(range(min_size, n - min_size + 1), k):
            bounds = [0, *points, n]
            if any(b - a < min_size for a, b in itertools.pairwise(bounds)):
                continue
            cost = sum(((x[a:b] - x[a:b].mean()) ** 2).sum() for a, b in itertools.pairwise(bounds))
            cost = cost / sigma**2 + beta * k
            if cost < best - 1e-9:
                best, found = cost, list(points)
    return found


def test_pelt_finds_the_exact_optimum():
    """Batched PELT (pruned) against every segmentation, on random series with and without
    steps, lengths 4..11 padded into one batch, various noise levels and penalties."""
    rng = np.random.default_rng(1)
    series = []
    for _ in range(60):
        n = int(rng.integers(4, 12))
        jumps = (rng.random(n) < 0.3) * rng.normal(0, 3, n)
        series.append(rng.normal(0, 1, n) + jumps.cumsum())
    width = max(len(s) for s in series)
    x = np.stack([np.pad(s, (0, width - len(s)), mode="edge") for s in series])
    sigma = 0.5 + rng.random(len(series))
    beta = 0.2 + 4 * rng.random(len(series))
    lengths = np.array([len(s) for s in series])
    found = pelt(x, lengths, sigma, beta)
    for s, got, sig, b in zip(series, found, sigma, beta, strict=True):
        assert got == exhaustive(s, sig, b), (s, sig, b)


def test_series_too_short_for_two_levels_have_no_change():
    assert segment([np.zeros(0), np.zeros(1), np.array([0.0, 1.0, 1.0])]) == [[], [], []]
    assert detect([[1.0], [1.0, 2.0, 2.0]])[1].changes == ()


@pytest.mark.parametrize("seed", range(5))
def test_one_step_is_found_at_its_commit(seed):
    """40 commits, 1.3x slower from commit 20 on: one step, between commits 19 and 20."""
    rng = np.random.default_rng(seed)
    values = np.exp(rng.normal(0, NOISE, 40))
    values[20:] *= 1.3
    (fit,) = detect([values])
    (step,) = fit.changes
    assert (step.kind, step.before, step.after) == ("step", 19, 20)
    assert step.size == pytest.approx(1.3, rel=0.03)
    assert step.confidence == "high" and step.p_value < 1e-4


@pytest.mark.parametrize("seed", range(5))
def test_a_slow_drift_is_reported_as_drift(seed):
    """1.05x per commit over 8 commits (1.48x in all; no commit alone moves 1.1x): one drift
    spanning the ramp, not steps."""
    rng = np.random.default_rng(seed)
    values = np.exp(rng.normal(0, NOISE, 40))
    values[16:24] *= 1.05 ** np.arange(1, 9)
    values[24:] *= 1.05**8
    (fit,) = detect([values])
    (drift,) = fit.changes
    assert drift.kind == "drift"
    assert 14 <= drift.before < drift.after <= 25 and drift.commits >= 4
    assert drift.size == pytest.approx(1.05**8, rel=0.06)
    assert drift.per_commit == pytest.approx(1.05, abs=0.04)


def test_ten_aa_series_give_no_step():
    """The same level at every commit: no step, no drift, in 10 series of 60 commits."""
    rng = np.random.default_rng(7)
    fits = detect([np.exp(rng.normal(0, NOISE, 60)) for _ in range(10)])
    assert [f.changes for f in fits] == [()] * 10


def test_one_slow_run_is_not_a_step():
    """A run 1.5x slower at one commit (a busy neighbour), in 50 series: no change reported."""
    rng = np.random.default_rng(3)
    series = []
    for i in range(50):
        values = np.exp(rng.normal(0, NOISE, 40))
        values[2 + i % 36] *= 1.5
        series.append(values)
    assert sum(len(f.changes) for f in detect(series)) == 0


def test_a_change_must_persist_and_exceed_the_threshold():
    rng = np.random.default_rng(4)
    base = np.exp(rng.normal(0, NOISE, 40))
    last_only = base.copy()
    last_only[39:] *= 1.3  # one commit at the new level: not yet a step
    small = base.copy()
    small[20:] *= 1.07  # below the 1.1x threshold
    back = base.copy()
    back[20:23] *= 1.3  # three slow commits, then fixed: a step up and a step down
    fits = detect([last_only, small, back])
    assert fits[0].changes == () and fits[1].changes == ()
    up, down = fits[2].changes
    assert (up.kind, up.after, up.size > 1.2) == ("step", 20, True)
    assert (down.kind, down.after, down.size < 1 / 1.2) == ("step", 23, True)
    assert detect([small], threshold=1.05)[0].changes[0].after == 20


def test_two_steps_a_plateau_apart_are_two_steps():
    rng = np.random.default_rng(5)
    values = np.exp(rng.normal(0, NOISE, 60))
    values[20:] *= 1.2
    values[30:] *= 1.2
    (fit,) = detect([values])
    assert [(c.kind, c.after) for c in fit.changes] == [("step", 20), ("step", 30)]


def test_the_confidence_is_the_exact_u_test():
    rng = np.random.default_rng(6)
    for m, n in ((2, 2), (2, 10), (5, 7), (10, 10)):
        old, new = rng.normal(0, 1, n), rng.normal(0.8, 1, m)
        for up, side in ((True, "greater"), (False, "less")):
            want = mannwhitneyu(new, old, alternative=side, method="exact").pvalue
            assert _p_value(old, new, up) == pytest.approx(want, rel=1e-9)
