"""The decision on one time quantity: conditions 1 and 2 (:func:`judge`: the U test and the
floor, or the threshold rule) and condition 3 (:func:`weigh_noise`: beyond the noise, with another
case of the path). See :mod:`attnbench.bench.compare`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnbench.bench.compare.records import Limits, Line, Noise, Thresholds
from attnbench.bench.compare.statistics import mann_whitney_u, smallest_p, too_noisy
from attnbench.bench.thresholds import CORROBORATED_Z, NOISE_Z, SOLO_EFFECT, WORK_METRIC


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


def judge(
    base: Timing,
    cur: Timing,
    floors: tuple[float, float],
    th: Thresholds,
    separation: bool,
    centre: float = 1.0,
) -> tuple[str, float, float | None, str, str]:
    """(verdict, change, p, test, note) of one time quantity on conditions 1 and 2: the U test
    on the per-round samples when both sides have enough (beyond ``floors[0]``); with samples
    too few for it, *not judged*; without samples (older results, the committed baselines), the
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
        # Too few rounds for the test to establish anything at this p: not judged. A band rule
        # stood in here once; on two default runs of a quiet 2-core machine it called 4
        # unchanged cases regressions (3 rounds a side: the bands of 3 samples are the samples).
        note = f"{change:.3f}x; {m}+{n} rounds: {TOO_FEW}"
        return NOT_JUDGED, change, None, f"{m}+{n} rounds", note
    else:
        change = own = cur.median / base.median
        rule = RULE
    up = (not separation or cur.p20 > base.p80, own > floor_rule)
    down = (not separation or cur.p80 < base.p20, own < 1 / floor_rule)
    note = "beyond the threshold but within the noise bands" if up[1] and not up[0] else ""
    return _verdict(up, down), change, None, rule, note


#: How a line is judged without samples: the rule the CI baselines were tuned with, as it was.
RULE = "threshold rule"
#: A time line whose runs have samples, but too few rounds for the U test to reach p_value.
NOT_JUDGED = "not judged"
TOO_FEW = "too few for the U test"


def _verdict(up: tuple[bool, bool], down: tuple[bool, bool]) -> str:
    return "worse" if all(up) else ("better" if all(down) else "same")


def _kind(line: Line) -> str:
    return "reference" if line.metric == WORK_METRIC else "ratio"


def _noise(line: Line, limits: Limits) -> Noise:
    return limits.noise_reference if _kind(line) == "reference" else limits.noise


def _moved(line: Line, limits: Limits, z: float) -> bool:
    """Whether a worse (better) line is above (below) its group's change by z sigma."""
    side = 1 if line.verdict == "worse" else -1
    return _noise(line, limits).beyond(line.ratio, z, line.group) == side


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
