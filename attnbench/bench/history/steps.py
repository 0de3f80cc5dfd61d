"""Steps and drift in a case's results along the commits.

A series is one value per commit (the median of that commit's runs), in the order the commits
were measured. It is modelled as **piecewise constant in the log**: within a segment the log
value is a constant plus noise. The segments are the exact minimiser of

    sum over segments of RSS(segment) / sigma^2  +  beta x (number of changes),

every segment at least :data:`MIN_PERSIST` = 2 commits long (a change counts only if it persists
over at least 2 commits), found by **PELT**: R. Killick, P. Fearnhead and I. A. Eckley, "Optimal
detection of changepoints with a linear computational cost", Journal of the American Statistical
Association 107(500):1590-1598, 2012, https://doi.org/10.1080/01621459.2012.737745: optimal
partitioning (B. Jackson et al., "An algorithm for optimal partitioning of data on an interval",
IEEE Signal Processing Letters 12(2):105-108, 2005, https://arxiv.org/abs/math/0309285) with
their pruning rule, a start whose cost is already above the best one's is never optimal again
(with the minimum length: from ``MIN_PERSIST`` commits later on). The series of one batch are
fitted together, one numpy operation per commit for all of them. ``sigma`` is the noise of one
commit's value, estimated robustly from the first differences (1.4826 x their median absolute
deviation / sqrt 2, so that steps and a slow drift hardly move it), at least
:data:`SIGMA_FLOOR`; ``beta`` = 3 ln n, the modified BIC of N. R. Zhang and D. O. Siegmund, "A
modified Bayes information criterion with applications to the analysis of comparative genomic
hybridization data", Biometrics 63(1):22-32, 2007,
https://doi.org/10.1111/j.1541-0420.2006.00662.x (less its segment-length term), the default
penalty of Killick's R package ``changepoint``.

The segmentation is then read as changes (:func:`changes_of`):

* the boundaries are grouped into **runs**: consecutive boundaries moving the same way with no
  plateau between them, a level between two boundaries counting as a plateau when three constant
  levels fit it and its neighbours better than the best ramp does, by more than the penalty of
  one more level (:func:`_plateau`): a slow drift is cut into short levels by the segmentation,
  and only this tells those from two separate steps;
* a run whose total change is within the threshold (default 1.1x), or less than :data:`Z_MIN`
  standard errors of the difference of its two levels, is noise;
* a run of one boundary, or one in which a single boundary carries :data:`DOMINANT` of the
  total, is a **step** at that boundary, if the two commits before it sit on the old side of the
  midpoint between the two levels and the two after it on the new side (one slow run beside
  normal ones moves the level of a 2-commit segment, but not both of its commits);
* a run of several boundaries, none dominant, is **drift**: the level moved by the run's total
  over its commits, a few percent per commit, which no pair of runs would flag. Two real steps
  within about 4 commits of each other read as one drift.

Each change has a **confidence**: the one-sided p of a Mann-Whitney U test between the commits
of the level before and those of the level after (at most :data:`CONFIDENCE_WINDOW` each side,
exact). The change was placed where the data differ most, so read p as a ranking, not as an
exact probability; with 2 commits after a change it cannot go below 1/66.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: A new level must hold for at least this many commits (the minimum segment length).
MIN_PERSIST = 2
#: Default threshold: a change smaller than this factor either way is not reported.
THRESHOLD = 1.1
#: In a run of boundaries, one that carries this share of the total change (in log) makes the
#: run a step at that boundary.
DOMINANT = 0.8
#: A change must be this many standard errors of the difference between the two levels: two
#: commits at a level can pass a 1.1x threshold by chance in a series with 4 % noise.
Z_MIN = 4.0
#: The noise estimate's floor (in log units: 0.2 %), so that a series of identical values does
#: not make every tiny change a change point.
SIGMA_FLOOR = 0.002
#: How far outside a run's boundaries the knots of the ramp that :func:`_plateau` tries go.
RAMP_KNOTS = 3
#: Commits each side of a change that its U test compares.
CONFIDENCE_WINDOW = 10
#: Series per batch: the fit holds a few arrays of batch x length.
BATCH = 512


@dataclass(frozen=True)
class Change:
    """One step or drift in a series: between commit ``before`` (the last at the old level) and
    commit ``after`` (the first at the new one), indices into the series."""

    kind: str  # "step" | "drift"
    before: int
    after: int
    size: float  # new level / old level
    p_value: float  # one-sided U test, the commits of the old level against the new
    level_before: float
    level_after: float

    @property
    def commits(self) -> int:
        """Commits over which the level moved (1 for a step)."""
        return self.after - self.before

    @property
    def per_commit(self) -> float:
        return self.size ** (1 / self.commits)

    @property
    def confidence(self) -> str:
        return "high" if self.p_value < 0.001 else ("medium" if self.p_value < 0.05 else "low")


@dataclass(frozen=True)
class Fit:
    """A series' segments ([start, end) commit indices), their levels (median, not logged), the
    noise sigma (log units) and the changes read from them."""

    segments: tuple[tuple[int, int], ...]
    levels: tuple[float, ...]
    sigma: float
    changes: tuple[Change, ...]


def noise_sigma(logs: np.ndarray) -> float:
    """The noise of one value, from the first differences (robust to steps and drift)."""
    return float(noise_sigmas([np.asarray(logs, dtype=float)])[0])


def noise_sigmas(series: Sequence[np.ndarray]) -> np.ndarray:
    """:func:`noise_sigma` of each series, the series of one length at a time."""
    out = np.full(len(series), SIGMA_FLOOR)
    by_length: dict[int, list[int]] = {}
    for i, values in enumerate(series):
        if len(values) >= 3:
            by_length.setdefault(len(values), []).append(i)
    for members in by_length.values():
        diffs = np.diff(np.stack([series[i] for i in members]), axis=1)
        centre = np.median(diffs, axis=1, keepdims=True)
        mad = np.median(np.abs(diffs - centre), axis=1)
        out[members] = np.maximum(1.4826 * mad / math.sqrt(2), SIGMA_FLOOR)
    return out


def penalty(n: int) -> float:
    """beta = 3 ln n, at least 3 ln 2 (see the module docstring)."""
    return 3 * math.log(max(n, 2))


def pelt(
    x: np.ndarray,
    lengths: np.ndarray,
    sigma: np.ndarray,
    beta: np.ndarray,
    min_size: int = MIN_PERSIST,
) -> list[list[int]]:
    """The change points (starts of every segment but the first) of each row of ``x`` (a batch,
    row b valid up to ``lengths[b]``, padded beyond), minimising RSS / sigma^2 + beta per change
    with segments of at least ``min_size`` (PELT, see the module docstring)."""
    rows, width = x.shape
    y = x / sigma[:, None]
    s1 = np.zeros((rows, width + 1))
    s2 = np.zeros((rows, width + 1))
    s1[:, 1:] = np.cumsum(y, axis=1)
    s2[:, 1:] = np.cumsum(y * y, axis=1)
    best = np.full((rows, width + 1), np.inf)
    best[:, 0] = -beta
    last = np.zeros((rows, width + 1), dtype=np.int64)
    never = np.iinfo(np.int64).max
    dead = np.full((rows, width + 1), never, dtype=np.int64)  # pruned from this t on
    index = np.arange(rows)
    lo = 0
    for t in range(min_size, width + 1):
        hi = t - min_size + 1  # candidate starts s in [lo, hi): the last segment is [s, t)
        span = np.arange(t - lo, t - hi, -1)
        part = s1[:, t, None] - s1[:, lo:hi]
        total = best[:, lo:hi] + (s2[:, t, None] - s2[:, lo:hi]) - part * part / span
        live = np.where(dead[:, lo:hi] > t, total, np.inf)
        j = np.argmin(live, axis=1)
        best[:, t] = live[index, j] + beta
        last[:, t] = lo + j
        pruned = total >= best[:, t, None]
        dead[:, lo:hi] = np.where(pruned, np.minimum(dead[:, lo:hi], t + min_size), dead[:, lo:hi])
        alive = (dead[:, lo:hi] > t + 1).any(axis=0)
        lo += int(np.argmax(alive)) if alive.any() else hi - lo
    out = []
    for b in range(rows):
        points, t = [], int(lengths[b])
        while t > 0:
            t = int(last[b, t])
            if t > 0:
                points.append(t)
        out.append(points[::-1])
    return out


def segment(
    series: Sequence[np.ndarray], sigmas: np.ndarray | None = None, min_size: int = MIN_PERSIST
) -> list[list[int]]:
    """The change points of each series of log values (PELT, batched by length; ``sigmas``:
    their noise, default :func:`noise_sigmas`)."""
    sigmas = noise_sigmas(series) if sigmas is None else sigmas
    order = sorted(
        (i for i in range(len(series)) if len(series[i]) >= 2 * min_size),
        key=lambda i: len(series[i]),
    )
    found: list[list[int]] = [[] for _ in series]
    for start in range(0, len(order), BATCH):
        chunk = order[start : start + BATCH]
        lengths = np.array([len(series[i]) for i in chunk])
        width = int(lengths.max())
        x = np.empty((len(chunk), width))
        for row, i in enumerate(chunk):
            values = series[i] - np.median(series[i])  # centred: no cancellation in the sums
            x[row, : len(values)] = values
            x[row, len(values) :] = values[-1]
        beta = np.array([penalty(n) for n in lengths])
        for i, points in zip(chunk, pelt(x, lengths, sigmas[chunk], beta, min_size), strict=True):
            found[i] = points
    return found


def _p_value(old: np.ndarray, new: np.ndarray, up: bool) -> float:
    """One-sided p of the Mann-Whitney U test, ``new`` above (``up``) or below ``old``: exact
    (ties counted 1/2, the distribution without ties) for up to CONFIDENCE_WINDOW a side."""
    diff = np.subtract.outer(new, old) if up else np.subtract.outer(old, new)
    u = float((diff > 0).sum() + 0.5 * (diff == 0).sum())
    tail = _u_tail(len(new), len(old))
    return float(tail[min(math.ceil(u), len(tail) - 1)])


@functools.cache
def _u_tail(m: int, n: int) -> np.ndarray:
    """P(U >= u) for u = 0..m*n under the null (the arrangements of m and n values)."""
    counts = np.zeros((m + 1, n + 1, m * n + 1))
    counts[0, :, 0] = counts[:, 0, 0] = 1
    for i in range(1, m + 1):
        for j in range(1, n + 1):
            counts[i, j, j:] += counts[i - 1, j, : m * n + 1 - j]  # the largest is one of m
            counts[i, j] += counts[i, j - 1]
    density = counts[m, n] / counts[m, n].sum()
    return np.cumsum(density[::-1])[::-1]


def _where(segments, first: int, last: int, at: int | None) -> tuple[int, int]:
    """(last commit at the old level, first at the new) of the run of boundaries ``first``..
    ``last`` (boundary i: between segments i and i + 1), or of its boundary ``at``."""
    if at is not None:
        return segments[at][1] - 1, segments[at + 1][0]
    return segments[first][1] - 1, segments[last + 1][0]


def _measured(logs: np.ndarray, kinds: Sequence[tuple[str, int, int]]) -> list[Change]:
    """The changes at (kind, before, after), each measured on the commits of its two levels: up
    to CONFIDENCE_WINDOW each side, not past the changes either side of it."""
    out = []
    for i, (kind, before, after) in enumerate(kinds):
        start = max(kinds[i - 1][2] if i else 0, before + 1 - CONFIDENCE_WINDOW)
        stop = min(
            kinds[i + 1][1] + 1 if i + 1 < len(kinds) else len(logs), after + CONFIDENCE_WINDOW
        )
        old, new = logs[start : before + 1], logs[after:stop]
        level_old, level_new = float(np.median(old)), float(np.median(new))
        p = _p_value(old, new, level_new > level_old)
        size = math.exp(level_new - level_old)
        out.append(Change(kind, before, after, size, p, math.exp(level_old), math.exp(level_new)))
    return out


def _runs(logs, segments, jumps, sigma: float) -> list[tuple[int, int]]:
    """Consecutive boundaries moving the same way with no plateau between them
    (:func:`_plateau`)."""
    runs: list[tuple[int, int]] = []
    for i, jump in enumerate(jumps):
        same_way = runs and np.sign(jumps[i - 1]) == np.sign(jump)
        if same_way and not _plateau(logs, segments, i, sigma):
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _plateau(logs: np.ndarray, segments, i: int, sigma: float) -> bool:
    """Whether segment ``i``, between two boundaries moving the same way, is a level of its own
    rather than part of one slope: over segments i - 1, i and i + 1 (at most CONFIDENCE_WINDOW
    commits of the outer two), three constant levels fit better than the best ramp (flat, a
    straight line from knot 1 to knot 2, flat; knots within RAMP_KNOTS commits outside the two
    boundaries) by more than the penalty of one more level: BIC, the rule that drew the
    segments."""
    left, middle, right = segments[i - 1], segments[i], segments[i + 1]
    start = max(left[0], left[1] - CONFIDENCE_WINDOW)
    end = min(right[1], right[0] + CONFIDENCE_WINDOW)
    x, t = logs[start:end], np.arange(start, end)
    steps = sum(
        float(((x[a - start : b - start] - x[a - start : b - start].mean()) ** 2).sum())
        for a, b in ((start, left[1]), middle, (right[0], end))
    )
    ramp = min(
        _ramp_rss(x, t, knot1, knot2)
        for knot1 in range(max(start, left[1] - 1 - RAMP_KNOTS), left[1])
        for knot2 in range(right[0], min(end, right[0] + RAMP_KNOTS + 1))
    )
    return (ramp - steps) / sigma**2 > penalty(len(logs))


def _ramp_rss(x: np.ndarray, t: np.ndarray, knot1: int, knot2: int) -> float:
    """The residual sum of squares of x against flat, a line from knot1 to knot2, flat (the two
    flat levels fitted by least squares)."""
    w = np.clip((knot2 - t) / (knot2 - knot1), 0.0, 1.0)
    basis = np.stack([w, 1 - w], axis=1)
    fitted = basis @ np.linalg.lstsq(basis, x, rcond=None)[0]
    return float(((x - fitted) ** 2).sum())


def _beyond_noise(segments, first: int, last: int, total: float, sigma: float) -> bool:
    """Whether a change is Z_MIN standard errors of the difference of its two levels (sigma x
    sqrt(1/a + 1/b), a and b the commits at each level, at most CONFIDENCE_WINDOW)."""
    old, new = segments[first], segments[last + 1]
    a, b = (min(CONFIDENCE_WINDOW, end - start) for start, end in (old, new))
    return abs(total) >= Z_MIN * sigma * math.sqrt(1 / a + 1 / b)


def _persists(logs, segments, levels, at: int) -> bool:
    """Whether the last MIN_PERSIST commits before boundary ``at`` sit on the old side of the
    midpoint between the two levels and the first MIN_PERSIST after it on the new side (one slow
    run beside normal ones moves a 2-commit segment's level, but not both of its commits)."""
    mid = (levels[at] + levels[at + 1]) / 2
    up = levels[at + 1] > levels[at]
    edge = segments[at + 1][0]
    before, after = logs[edge - MIN_PERSIST : edge], logs[edge : edge + MIN_PERSIST]
    if not up:
        before, after = -before, -after
        mid = -mid
    return bool(np.all(before < mid) and np.all(after > mid))


def changes_of(
    logs: np.ndarray,
    points: Sequence[int],
    threshold: float = THRESHOLD,
    sigma: float | None = None,
) -> Fit:
    """The steps and drifts of one series of log values, given its change points (``sigma``:
    its noise, default :func:`noise_sigma`)."""
    sigma = noise_sigma(logs) if sigma is None else sigma
    bounds = [0, *points, len(logs)]
    segments = tuple(zip(bounds[:-1], bounds[1:], strict=True))
    levels = [float(np.median(logs[a:b])) for a, b in segments]
    jumps = np.diff(levels)
    found = []
    for first, last in _runs(logs, segments, jumps, sigma):
        total = levels[last + 1] - levels[first]
        small = abs(total) <= math.log(threshold)
        if small or not _beyond_noise(segments, first, last, total, sigma):
            continue
        share = np.abs(jumps[first : last + 1]) / abs(total)
        if last == first or share.max() >= DOMINANT:
            at = first + int(np.argmax(share))
            if _persists(logs, segments, levels, at):
                found.append(("step", *_where(segments, first, last, at)))
        else:
            found.append(("drift", *_where(segments, first, last, None)))
    changes = tuple(_measured(logs, found))
    return Fit(segments, tuple(math.exp(v) for v in levels), sigma, changes)


def detect(series: Sequence[Sequence[float]], threshold: float = THRESHOLD) -> list[Fit]:
    """Fit every series (positive values, one per commit) and read its changes."""
    logs = [np.log(np.asarray(values, dtype=float)) for values in series]
    sigmas = noise_sigmas(logs)
    points = segment(logs, sigmas)
    return [
        changes_of(v, p, threshold, float(s)) for v, p, s in zip(logs, points, sigmas, strict=True)
    ]


def synthetic(count: int, length: int, seed: int = 0, sigma: float = 0.03) -> list[np.ndarray]:
    """``count`` series of ``length`` values, lognormal noise ``sigma``, one in three with a 1.3x
    step somewhere: what :func:`time_detection` times."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        values = np.exp(rng.normal(0, sigma, length))
        if i % 3 == 0:
            values[rng.integers(length // 4, 3 * length // 4) :] *= 1.3
        out.append(values)
    return out


def time_detection(count: int = 1000, length: int = 200, seed: int = 0) -> tuple[float, int]:
    """(seconds, steps found) to detect the changes of ``count`` synthetic series of ``length``
    commits (the benchmark of docs/history.md)."""
    import time

    series = synthetic(count, length, seed)
    start = time.perf_counter()
    fits = detect(series)
    return time.perf_counter() - start, sum(len(f.changes) for f in fits)
