"""Paired statistics for the extrapolation table: is a variant really ahead of O at a length?

Each training seed gives one difference d_s = accuracy(variant, seed s) - accuracy(O, seed s) at a
length (same windows, same masks, same seed's data order). Over k seeds, :func:`paired` gives the
mean difference, its 95 % confidence interval ``mean +- t_{0.975, k-1} sd / sqrt(k)`` (Student's t)
and the two-sided p of the paired t-test of "no difference". With one seed there is no interval.

Student's t comes from SciPy (:func:`scipy.stats.ttest_1samp`, :data:`scipy.stats.t`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as _scipy

LEVEL = 0.95
ALPHA = 0.05


@dataclass(frozen=True)
class Paired:
    """A paired difference over seeds: mean, 95 % interval (NaN with one seed), p, seeds."""

    mean: float
    low: float
    high: float
    p: float
    count: int

    @property
    def significant(self) -> bool:
        return self.count > 1 and self.p < ALPHA

    def text(self, digits: int = 1) -> str:
        """``+6.1 [-12.0, +24.2] p 0.28`` (``+6.1 (1 seed)`` without an interval)."""
        if self.count < 2:
            return f"{self.mean:+.{digits}f} (1 seed)"
        return (
            f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}] "
            f"p {format_p(self.p)}"
        )


def format_p(p: float) -> str:
    if math.isnan(p):
        return "-"
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.01 else f"{p:.2f}"


def paired(differences: Sequence[float], level: float = LEVEL) -> Paired:
    """Mean, t-interval and two-sided paired t-test p of per-seed differences."""
    values = [float(d) for d in differences]
    k = len(values)
    if k == 0:
        nan = float("nan")
        return Paired(nan, nan, nan, nan, 0)
    mean = sum(values) / k
    if k < 2:
        nan = float("nan")
        return Paired(mean, nan, nan, nan, 1)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
    if sd == 0.0:  # no spread at all: a certain difference (SciPy would give NaN)
        p = 0.0 if mean != 0.0 else 1.0
        return Paired(mean, mean, mean, p, k)
    test = _scipy.ttest_1samp(values, 0.0)
    ci = test.confidence_interval(level)
    return Paired(mean, float(ci.low), float(ci.high), float(test.pvalue), k)


def interval_half_width(sd: float, count: int, level: float = LEVEL) -> float:
    """Half the t-interval of a mean of ``count`` values with sample sd ``sd`` (NaN for < 2)."""
    if count < 2 or math.isnan(sd):
        return float("nan")
    return float(_scipy.t.ppf(0.5 + level / 2.0, count - 1)) * sd / math.sqrt(count)
