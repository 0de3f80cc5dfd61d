"""Paired statistics for the extrapolation table: is a variant really ahead of O at a length?

Each training seed gives one difference d_s = accuracy(variant, seed s) - accuracy(O, seed s) at a
length (same windows, same masks, same seed's data order). Over k seeds, :func:`paired` gives the
mean difference, its 95 % confidence interval ``mean +- t_{0.975, k-1} sd / sqrt(k)`` (Student's t),
the two-sided p of the paired t-test of "no difference" and the sign count (how many seeds'
differences are positive, how many negative). With one seed there is no interval.

The sign count is a description, never a test: with k seeds no distribution-free test (sign or
signed rank) can give a two-sided p below ``2 / 2^k`` (:func:`smallest_sign_p`; 0.25 at k = 3), so
below :data:`SIGN_TEST_SEEDS` seeds it could not reach 0.05 whatever the data.

"Equal" is never read off a non-significant difference: :func:`equivalence` is the two one-sided
t-tests (TOST) against a margin, equivalent at level alpha exactly when the (1 - 2 alpha) t-interval
lies inside (-margin, +margin). Schuirmann, "A comparison of the two one-sided tests procedure and
the power approach for assessing the equivalence of average bioavailability", 1987,
https://doi.org/10.1007/BF01068419.

Student's t comes from SciPy (:func:`scipy.stats.ttest_1samp`, :data:`scipy.stats.t`).

Within one seed, :func:`within_seed` bootstraps the difference over the evaluation span's pieces
(:func:`bootstrap_difference`, SciPy's :func:`scipy.stats.bootstrap`, paired).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from scipy import stats as _scipy

from attnbench.core.errors import AttnbenchError

LEVEL = 0.95
ALPHA = 0.05
#: Fewest seeds at which a two-sided sign test can reach p < ALPHA at all (2 / 2^6 = 0.031).
SIGN_TEST_SEEDS = 6


@dataclass(frozen=True)
class Paired:
    """A paired difference over seeds: mean, 95 % interval (NaN with one seed), p, seeds, and how
    many seeds' differences are positive and negative (the rest are exactly zero)."""

    mean: float
    low: float
    high: float
    p: float
    count: int
    positive: int = 0
    negative: int = 0

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

    def signs(self) -> str:
        """``7/8 seeds positive``: the seeds whose difference has the mean's sign (``negative``
        below zero; ``8/8 seeds zero`` when every difference is 0). A description, not a test."""
        if self.count == 0:
            return ""
        seeds = "seeds" if self.count > 1 else "seed"
        if self.positive == self.negative == 0:
            return f"{self.count}/{self.count} {seeds} zero"
        if self.mean < 0:
            return f"{self.negative}/{self.count} {seeds} negative"
        return f"{self.positive}/{self.count} {seeds} positive"


def format_p(p: float) -> str:
    if math.isnan(p):
        return "-"
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.01 else f"{p:.2f}"


def _values(differences: Sequence[float]) -> list[float]:
    return [float(d) for d in differences]


def paired(differences: Sequence[float], level: float = LEVEL) -> Paired:
    """Mean, t-interval, two-sided paired t-test p and sign count of per-seed differences."""
    values = _values(differences)
    k = len(values)
    nan = float("nan")
    if k == 0:
        return Paired(nan, nan, nan, nan, 0)
    positive, negative = sum(v > 0 for v in values), sum(v < 0 for v in values)
    mean = sum(values) / k
    if k < 2:
        return Paired(mean, nan, nan, nan, 1, positive, negative)
    if max(values) == min(values):  # no spread: a certain difference (SciPy would give NaN)
        p = 0.0 if mean != 0.0 else 1.0
        return Paired(mean, mean, mean, p, k, positive, negative)
    test = _scipy.ttest_1samp(values, 0.0)
    ci = test.confidence_interval(level)
    return Paired(mean, float(ci.low), float(ci.high), float(test.pvalue), k, positive, negative)


def smallest_sign_p(seeds: int) -> float:
    """The smallest two-sided p a sign test (or any test of the signs' permutations) can give
    with ``seeds`` nonzero differences: every sign alike, ``2 / 2^seeds`` (at most 1)."""
    if seeds < 1:
        raise AttnbenchError(f"seeds={seeds}: a sign test needs at least one difference")
    return min(1.0, 2.0 / 2.0**seeds)


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided t-tests (TOST) of per-seed differences against ``-margin`` and ``+margin``:
    ``p`` is the larger one-sided p; ``low``..``high`` the (1 - 2 ``alpha``) t-interval, inside
    (-margin, +margin) exactly when ``p < alpha``. NaN with one seed."""

    margin: float
    low: float
    high: float
    p: float
    count: int
    alpha: float = ALPHA

    @property
    def equivalent(self) -> bool:
        return self.count > 1 and self.p < self.alpha

    def text(self, digits: int = 2) -> str:
        """``equivalent within ±1.5 (TOST p = 0.004; 90 % interval [-0.58, +0.17])``, or ``not
        shown equivalent within ±1.5 (...)``: never "equal"."""
        if self.count < 2:
            return "one seed: no equivalence test"
        p = format_p(self.p)
        level = f"{100 * (1 - 2 * self.alpha):g} %"
        detail = (
            f"TOST p {p if p.startswith('<') else '= ' + p}; {level} interval "
            f"[{self.low:+.{digits}f}, {self.high:+.{digits}f}]"
        )
        verdict = "equivalent" if self.equivalent else "not shown equivalent"
        return f"{verdict} within ±{self.margin:g} ({detail})"


def equivalence(differences: Sequence[float], margin: float, alpha: float = ALPHA) -> Equivalence:
    """TOST of "the mean difference lies within ±``margin``": H0 mean <= -margin and H0
    mean >= +margin, each rejected by a one-sided t-test; the larger p is the test's p."""
    if not margin > 0:
        raise AttnbenchError(f"equivalence margin {margin}: accepted: a number > 0")
    values = _values(differences)
    k = len(values)
    nan = float("nan")
    if k < 2:
        return Equivalence(margin, nan, nan, nan, k, alpha)
    mean = sum(values) / k
    if max(values) == min(values):  # no spread: inside the margin or not, for certain
        return Equivalence(margin, mean, mean, 0.0 if abs(mean) < margin else 1.0, k, alpha)
    above = _scipy.ttest_1samp(values, -margin, alternative="greater").pvalue
    below = _scipy.ttest_1samp(values, margin, alternative="less").pvalue
    ci = _scipy.ttest_1samp(values, 0.0).confidence_interval(1 - 2 * alpha)
    return Equivalence(margin, float(ci.low), float(ci.high), float(max(above, below)), k, alpha)


def interval_half_width(sd: float, count: int, level: float = LEVEL) -> float:
    """Half the t-interval of a mean of ``count`` values with sample sd ``sd`` (NaN for < 2)."""
    if count < 2 or math.isnan(sd):
        return float("nan")
    return float(_scipy.t.ppf(0.5 + level / 2.0, count - 1)) * sd / math.sqrt(count)


# --------------------------------------------------------------------------------------------
# Within one seed: a bootstrap over the evaluation span's pieces
# --------------------------------------------------------------------------------------------


#: Bootstrap draws (resamples of the pieces) per (variant, seed, length).
BOOTSTRAP_DRAWS = 2000


def bootstrap_difference(
    masked: Sequence[int],
    correct: Sequence[int],
    base_correct: Sequence[int],
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = 0,
) -> tuple[float, float]:
    """95 % percentile interval of accuracy(variant) - accuracy(base) in points, resampling the
    pieces with replacement (the same pieces for both: the difference is paired), by
    :func:`scipy.stats.bootstrap`. One piece has nothing to resample: its own difference."""
    import numpy as np
    from scipy.stats import bootstrap

    data = tuple(np.asarray(x, dtype=np.float64) for x in (masked, correct, base_correct))

    def difference(m, c, b, axis=-1):  # points of accuracy over the resampled pieces
        return 100.0 * (c.sum(axis) - b.sum(axis)) / np.maximum(m.sum(axis), 1.0)

    if len(data[0]) < 2:  # SciPy needs two observations
        point = float(difference(*data))
        return point, point
    rng = np.random.default_rng(seed)
    found = bootstrap(data, difference, n_resamples=draws, paired=True, vectorized=True,
                      method="percentile", rng=rng)  # fmt: skip
    return float(found.confidence_interval.low), float(found.confidence_interval.high)


def within_seed(rows: Sequence[dict[str, Any]], key: str, base: str = "O") -> pd.DataFrame:
    """Per (variant, length): the bootstrap interval's half-width of variant − base, averaged
    over the seeds both were evaluated with."""
    found = {(r["variant"], r["seed"], r["eval_len"]): r[key] for r in rows if key in r}
    out = []
    for (variant, seed, n), (masked, correct) in found.items():
        ref = found.get((base, seed, n))
        if variant == base or ref is None:
            continue
        low, high = bootstrap_difference(masked, correct, ref[1])
        out.append({"variant": variant, "eval_len": n, "seed": seed, "half": (high - low) / 2})
    frame = pd.DataFrame(out, columns=["variant", "eval_len", "seed", "half"])
    return frame.groupby(["variant", "eval_len"], sort=False)["half"].mean().reset_index()


def markdown_within_seed(frame: pd.DataFrame, lengths: Sequence[int], base: str = "O") -> str:
    head = f"| variant − {base} | " + " | ".join(f"n={n}" for n in lengths) + " |"
    lines = [head, "|---|" + "---:|" * len(lengths)]
    for variant, group in frame.groupby("variant", sort=False):
        by_n = {int(r.eval_len): r.half for r in group.itertuples()}
        cells = [f"±{by_n[n]:.1f}" if n in by_n else "-" for n in lengths]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
