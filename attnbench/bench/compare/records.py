"""What a comparison is made of: its thresholds, the noise it measured, its lines (the rules:
:mod:`attnbench.bench.compare`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.bench.thresholds import (
    CORROBORATED_Z,
    EXIT_NOTHING,
    EXIT_OK,
    EXIT_REGRESSION,
    MEM_SLACK_BYTES,
    MEM_TOLERANCE,
    MEM_TOLERANCE_OTHER,
    MIN_EFFECT,
    NOISE_Z,
    P_VALUE,
    REF_TIME_RATIO,
    SOLO_EFFECT,
    TIME_RATIO,
    VERDICT_ORDER,
)


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


#: The ``test`` of a line judged against the results history (:mod:`.history_rule`).
HISTORY_RULE = "history rule"


@dataclass(frozen=True)
class Line:
    """One compared quantity of one case."""

    case: str
    metric: str
    baseline: str
    current: str
    ratio: float | None
    verdict: (
        str  # worse | unconfirmed | suspect | better | same | new | missing | not judged | not run
    )
    note: str = ""
    p_value: float | None = None  # the U test's one-sided p (current slower), when tested
    test: str = ""  # "U test 9+9 rounds" | "threshold rule" | "history rule, 12 commits" | ""
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
        for v in ("unconfirmed", "suspect", "better", "new", "missing", "not judged"):
            if self.count(v):
                parts.append(f"{self.count(v)} {v}")
        by_history = {line.case for line in self.lines if line.test.startswith(HISTORY_RULE)}
        if by_history:
            parts.append(f"{len(by_history)} judged by the {HISTORY_RULE}")
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
