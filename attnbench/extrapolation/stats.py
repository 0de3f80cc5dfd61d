"""Paired statistics for the extrapolation table: is a variant really ahead of O at a length?

Each training seed gives one difference d_s = accuracy(variant, seed s) - accuracy(O, seed s) at a
length (same windows, same masks, same seed's data order). Over k seeds, :func:`paired` gives the
mean difference, its 95 % confidence interval ``mean +- t_{0.975, k-1} sd / sqrt(k)`` (Student's t)
and the two-sided p of the paired t-test of "no difference". With one seed there is no interval.

Student's t distribution is computed here (no SciPy): its CDF through the regularized incomplete
beta function, evaluated by its continued fraction (modified Lentz), and quantiles by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95
ALPHA = 0.05


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                    -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):  # fmt: skip
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection to 1e-12)."""
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


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
    se = sd / math.sqrt(k)
    if se == 0.0:
        p = 0.0 if mean != 0.0 else 1.0
        return Paired(mean, mean, mean, p, k)
    half = t_quantile(0.5 + level / 2.0, k - 1) * se
    p = 2.0 * (1.0 - t_cdf(abs(mean) / se, k - 1))
    return Paired(mean, mean - half, mean + half, p, k)


def interval_half_width(sd: float, count: int, level: float = LEVEL) -> float:
    """Half the t-interval of a mean of ``count`` values with sample sd ``sd`` (NaN for < 2)."""
    if count < 2 or math.isnan(sd):
        return float("nan")
    return t_quantile(0.5 + level / 2.0, count - 1) * sd / math.sqrt(count)
