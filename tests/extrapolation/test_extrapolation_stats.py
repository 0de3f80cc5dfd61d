"""The extrapolation table's statistics and its count baseline (issue 18)."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.analysis import stats
from attnbench.extrapolation.evaluation.floors import ContextCounts


@pytest.mark.parametrize(
    ("p", "df", "t"),
    [(0.975, 1, 12.706205), (0.975, 2, 4.302653), (0.975, 7, 2.364624), (0.95, 10, 1.812461),
     (0.975, 1000, 1.962339), (0.5, 3, 0.0)],
)  # fmt: skip
def test_t_quantiles_match_the_tables(p, df, t):
    """The t-interval's half-width of df + 1 values with sd 1 is t_{p, df} / sqrt(df + 1), at the
    level 2p - 1: Student's t from SciPy against the printed tables."""
    half = stats.interval_half_width(1.0, df + 1, level=2 * p - 1)
    assert half * math.sqrt(df + 1) == pytest.approx(t, abs=1e-5)
    assert math.isnan(stats.interval_half_width(1.0, 1))  # one value: no interval


def test_paired_interval_and_p():
    """The committed 3-seed E - O at n = 1024 (+14.5, +3.3, +0.7): p ~ 0.28, interval about -12
    to +24, not significant; a tight difference is."""
    wide = stats.paired([14.5, 3.3, 0.7])
    assert wide.mean == pytest.approx(6.1667, abs=1e-3)
    assert wide.p == pytest.approx(0.283, abs=0.005)
    assert wide.low == pytest.approx(-12.05, abs=0.05) and wide.high == pytest.approx(24.4, 0.05)
    assert not wide.significant and "p 0.28" in wide.text()
    tight = stats.paired([4.5, 5.2, 4.7, 5.0])
    assert tight.significant and tight.low > 0
    one = stats.paired([3.0])
    assert one.count == 1 and math.isnan(one.low) and "1 seed" in one.text()
    assert stats.paired([2.0, 2.0]).p == 0.0  # no spread at all: a certain difference


def test_the_count_baseline_predicts_from_visible_context_and_backs_off():
    text = b"abcXdef abcXdef abcYdef abcXdef zzzQzzz"
    train = torch.tensor(list(text), dtype=torch.uint8)
    counts = ContextCounts(train, width=3)
    window = torch.tensor([list(b"abc?defzz")], dtype=torch.uint8)
    mask = torch.zeros(1, 9, dtype=torch.bool)
    mask[0, 3] = True
    assert counts.predict(window, mask)[0, 3].item() == ord("X")  # 3 of 4 "abc_def" are X
    mask[0, 5] = True  # a masked neighbour: the +-3 and +-2 contexts are not visible
    guess = counts.predict(window, mask)
    assert guess[0, 3].item() == ord("X")  # "c_d" at +-1 still says X
    edge = counts.predict(window[:, :4], mask[:, :4])  # the right context is cut off
    most_frequent = max(set(text), key=lambda b: (text.count(b), -b))
    assert edge[0, 3].item() == most_frequent  # backs off to +-0: the commonest byte
    correct, masked = counts.accuracy(window, mask)
    assert masked == 2 and 0 <= correct <= 2


def test_su_2021_expression_matches_a_monte_carlo_of_its_own_definition():
    """theory_offset integrates log E[e^{x t}] - x E[t e^{x t}] / E[e^{x t}] over the cosine's
    density; the same quantity estimated from random unit vectors agrees, and its slope is
    0.24-ish only at large lambda*d."""
    from attnbench.extrapolation.analysis.entropy import theory_offset, theory_slope

    d, x = 64, 8.0
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(400_000, d, generator=gen, dtype=torch.float64)
    t = k[:, 0] / k.norm(dim=-1)  # cosine with a fixed unit q
    w = torch.exp(x * t)
    mc = (torch.log(w.mean()) - x * (t * w).mean() / w.mean()).item()
    assert theory_offset(x, d) == pytest.approx(mc, abs=0.01)
    assert 0.05 < theory_slope(3.6, 10.7, d) < 0.15
    assert 0.2 < theory_slope(16.0, 64.0, d) < 0.32


def test_bootstrap_over_pieces():
    from attnbench.extrapolation.analysis.stats import bootstrap_difference

    masked = [150] * 64
    same = bootstrap_difference(masked, [90] * 64, [90] * 64)
    assert same == (0.0, 0.0)
    gen = torch.Generator().manual_seed(1)
    base = (torch.rand(64, generator=gen) * 40 + 60).round().int().tolist()
    better = [b + 15 for b in base]  # +10 points in every piece
    low, high = bootstrap_difference(masked, better, base)
    assert low == pytest.approx(10.0) and high == pytest.approx(10.0)  # paired: no spread
    noisy = [min(150, max(0, b + (15 if i % 2 else -5))) for i, b in enumerate(base)]
    low, high = bootstrap_difference(masked, noisy, base)
    assert low < 10 / 3 < high and high - low > 1  # mean +3.3 points, pieces disagree


def test_bootstrap_is_the_plain_paired_resampling_of_pieces():
    """SciPy's paired percentile bootstrap draws the same resamples as a plain loop over
    ``default_rng(seed).integers(0, pieces, (draws, pieces))`` (the hand-written version it
    replaced): the same interval to rounding. One piece: its own difference, no interval."""
    import numpy as np

    from attnbench.extrapolation.analysis.stats import bootstrap_difference

    rng = np.random.default_rng(3)
    masked = rng.integers(100, 200, 40)
    correct, base = rng.integers(20, 90, 40), rng.integers(20, 90, 40)
    pick = np.random.default_rng(7).integers(0, 40, size=(500, 40))
    diff = 100.0 * (correct[pick].sum(1) - base[pick].sum(1)) / masked[pick].sum(1)
    expected = np.percentile(diff, [2.5, 97.5])
    got = bootstrap_difference(masked, correct, base, draws=500, seed=7)
    assert got == pytest.approx(tuple(expected), abs=1e-9)
    assert bootstrap_difference([150], [90], [60]) == (20.0, 20.0)


def _t2_cdf(t: float) -> float:
    """Student's t CDF with 2 degrees of freedom, in closed form: 1/2 + t / (2 sqrt(2 + t^2))."""
    return 0.5 + t / (2.0 * math.sqrt(2.0 + t * t))


def _t2_quantile(p: float) -> float:
    """Its inverse, in closed form: (2p - 1) / sqrt(2 p (1 - p))."""
    return (2.0 * p - 1.0) / math.sqrt(2.0 * p * (1.0 - p))


def test_tost_against_a_hand_computed_case():
    """Three differences 0.1, -0.3, 0.5 (mean 0.1, sd 0.4) against ±1.5: the two one-sided
    t-tests and the 90 % interval from the df = 2 closed forms, in float64."""
    values = [0.1, -0.3, 0.5]
    se = 0.4 / math.sqrt(3.0)
    p_above = 1.0 - _t2_cdf((0.1 + 1.5) / se)  # H0: mean <= -1.5
    p_below = _t2_cdf((0.1 - 1.5) / se)  # H0: mean >= +1.5
    half = _t2_quantile(0.95) * se
    got = stats.equivalence(values, 1.5)
    assert got.p == pytest.approx(max(p_above, p_below), rel=1e-9)
    assert (got.low, got.high) == pytest.approx((0.1 - half, 0.1 + half), rel=1e-9)
    assert got.equivalent and got.text().startswith("equivalent within ±1.5 (TOST p = ")
    assert "90 % interval" in got.text()


def test_tost_is_the_90_percent_interval_inside_the_margin():
    """Equivalent at 0.05 exactly when the 90 % t-interval lies inside (-margin, +margin); a
    wide, non-significant difference is "not shown equivalent", never "equal"."""
    gen = torch.Generator().manual_seed(5)
    for _ in range(50):
        values = (torch.randn(4, generator=gen, dtype=torch.float64) * 0.8 + 0.3).tolist()
        got = stats.equivalence(values, 1.0)
        inside = got.low > -1.0 and got.high < 1.0
        assert got.equivalent == inside
    wide = stats.equivalence([1.0, -1.2, 2.5], 1.5)
    assert not stats.paired([1.0, -1.2, 2.5]).significant  # no significant difference...
    assert not wide.equivalent and wide.text().startswith("not shown equivalent within ±1.5")
    assert "equal" not in wide.text()  # ... and still not "equal"
    assert "no equivalence test" in stats.equivalence([0.2], 1.5).text()
    assert stats.equivalence([0.2, 0.2, 0.2], 1.5).p == 0.0  # no spread, inside
    assert stats.equivalence([2.0, 2.0], 1.5).p == 1.0  # no spread, outside
    with pytest.raises(AttnbenchError):
        stats.equivalence([0.1, 0.2], 0.0)


def test_sign_counts_follow_the_mean():
    up = stats.paired([1.0, -2.0, 3.0])
    assert (up.positive, up.negative) == (2, 1) and up.signs() == "2/3 seeds positive"
    down = stats.paired([-1.0, -2.0, 0.5])
    assert down.signs() == "2/3 seeds negative"
    ties = stats.paired([0.0, 2.0, 0.0])  # zeros count for neither sign
    assert (ties.positive, ties.negative) == (1, 0) and ties.signs() == "1/3 seeds positive"
    assert stats.paired([0.0, 0.0, 0.0]).signs() == "3/3 seeds zero"


@pytest.mark.parametrize("seeds", [1, 3, 5, 6, 8])
def test_smallest_sign_p_is_that_of_all_signs_alike(seeds):
    """Over all 2^m equally likely sign patterns, the two-sided sign test p of "all positive" is
    the share of patterns at least as far from m/2: the two all-alike ones."""
    from itertools import product

    far = sum(abs(sum(s) - seeds / 2) >= seeds / 2 for s in product((0, 1), repeat=seeds))
    assert stats.smallest_sign_p(seeds) == pytest.approx(far / 2**seeds)
    assert (stats.smallest_sign_p(seeds) < 0.05) == (seeds >= stats.SIGN_TEST_SEEDS)
