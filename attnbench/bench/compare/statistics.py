"""The statistics of a comparison: the Mann-Whitney U test (SciPy's) of two cases' rounds, and the
noise of the comparison from the changes of all its cases (see :mod:`attnbench.bench.compare`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import mannwhitneyu

from attnbench.bench.compare.records import Limits, Noise, Thresholds
from attnbench.bench.thresholds import (
    CORROBORATED_Z,
    EXACT_MAX,
    MIN_CASES_FOR_NOISE,
    MIN_GROUP_FOR_CENTRE,
    USELESS_NOISE,
)


@dataclass(frozen=True)
class UTest:
    """U of ``current`` over ``baseline`` (pairs in which the current value is larger, ties
    counting 1/2) and its one-sided p-values."""

    u: float
    p_greater: float  # H1: current values tend to be larger (slower)
    p_less: float  # H1: current values tend to be smaller (faster)
    exact: bool


def mann_whitney_u(current: Sequence[float], baseline: Sequence[float]) -> UTest:
    """The Mann-Whitney U test of two independent samples (:func:`scipy.stats.mannwhitneyu`,
    one-sided both ways): the exact distribution without ties when both have at most
    :data:`EXACT_MAX` values, else the normal approximation with the tie correction of the
    variance and a continuity correction. Every value equal: nothing to rank, p = 1 both ways."""
    x, y = np.asarray(current, dtype=float), np.asarray(baseline, dtype=float)
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        raise ValueError("the U test needs at least one value on each side")
    both = np.concatenate([x, y])
    if (both == both[0]).all():  # zero variance: SciPy's z would be 0 / 0
        return UTest(m * n / 2, 1.0, 1.0, False)
    exact = len(np.unique(both)) == m + n and max(m, n) <= EXACT_MAX
    method = "exact" if exact else "asymptotic"
    greater, less = (
        mannwhitneyu(x, y, use_continuity=True, alternative=side, method=method)
        for side in ("greater", "less")
    )
    return UTest(float(greater.statistic), float(greater.pvalue), float(less.pvalue), exact)


def smallest_p(m: int, n: int) -> float:
    """The smallest one-sided p the U test can give with m and n values: 1 / C(m + n, m)."""
    return 1 / math.comb(m + n, m)


def noise_of(changes: Sequence[tuple[str, float]]) -> Noise:
    """The noise of a comparison from its cases' (group, change): each group's median change
    (groups of MIN_GROUP_FOR_CENTRE cases or more), the median of all, and 1.4826 x the median
    absolute deviation of the log changes around their group's (``Noise()``: too few cases)."""
    valid = [(g, math.log(c)) for g, c in changes if c > 0 and math.isfinite(c)]
    if len(valid) < MIN_CASES_FOR_NOISE:
        return Noise()
    mid = float(np.median([v for _, v in valid]))
    members: dict[str, list[float]] = {}
    for g, v in valid:
        members.setdefault(g, []).append(v)
    centres = {g: float(np.median(v)) for g, v in members.items() if len(v) >= MIN_GROUP_FOR_CENTRE}
    spread = [abs(v - centres.get(g, mid)) for g, v in valid]
    sigma = 1.4826 * float(np.median(spread))
    groups = {g: math.exp(c) for g, c in centres.items()}
    return Noise(math.exp(mid), sigma, len(valid), groups)


def limits_for(
    th: Thresholds,
    ratio_changes: Sequence[float],
    matmul_changes: Sequence[float],
    made_for_comparing: bool = True,
) -> Limits:
    """The floors of one comparison (squared for runs not made for comparing) and its noise,
    from the changes of its cases (ratios to the reference, ratios to the matmul)."""
    power = 1 if made_for_comparing else 2
    return Limits(
        tested=th.min_effect**power,
        rule=th.time_ratio**power,
        reference=th.ref_time_ratio**power,
        noise=noise_of(ratio_changes),
        noise_reference=noise_of(matmul_changes),
    )


def too_noisy(noise: Noise) -> bool:
    """Whether two runs disagree so widely that even two cases of a path cannot show a
    regression: CORROBORATED_Z sigma is beyond USELESS_NOISE (2x)."""
    return math.exp(CORROBORATED_Z * noise.sigma) > USELESS_NOISE
