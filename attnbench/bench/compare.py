"""Compare a speed run with a baseline, on what stays stable on a noisy, shared machine.

Rows are matched by their key (:data:`attnbench.bench.results.KEY`: mechanism, path, params,
dtype, shape, causal, direction). For each matched pair:

* **time** — not absolute time, which swings 10-20 % between jobs on shared CI and up to 2x, but
  the case's time over the reference mechanism's *in the same interleaved round* (``ref_ratio``;
  for the reference itself: its time over the matmul timed in the same round, i.e. time in units
  of "matmul work"). ``change`` = current median / baseline median. A case is *worse* when:

  1. **it moved beyond its own scatter**: a one-sided **Mann-Whitney U test** of the per-round
     ratios (current slower), kept in the samples file beside each CSV, gives p < ``p_value`` =
     0.001 (asv's ``is_different`` asks for a two-sided 0.002, the same thing); exact
     distribution without ties up to :data:`EXACT_MAX` rounds a side, else the normal
     approximation with tie and continuity corrections. The test needs enough rounds to reach
     that p at all (7 and 7, 6 and 9, ...; never 3 and 3): with fewer, the p20..p80 bands must
     be apart (current p20 > baseline p80) instead, and a note counts such cases;
  2. ``change`` > ``min_effect`` = 1.2 (with too few rounds ``time_ratio`` = 1.35; the
     reference's own time ``ref_time_ratio`` = 1.4), taken relative to what moved the case's
     whole group (below);
  3. **it moved beyond the noise of the comparison** (below) by ``CORROBORATED_Z`` = 2 sigma,
     **and** another case of the same path (mechanism:path; any length, direction or causal
     flag) did too — a slowdown in the code shows in several cases of its path, a fluke of the
     machine in one — or, alone, by more than ``SOLO_EFFECT`` = 2x and ``NOISE_Z`` = 6 sigma.
     A case that passes 1, 2 and 2 sigma alone is *suspect*: reported, not failed, and a
     regression when a re-run (``confirm``) shows it again. So is every such case when 2 sigma
     is beyond 2x (``USELESS_NOISE``): such runs cannot show a regression, and a note says so.

  The U test sees the scatter *within* each run; what moves *between* two runs (other
  processes, memory placement) shifts every round of a case together. Over 220 A/A case
  comparisons of the CI grid on this shared 2-core machine, 3 were significant at p < 0.001
  beyond 1.2x, and one case of one run moved 1.48x with tight rounds on both sides, 10 sigma:
  hence condition 3. With it, 10 A/A comparisons gave no alarm and a 1.3x slowdown of one path
  was caught in 9 of 10, both on the machine as it was and with a busy loop on one core
  (results/compare-aa/README.md). Results without a samples file (older results, the
  committed CI baselines) are judged by the **threshold rule** they were tuned with, unchanged
  (bands apart and change > 1.35x), and a note says so. *Better* is the
  mirror image (a better case alone is not reported).
* **the noise of a comparison** — most cases do not change between two runs, so their changes
  measure what moves between runs. Cases timed in the same rounds share a reference, whose own
  drift moves them all: each such group (of at least :data:`MIN_GROUP_FOR_CENTRE` cases) is
  centred on its median change, smaller ones on the median of all cases, and ``sigma`` =
  1.4826 x the median absolute deviation of the log changes around those centres, from at least
  :data:`MIN_CASES_FOR_NOISE` cases (fewer: the floors alone). Two 1-thread CPU-time runs of
  the CI grid give sigma 0.02-0.1 on this machine; two 2-thread wall-clock runs of the default
  suite, with other work running, gave 0.9 (where the old rule saw 30 "regressions"), and a note
  then says that such runs cannot show a regression and how to make comparable ones. The noise
  of the reference's own time comes from every case's ratio to the matmul.
* **FLOPs** — counted, not measured: any difference is a regression (refresh the baseline when a
  count is meant to change).
* **peak memory** — when both rows name a deterministic method (``dispatch-live-bytes``):
  worse when current > baseline x (1 + ``mem_tolerance``) + ``mem_slack_bytes``; other methods
  use ``mem_tolerance_other``.
* **status** — ``ok`` turning into ``oom`` or ``error`` (or ``unsupported``) is a regression; the
  reverse an improvement. ``skipped`` (the sweep's ``max_call_s``, predicted from the same path at
  a smaller n) is *not run*, not a regression: a load burst can trip it, and a real slowdown shows
  in that smaller case, which is compared.

**Runs not made for comparing** — another clock, thread count or suite: said in one line, and
compared with every time floor squared (1.2 -> 1.44, 1.35 -> 1.82, 1.4 -> 1.96) besides the
noise condition (which widens by itself for such pairs). Another device, CPU or torch version is
skipped with a warning (exit 3).

**Confirmation** (``confirm``: results of the same grid run again): a quantity counts as *worse*
only when it is worse in this run and shown again (worse or suspect) in every re-run; one that
is worse in this run alone is *unconfirmed*, reported and not failed; a suspect one shown again
by every re-run is worse. A slowdown that the code causes repeats; a neighbour's
burst of load on a shared machine rarely hits the same case twice. ``.ci/run`` re-runs the grid
only when the first comparison finds something worse or suspect.

Rows only in the current run are *new* (mechanisms added since the baseline) and rows only in
the baseline are *missing*; both are reported and neither fails.

Exit codes: 0 nothing worse, 1 at least one regression, 2 usage error (a file that is not a
results CSV, one with nothing measured, a re-run that cannot be compared), 3 nothing comparable.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attnbench.bench.results import (
    CaseSamples,
    read_results,
    read_samples,
    read_sidecar,
    row_key,
)
from attnbench.bench.results import plain as _plain
from attnbench.bench.thresholds import (
    CORROBORATED_Z,
    DETERMINISTIC_MEMORY,
    EXACT_MAX,
    EXIT_NOTHING,
    EXIT_OK,
    EXIT_REGRESSION,
    MACHINE_COLUMNS,
    MEM_SLACK_BYTES,
    MEM_TOLERANCE,
    MEM_TOLERANCE_OTHER,
    MIN_CASES_FOR_NOISE,
    MIN_EFFECT,
    MIN_GROUP_FOR_CENTRE,
    NOISE_Z,
    P_VALUE,
    REF_TIME_RATIO,
    SETUP_COLUMNS,
    SOLO_EFFECT,
    TIME_RATIO,
    USELESS_NOISE,
    VERDICT_ORDER,
    WORK_METRIC,
)
from attnbench.core.errors import AttnbenchError


@dataclass(frozen=True)
class Thresholds:
    time_ratio: float = TIME_RATIO
    ref_time_ratio: float = REF_TIME_RATIO
    mem_tolerance: float = MEM_TOLERANCE
    mem_slack_bytes: int = MEM_SLACK_BYTES
    mem_tolerance_other: float = MEM_TOLERANCE_OTHER
    require_separation: bool = True
    p_value: float = P_VALUE
    min_effect: float = MIN_EFFECT

    def describe(self) -> str:
        sep = " and p20..p80 bands apart" if self.require_separation else ""
        return (
            f"time: Mann-Whitney U p < {self.p_value:g} on per-round ratios, change > "
            f"{self.min_effect:g}x and beyond the noise ({NOISE_Z:g} sigma; {CORROBORATED_Z:g} "
            f"with another case of the path) (without samples: > {self.time_ratio:g}x{sep}); "
            "reference "
            f"time (x matmul) > {self.ref_time_ratio:g}x; FLOPs exactly; memory > "
            f"{self.mem_tolerance:.0%} + {self.mem_slack_bytes // 1024} KiB (deterministic) or > "
            f"{self.mem_tolerance_other:.0%} (other)"
        )


@dataclass(frozen=True)
class Noise:
    """What moved between the two runs. ``groups``: per group of cases timed in the same rounds
    (:func:`group_of`), their median change, i.e. what moved them together (the group's
    reference, whose time divides all of them); ``common``: the median change of all cases (for
    groups too small to have their own); ``sigma``: the robust spread of the log changes around
    their group's. No estimate (``cases`` < MIN_CASES_FOR_NOISE): 1 and 0."""

    common: float = 1.0
    sigma: float = 0.0
    cases: int = 0
    groups: dict[str, float] = field(default_factory=dict)

    def centre(self, group: str = "") -> float:
        return self.groups.get(group, self.common)

    def beyond(self, change: float, z: float, group: str = "") -> int:
        """1 (-1) when ``change`` is above (below) its group's change by more than z sigma."""
        offset = math.log(change / self.centre(group))
        return 1 if offset > z * self.sigma else (-1 if offset < -z * self.sigma else 0)

    def factor(self, z: float, up: bool = True, group: str = "") -> float:
        """The change that is z sigma beyond its group's (up: slower)."""
        return self.centre(group) * math.exp(z * self.sigma if up else -z * self.sigma)


@dataclass(frozen=True)
class Limits:
    """The time floors one comparison applies (widened for runs not made for comparing) and
    the noise it measured, for ratios to the reference and for the reference's own time."""

    tested: float = MIN_EFFECT  # ratio to the reference, U test
    rule: float = TIME_RATIO  # ratio to the reference, threshold rule
    reference: float = REF_TIME_RATIO  # the reference's own time (x matmul)
    noise: Noise = Noise()  # of the ratios to the reference
    noise_reference: Noise = Noise()  # of the ratios to the matmul

    def describe(self) -> str:
        n = self.noise
        noise = (
            f"noise: sigma {n.sigma:.3f} around each group's median change (all cases: "
            f"x{n.common:.3g}); beyond {CORROBORATED_Z:g} sigma with another case of the path, "
            f"or {NOISE_Z:g} sigma and x{SOLO_EFFECT:g} alone"
            if n.cases
            else "too few cases to measure the noise"
        )
        return (
            f"this comparison: change > {self.tested:.3g}x (U test) or > {self.rule:.3g}x "
            f"(threshold rule), reference > {self.reference:.3g}x; {noise}"
        )


@dataclass(frozen=True)
class Line:
    """One compared quantity of one case."""

    case: str
    metric: str
    baseline: str
    current: str
    ratio: float | None
    verdict: str  # worse | unconfirmed | better | same | new | missing | not run
    note: str = ""
    p_value: float | None = None  # the U test's one-sided p (current slower), when tested
    test: str = ""  # "U test 9+9 rounds" | "threshold rule" | "" (not a timed quantity)
    impl: str = ""  # mechanism:path (what corroborates a time line)
    group: str = ""  # the cases timed in the same rounds (what is centred together)


@dataclass
class Comparison:
    current: Path
    baseline: Path
    lines: list[Line] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how it was compared (fallbacks, widening)
    compared: int = 0  # matched cases with at least one quantity compared
    thresholds: Thresholds = Thresholds()
    limits: Limits = Limits()
    provenance: dict[str, str] = field(default_factory=dict)
    confirmed_by: list[Path] = field(default_factory=list)  # re-runs a regression had to repeat in

    def count(self, verdict: str) -> int:
        cases = {line.case for line in self.lines if line.verdict == verdict}
        return len(cases)

    @property
    def exit_code(self) -> int:
        if self.count("worse"):
            return EXIT_REGRESSION
        if self.compared == 0:
            return EXIT_NOTHING
        return EXIT_OK

    def headline(self) -> str:
        worse = self.count("worse")
        verdict = (
            f"{worse} regression{'s' * (worse != 1)}"
            if worse
            else ("nothing comparable" if self.compared == 0 else "nothing worse")
        )
        parts = [f"{self.compared} cases compared"]
        for v in ("unconfirmed", "suspect", "better", "new", "missing"):
            if self.count(v):
                parts.append(f"{self.count(v)} {v}")
        return f"{verdict} ({', '.join(parts)})"

    def describe(self) -> str:
        return f"{self.thresholds.describe()}; {self.limits.describe()}"

    def shown(self, everything: bool = False, changes_only: bool = False) -> list[Line]:
        """Lines worth a reader's time, worst first: every case's time line, other quantities
        only when they changed (``everything``: all lines; ``changes_only``: only lines whose
        verdict is not same / not run)."""
        quiet = ("same", "not run")
        keep = [
            line
            for line in self.lines
            if everything
            or (line.verdict not in quiet if changes_only else line.verdict != "same")
            or (not changes_only and line.metric.startswith("time"))
        ]
        return sorted(keep, key=lambda line: VERDICT_ORDER.index(line.verdict))


# --------------------------------------------------------------------------------------------
# The Mann-Whitney U test
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UTest:
    """U of ``current`` over ``baseline`` (pairs in which the current value is larger, ties
    counting 1/2) and its one-sided p-values."""

    u: float
    p_greater: float  # H1: current values tend to be larger (slower)
    p_less: float  # H1: current values tend to be smaller (faster)
    exact: bool


def _average_ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks 1..N, tied values sharing their mean rank; and the size of every tie group."""
    unique, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # ranks before each distinct value
    mean_rank = first + (counts + 1) / 2
    return mean_rank[inverse], counts


@cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """counts[u]: how many of the C(m + n, m) orderings of distinct values give U = u for the
    sample of m. The largest value belongs to the m sample (it beats all n: U - n on the rest)
    or to the n sample (U unchanged on the rest)."""
    if m == 0 or n == 0:
        return (1,)
    out = [0] * (m * n + 1)
    for u, c in enumerate(_u_counts(m - 1, n)):
        out[u + n] += c
    for u, c in enumerate(_u_counts(m, n - 1)):
        out[u] += c
    return tuple(out)


def _normal_tail(z: float) -> float:
    """P(Z >= z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def mann_whitney_u(current: Sequence[float], baseline: Sequence[float]) -> UTest:
    """The Mann-Whitney U test of two independent samples (numpy only): exact without ties when
    both have at most :data:`EXACT_MAX` values, else the normal approximation with the tie
    correction of the variance and a continuity correction."""
    x, y = np.asarray(current, dtype=float), np.asarray(baseline, dtype=float)
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        raise ValueError("the U test needs at least one value on each side")
    ranks, ties = _average_ranks(np.concatenate([x, y]))
    u = float(ranks[:m].sum() - m * (m + 1) / 2)
    if ties.max() == 1 and max(m, n) <= EXACT_MAX:
        counts = _u_counts(m, n)
        total = math.comb(m + n, m)
        k = round(u)
        return UTest(u, sum(counts[k:]) / total, sum(counts[: k + 1]) / total, True)
    big_n = m + n
    tie_term = float((ties**3 - ties).sum()) / (big_n * (big_n - 1))
    var = m * n / 12 * ((big_n + 1) - tie_term)
    if var <= 0:  # every value equal
        return UTest(u, 1.0, 1.0, False)
    mean, sd = m * n / 2, math.sqrt(var)
    p_greater = _normal_tail((u - mean - 0.5) / sd)
    p_less = _normal_tail((mean - u - 0.5) / sd)
    return UTest(u, min(1.0, p_greater), min(1.0, p_less), False)


def smallest_p(m: int, n: int) -> float:
    """The smallest one-sided p the U test can give with m and n values: 1 / C(m + n, m)."""
    return 1 / math.comb(m + n, m)


# --------------------------------------------------------------------------------------------
# Noise and limits
# --------------------------------------------------------------------------------------------


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


def group_of(row: Mapping[str, Any]) -> str:
    """The cases timed in the same rounds against the same reference: ``fwd causal n=256 B1
    H4 D32 float32``."""
    tag = "causal" if row["causal"] else "bidir"
    return (
        f"{row['direction']} {tag} n={row['seq_len']} B{row['batch']} H{row['heads']} "
        f"D{row['head_dim']} {row['dtype']}"
    )


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


# --------------------------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------------------------


def _label(row: Mapping[str, Any]) -> str:
    tag = "causal" if row["causal"] else "bidir"
    params = f" [{row['params']}]" if row["params"] else ""
    return (
        f"{row['mechanism']}:{row['path']}{params} {row['direction']} {tag} n={row['seq_len']} "
        f"B{row['batch']} H{row['heads']} D{row['head_dim']} {row['dtype']}"
    )


def _keyed(df: pd.DataFrame, path: Path) -> dict[tuple, dict[str, Any]]:
    out: dict[tuple, dict[str, Any]] = {}
    for row in df.to_dict("records"):
        row = {c: _plain(v) for c, v in row.items()}
        key = row_key(row)
        if key in out:
            raise AttnbenchError(f"{path}: two rows for the same case ({_label(row)})")
        out[key] = row
    return out


def _missing(x: Any) -> bool:
    return _plain(x) is None


def machine_of(df: pd.DataFrame, columns: Sequence[str] = MACHINE_COLUMNS) -> str:
    """``device=cpu|device_name=AMD EPYC|torch_version=2.13.0+cpu`` (or several, ``; ``)."""
    kinds = df[list(columns)].drop_duplicates().astype(str).to_dict("records")
    return "; ".join("|".join(f"{c}={k[c]}" for c in columns) for k in kinds)


def _bytes(x: Any) -> str:
    x = float(x)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= size:
            return f"{x / size:.3g} {unit}"
    return f"{x:.0f} B"


@dataclass(frozen=True)
class Timing:
    """One side of a case's time quantity: median and p20/p80 as the row has them, and the
    per-round samples when the run kept them."""

    median: float
    p20: float
    p80: float
    samples: tuple[float, ...] | None = None

    def text(self) -> str:
        return f"{self.median:.3f} ({self.p20:.3f}-{self.p80:.3f})"


def _usable(row: Mapping[str, Any], samples: CaseSamples | None) -> CaseSamples | None:
    """The case's samples if they belong to this row (as many as the row says it took)."""
    if samples is None or _missing(row.get("samples")):
        return None
    return samples if len(samples.time_ms) == int(row["samples"]) else None


def _ratio_timing(row: Mapping[str, Any], samples: CaseSamples | None) -> Timing:
    kept = samples.ref_ratio if samples is not None else None
    return Timing(row["ref_ratio"], row["ref_ratio_p20"], row["ref_ratio_p80"], kept)


def _work_timing(row: Mapping[str, Any], samples: CaseSamples | None) -> Timing:
    """The time in units of matmul work: per round, time / the matmul's time (samples); from
    the row, time x the matmul's rate."""
    rate = row["matmul_flop_per_s"] / 1e12
    kept = samples.matmul_ratio if samples is not None else None
    return Timing(row["time_median_ms"] * rate, row["time_p20_ms"] * rate,
                  row["time_p80_ms"] * rate, kept)  # fmt: skip


def is_reference(row: Mapping[str, Any]) -> bool:
    return f"{row['mechanism']}:{row['path']}" == row["reference"]


def uses_ref_ratio(b: Mapping[str, Any], c: Mapping[str, Any]) -> bool:
    """Compared as ratio to the reference (else: in units of matmul work)."""
    has_ratio = not _missing(b["ref_ratio"]) and not _missing(c["ref_ratio"])
    return has_ratio and b["reference"] == c["reference"] and not is_reference(c)


def time_change(b: Mapping[str, Any], c: Mapping[str, Any]) -> tuple[str, float] | None:
    """("ratio" | "work", current / baseline) of a matched ok pair; None if not comparable."""
    if uses_ref_ratio(b, c):
        return "ratio", c["ref_ratio"] / b["ref_ratio"]
    if _missing(b["matmul_flop_per_s"]) or _missing(c["matmul_flop_per_s"]):
        return None
    return "work", _work_timing(c, None).median / _work_timing(b, None).median


def judge(
    base: Timing,
    cur: Timing,
    floors: tuple[float, float],
    th: Thresholds,
    separation: bool,
    centre: float = 1.0,
) -> tuple[str, float, float | None, str, str]:
    """(verdict, change, p, test, note) of one time quantity on conditions 1 and 2: the U test
    on the per-round samples when both sides have enough (beyond ``floors[0]``), else the
    threshold rule (beyond ``floors[1]``, the p20..p80 bands apart when ``separation``). With
    samples, the floors apply to the change relative to ``centre``, what moved the case's whole
    group (its reference's own drift); without, to the change as it is (the rule as it was).
    :func:`weigh_noise` applies condition 3."""
    floor_tested, floor_rule = floors
    if base.samples and cur.samples:
        m, n = len(cur.samples), len(base.samples)
        change = float(np.median(cur.samples) / np.median(base.samples))
        own = change / centre
        if smallest_p(m, n) < th.p_value:
            test = mann_whitney_u(cur.samples, base.samples)
            up = (test.p_greater < th.p_value, own > floor_tested)
            down = (test.p_less < th.p_value, own < 1 / floor_tested)
            note = ""
            if own > floor_tested and not up[0]:
                note = f"beyond {floor_tested:.3g}x but not significant (p = {test.p_greater:.2g})"
            return _verdict(up, down), change, test.p_greater, f"U test {m}+{n} rounds", note
        rule = f"{RULE} and the noise ({m}+{n} rounds: too few for the U test)"
    else:
        change = own = cur.median / base.median
        rule = RULE
    up = (not separation or cur.p20 > base.p80, own > floor_rule)
    down = (not separation or cur.p80 < base.p20, own < 1 / floor_rule)
    note = "beyond the threshold but within the noise bands" if up[1] and not up[0] else ""
    return _verdict(up, down), change, None, rule, note


#: How a line is judged without samples: the rule the CI baselines were tuned with, as it was.
RULE = "threshold rule"


def _verdict(up: tuple[bool, bool], down: tuple[bool, bool]) -> str:
    return "worse" if all(up) else ("better" if all(down) else "same")


def _time_line(
    label: str,
    b: Mapping[str, Any],
    c: Mapping[str, Any],
    th: Thresholds,
    limits: Limits,
    samples: tuple[CaseSamples | None, CaseSamples | None],
) -> Line:
    sb, sc = _usable(b, samples[0]), _usable(c, samples[1])
    where = {"impl": f"{c['mechanism']}:{c['path']}", "group": group_of(c)}
    if uses_ref_ratio(b, c):
        base, cur = _ratio_timing(b, sb), _ratio_timing(c, sc)
        floors, centre = (limits.tested, limits.rule), limits.noise.centre(where["group"])
        verdict, change, p, test, note = judge(base, cur, floors, th, th.require_separation,
                                               centre)  # fmt: skip
        metric = f"time / {c['reference']}"
        return Line(label, metric, base.text(), cur.text(), change, verdict, note, p, test,
                    **where)  # fmt: skip
    if _missing(b["matmul_flop_per_s"]) or _missing(c["matmul_flop_per_s"]):
        return Line(label, "time", "-", "-", None, "same", "no reference ratio or calibration")
    base, cur = _work_timing(b, sb), _work_timing(c, sc)
    floors = (limits.reference, limits.reference)
    centre = limits.noise_reference.centre(where["group"])
    verdict, change, p, test, note = judge(base, cur, floors, th, False, centre)
    note = note or "the reference itself: time over the matmul timed in the same rounds"
    return Line(label, WORK_METRIC, f"{b['time_median_ms']:.3g} ms",
                f"{c['time_median_ms']:.3g} ms", change, verdict, note, p, test,
                **where)  # fmt: skip


def _kind(line: Line) -> str:
    return "reference" if line.metric == WORK_METRIC else "ratio"


def _noise(line: Line, limits: Limits) -> Noise:
    return limits.noise_reference if _kind(line) == "reference" else limits.noise


def _moved(line: Line, limits: Limits, z: float) -> bool:
    """Whether a worse (better) line is above (below) its group's change by z sigma."""
    side = 1 if line.verdict == "worse" else -1
    return _noise(line, limits).beyond(line.ratio, z, line.group) == side


def too_noisy(noise: Noise) -> bool:
    """Whether two runs disagree so widely that even two cases of a path cannot show a
    regression: CORROBORATED_Z sigma is beyond USELESS_NOISE (2x)."""
    return math.exp(CORROBORATED_Z * noise.sigma) > USELESS_NOISE


def weigh_noise(lines: Sequence[Line], limits: Limits) -> list[Line]:
    """Condition 3 on the worse / better time lines judged from samples (the threshold rule
    without samples stands as it was): beyond CORROBORATED_Z sigma of the noise
    and with another such line of the same path (and metric kind), or beyond NOISE_Z sigma and
    SOLO_EFFECT alone. A worse line short of that but beyond CORROBORATED_Z sigma is *suspect*;
    the rest are ``same``. Each says why in its note."""

    def candidate(line: Line) -> bool:
        return line.test not in ("", RULE) and line.verdict in ("worse", "better")

    beyond = {id(ln): _moved(ln, limits, CORROBORATED_Z) for ln in lines if candidate(ln)}
    paths: dict[tuple[str, str, str], int] = {}
    for line in lines:
        if beyond.get(id(line)):
            key = (line.impl, _kind(line), line.verdict)
            paths[key] = paths.get(key, 0) + 1
    return [
        _weighed(ln, limits, paths.get((ln.impl, _kind(ln), ln.verdict), 0) - 1)
        if candidate(ln) else ln
        for ln in lines
    ]  # fmt: skip


def _weighed(line: Line, limits: Limits, others: int) -> Line:
    """One worse / better line with ``others`` lines of its path beyond the noise too."""
    noise = _noise(line, limits)
    if not _moved(line, limits, CORROBORATED_Z):
        note = f"{line.ratio:.3f}x, but within this comparison's noise (what moved between runs)"
        return dataclasses.replace(line, verdict="same", note=note)
    if too_noisy(noise):
        if line.verdict == "better":
            return dataclasses.replace(line, verdict="same", note="these runs are too noisy")
        note = (
            f"{line.ratio:.3f}x, but these two runs disagree too widely to show a regression; "
            "a re-run (--confirm) that shows it again makes it one"
        )
        return dataclasses.replace(line, verdict="suspect", note=note)
    if others > 0:
        note = f"with {others} other case{'s' * (others > 1)} of {line.impl}"
        return dataclasses.replace(line, note=note)
    own = line.ratio / noise.centre(line.group)
    big = own > SOLO_EFFECT if line.verdict == "worse" else own < 1 / SOLO_EFFECT
    if big and _moved(line, limits, NOISE_Z):
        return line
    if line.verdict == "better":
        note = f"{line.ratio:.3f}x, one case of {line.impl} alone: within what one case can move"
        return dataclasses.replace(line, verdict="same", note=note)
    note = (
        f"one case of {line.impl} alone, {line.ratio:.3f}x: a case can shift this much between "
        "two processes of the same code; a re-run (--confirm) that shows it again makes it a "
        "regression"
    )
    return dataclasses.replace(line, verdict="suspect", note=note)


def compare_rows(
    b: Mapping[str, Any],
    c: Mapping[str, Any],
    th: Thresholds,
    limits: Limits | None = None,
    samples: tuple[CaseSamples | None, CaseSamples | None] = (None, None),
) -> list[Line]:
    """Every compared quantity of one matched case (``samples``: the baseline's, the
    current's per-round samples of this case, when kept)."""
    label = _label(c)
    bs, cs = b["status"], c["status"]
    if bs != "ok" or cs != "ok":
        if bs == cs:
            return [Line(label, "status", bs, cs, None, "not run", str(c["reason"] or ""))]
        if cs == "skipped":  # the sweep's time limit, predicted from a smaller n that is compared
            note = f"not measured in this run: {c['reason'] or 'skipped'}"
            return [Line(label, "status", bs, cs, None, "not run", note)]
        verdict = "worse" if bs == "ok" else ("better" if cs == "ok" else "same")
        return [Line(label, "status", bs, cs, None, verdict, str(c["reason"] or b["reason"]))]
    limits = limits or Limits(th.min_effect, th.time_ratio, th.ref_time_ratio)
    lines = [_time_line(label, b, c, th, limits, samples)]
    lines.append(_flops_line(label, b, c))
    for col, name in (("mem_fwd_bytes", "mem fwd"), ("mem_fwdbwd_bytes", "mem fwd+bwd")):
        line = _memory_line(label, name, b, c, col, th)
        if line is not None:
            lines.append(line)
    return lines


def _flops_line(label: str, b: Mapping[str, Any], c: Mapping[str, Any]) -> Line:
    bf, cf = _plain(b["flops"]), _plain(c["flops"])
    if bf == cf:
        return Line(label, "flops", str(bf), str(cf), 1.0, "same")
    ratio = cf / bf if bf and cf is not None else None
    note = "FLOP counts are exact: refresh the baseline if the count was meant to change"
    return Line(label, "flops", str(bf), str(cf), ratio, "worse", note)


def _memory_line(
    label: str, name: str, b: Mapping[str, Any], c: Mapping[str, Any], col: str, th: Thresholds
) -> Line | None:
    if _missing(b[col]) and _missing(c[col]):
        return None
    if _missing(b[col]) or _missing(c[col]):
        return Line(label, name, str(_plain(b[col]) or "-"), str(_plain(c[col]) or "-"), None,
                    "same", "measured in one run only")  # fmt: skip
    bb, cc = float(b[col]), float(c[col])
    if b["mem_method"] != c["mem_method"]:
        note = f"methods differ ({b['mem_method']} vs {c['mem_method']}): not compared"
        return Line(label, name, _bytes(bb), _bytes(cc), None, "same", note)
    if c["mem_method"] in DETERMINISTIC_MEMORY:
        limit_up = bb * (1 + th.mem_tolerance) + th.mem_slack_bytes
        limit_down = (bb - th.mem_slack_bytes) / (1 + th.mem_tolerance)
    else:
        limit_up = bb * (1 + th.mem_tolerance_other)
        limit_down = bb / (1 + th.mem_tolerance_other)
    verdict = "worse" if cc > limit_up else ("better" if cc < limit_down else "same")
    ratio = cc / bb if bb else None
    return Line(label, name, _bytes(bb), _bytes(cc), ratio, verdict)


# --------------------------------------------------------------------------------------------
# Two files
# --------------------------------------------------------------------------------------------


def compare(
    current: Path,
    baseline: Path,
    thresholds: Thresholds | None = None,
    confirm: Sequence[Path] = (),
) -> Comparison:
    """Compare two results CSVs (see the module docstring); ``confirm``: re-runs of the same grid
    that a regression must repeat in. Raises AttnbenchError on bad input (re-runs included,
    whether or not they are needed)."""
    th = thresholds or Thresholds()
    current, baseline, confirm = Path(current), Path(baseline), [Path(p) for p in confirm]
    for path in confirm:
        read_measured(path, lambda _: None)
    out = _compare(current, baseline, th)
    if confirm and (out.count("worse") or out.count("suspect")):
        reruns = [_compare(path, baseline, th) for path in confirm]
        for path, rerun in zip(confirm, reruns, strict=True):
            if rerun.compared == 0:
                why = "; ".join(rerun.warnings) or "no case in common"
                raise AttnbenchError(f"--confirm {path}: not comparable with the baseline ({why})")
            out.provenance[str(path)] = rerun.provenance.get(str(path), "")
        out.confirmed_by = list(confirm)
        seen = [{(x.case, x.metric): x for x in rerun.lines} for rerun in reruns]
        out.lines = [_confirmed(line, seen) for line in out.lines]
    return out


#: What a re-run's line may say for a worse or suspect line of this run to count as repeated.
REPEATED = ("worse", "suspect")


def _confirmed(line: Line, reruns: Sequence[Mapping[tuple[str, str], Line]]) -> Line:
    """A worse line stays worse when every re-run (its lines by case and metric) shows it again
    (worse or suspect), else it is unconfirmed; a suspect line shown again by every re-run is
    worse; other lines are unchanged."""
    if line.verdict not in REPEATED:
        return line
    seen = []
    for rerun in reruns:
        match = rerun.get((line.case, line.metric))
        if match is None or match.verdict not in REPEATED:
            got = "absent" if match is None else f"{match.verdict}"
            if match is not None and match.ratio is not None:
                got += f", {match.ratio:.3f}x"
            seen.append(got)
    if not seen and line.verdict == "suspect":
        note = f"one case of {line.impl} alone, {line.ratio:.3f}x, and again in the re-run"
        return dataclasses.replace(line, verdict="worse", note=note)
    if not seen:
        return line
    if line.verdict == "suspect":
        return dataclasses.replace(line, note=f"{line.note}; the re-run: {'; '.join(seen)}")
    note = f"worse in this run only; the re-run: {'; '.join(seen)}"
    return dataclasses.replace(line, verdict="unconfirmed", note=note)


def read_measured(path: Path, warn) -> pd.DataFrame:
    """A results CSV with at least one measured (``ok``) row; one-line errors otherwise."""
    df = read_results(path, warn)
    if not (df["status"] == "ok").any():
        counts = ", ".join(f"{n} {s}" for s, n in df["status"].value_counts().items())
        raise AttnbenchError(
            f"{path}: nothing measured ({counts or 'no rows'}); accepted: results with at least "
            "one ok row"
        )
    return df


def _provenance(out: Comparison, path: Path, side: Mapping[str, Any] | None) -> None:
    if side is None:
        out.warnings.append(f"{path}: no sidecar {path.with_suffix('.json').name}")
        return
    git = side.get("git") or {}
    dirty = " (dirty)" if git.get("dirty") else ""
    out.provenance[str(path)] = (
        f"git {str(git.get('sha') or '?')[:10]}{dirty}, {side.get('started', '?')}"
    )


def _other_cpu(sides: Sequence[Mapping[str, Any] | None]) -> str | None:
    """A one-line reason when the sidecars name different CPUs (current, baseline)."""
    if not all(sides):
        return None
    cur, base = ((s.get("machine") or {}).get("cpu_signature") for s in sides)
    if cur and base and cur != base:
        return f"baseline is from another CPU ({base}; this run: {cur}): skipped, not compared"
    return None


def _settings_warnings(sides: Sequence[Mapping[str, Any] | None]) -> list[str]:
    if not all(sides):
        return []
    out = []
    for what, get in (
        ("suite file", lambda d: (d.get("suite") or {}).get("sha256")),
        ("malloc setting", lambda d: d.get("malloc")),
    ):
        if get(sides[0]) != get(sides[1]):
            out.append(
                f"the {what} differs from the baseline's: refresh the baseline if the grid "
                "or its settings changed on purpose"
            )
    return out


def _other_machine(cur_df: pd.DataFrame, base_df: pd.DataFrame) -> str | None:
    """A one-line reason when the rows name another device or torch version."""
    m_cur, m_base = machine_of(cur_df), machine_of(base_df)
    if m_cur == m_base:
        return None
    return (
        f"baseline is from another machine or torch version ({m_base}; this run: {m_cur}): "
        "skipped, not compared"
    )


def setup_mismatch(cur_df: pd.DataFrame, base_df: pd.DataFrame) -> str | None:
    """What differs in how the two runs were made (clock, threads, suite), or None."""
    diffs = []
    for col in SETUP_COLUMNS:
        cur, base = (sorted(set(df[col].astype(str))) for df in (cur_df, base_df))
        if cur != base:
            diffs.append(f"{col} {'/'.join(base)} in the baseline, {'/'.join(cur)} now")
    return "; ".join(diffs) or None


def _pairs(cur: dict, base: dict) -> list[tuple[tuple, dict, dict]]:
    return [(key, base[key], c) for key, c in cur.items() if key in base]


def _noise_changes(pairs) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(group, change) of every matched ok pair: ratios to the reference, and to the matmul."""
    ratio, work = [], []
    for _, b, c in pairs:
        if b["status"] != "ok" or c["status"] != "ok":
            continue
        if uses_ref_ratio(b, c):
            ratio.append((group_of(c), c["ref_ratio"] / b["ref_ratio"]))
        if not _missing(b["matmul_flop_per_s"]) and not _missing(c["matmul_flop_per_s"]):
            work.append((group_of(c), _work_timing(c, None).median / _work_timing(b, None).median))
    return ratio, work


def _samples_notes(paths: Sequence[Path], kept: Sequence[dict | None], th: Thresholds) -> list:
    missing = [str(p) for p, s in zip(paths, kept, strict=True) if s is None]
    if not missing:
        return []
    return [
        f"no samples file for {' and '.join(missing)} (older results or a saved baseline): time "
        f"judged by the threshold rule (change > {th.time_ratio:g}x and p20..p80 bands apart), "
        "not the U test"
    ]


def _compare(current: Path, baseline: Path, th: Thresholds) -> Comparison:
    out = Comparison(current=current, baseline=baseline, thresholds=th)
    warn = out.warnings.append
    cur_df, base_df = read_measured(current, warn), read_measured(baseline, warn)
    sides = [read_sidecar(current), read_sidecar(baseline)]
    for path, side in zip((current, baseline), sides, strict=True):
        _provenance(out, path, side)
    skipped = _other_cpu(sides) or _other_machine(cur_df, base_df)
    if skipped:
        out.warnings.append(skipped)
        return out
    out.warnings.extend(_settings_warnings(sides))
    cur, base = _keyed(cur_df, current), _keyed(base_df, baseline)
    kept = [read_samples(current, warn), read_samples(baseline, warn)]
    mismatch = setup_mismatch(cur_df, base_df)
    pairs = _pairs(cur, base)
    out.limits = limits_for(th, *_noise_changes(pairs), made_for_comparing=mismatch is None)
    if mismatch:
        lim = out.limits
        out.warnings.append(
            f"the runs were not made for comparing ({mismatch}): compared with wider "
            f"thresholds (floors squared: x{lim.tested:.3g} with samples, x{lim.rule:.3g} "
            f"without, x{lim.reference:.3g} for the reference; and this comparison's noise)"
        )
    out.notes.extend(_samples_notes((current, baseline), kept, th))
    for key, b, c in pairs:
        samples = ((kept[1] or {}).get(key), (kept[0] or {}).get(key))
        lines = compare_rows(b, c, th, out.limits, samples)
        out.lines.extend(lines)
        if any(line.verdict != "not run" for line in lines):
            out.compared += 1
    out.lines = weigh_noise(out.lines, out.limits)
    _unmatched(out, cur, base)
    _few_rounds_note(out)
    out.notes.extend(noise_notes(out.limits.noise))
    return out


def _unmatched(out: Comparison, cur: dict, base: dict) -> None:
    for key, c in cur.items():
        if key not in base:
            out.lines.append(Line(_label(c), "case", "-", c["status"], None, "new"))
    for key, b in base.items():
        if key not in cur:
            out.lines.append(Line(_label(b), "case", b["status"], "-", None, "missing"))
    if out.count("new"):
        out.warnings.append(
            f"{out.count('new')} cases are new (not in the baseline); refresh it to gate them"
        )
    if out.count("missing"):
        out.warnings.append(f"{out.count('missing')} baseline cases were not in this run")


def noise_notes(noise: Noise) -> list[str]:
    """One line when the noise decides much: the runs scatter widely, or moved together."""
    if not noise.cases:
        return []
    if too_noisy(noise):
        spread = math.exp(CORROBORATED_Z * noise.sigma)
        return [
            f"the two runs disagree too widely to show a regression (sigma {noise.sigma:.2f}: "
            f"x{spread:.3g} at {CORROBORATED_Z:g} sigma): what moved is at most "
            "suspect; on a shared machine, runs with --threads 1 or a suite with "
            'clock = "cpu" compare far better'
        ]
    if abs(math.log(noise.common)) > math.log(1.1):
        return [
            f"the cases moved together by x{noise.common:.3g} (the median change: the "
            "reference's own time, or the whole grid); each case is judged relative to that"
        ]
    return []


def _few_rounds_note(out: Comparison) -> None:
    few = sum(1 for line in out.lines if "too few for the U test" in line.test)
    if few:
        out.notes.append(
            f"{few} cases had too few rounds for the U test at p < {out.thresholds.p_value:g} "
            "(it needs e.g. 7 and 7): their p20..p80 bands stood in for it; more rounds (the "
            "suite's min_rounds) let the test judge them"
        )


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def markdown(cmp: Comparison, everything: bool = False) -> str:
    """The comparison as GitHub-flavoured markdown (for a CI job summary)."""
    lines = [
        "## attnbench compare",
        "",
        f"**{cmp.headline()}**",
        "",
        f"- current: `{cmp.current}` {cmp.provenance.get(str(cmp.current), '')}",
        f"- baseline: `{cmp.baseline}` {cmp.provenance.get(str(cmp.baseline), '')}",
        *(f"- re-run: `{p}` {cmp.provenance.get(str(p), '')}" for p in cmp.confirmed_by),
        f"- thresholds: {cmp.describe()}",
    ]
    lines += [f"- warning: {w}" for w in cmp.warnings]
    lines += [f"- note: {n}" for n in cmp.notes]
    shown = cmp.shown(everything)
    if shown:
        lines += [
            "",
            "| case | metric | baseline | current | ratio | p | verdict | note |",
            "|---|---|---|---|---:|---:|---|---|",
        ]
        for ln in shown:
            ratio = f"{ln.ratio:.3f}" if ln.ratio is not None else ""
            p = f"{ln.p_value:.2g}" if ln.p_value is not None else ""
            verdict = f"**{ln.verdict}**" if ln.verdict == "worse" else ln.verdict
            cells = (ln.case, ln.metric, ln.baseline, ln.current, ratio, p, verdict, ln.note)
            lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in cells) + " |")
    return "\n".join(lines) + "\n"


def as_json(cmp: Comparison) -> dict[str, Any]:
    """The comparison as plain data (``attnbench compare --format json``)."""
    return {
        "current": str(cmp.current),
        "baseline": str(cmp.baseline),
        "confirmed_by": [str(p) for p in cmp.confirmed_by],
        "exit_code": cmp.exit_code,
        "headline": cmp.headline(),
        "compared": cmp.compared,
        "counts": {v: cmp.count(v) for v in VERDICT_ORDER},
        "thresholds": asdict(cmp.thresholds),
        "limits": asdict(cmp.limits),
        "provenance": dict(cmp.provenance),
        "warnings": list(cmp.warnings),
        "notes": list(cmp.notes),
        "lines": [asdict(line) for line in cmp.lines],
    }
