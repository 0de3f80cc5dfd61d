"""The history rule: a case that a pair of runs cannot judge (too few rounds a side for the U
test) is judged against its own results history (:mod:`attnbench.bench.history`) when it has
one.

The baseline is the case's history in the current run's environment (machine class, library
versions, suite): its value at each of the last :data:`WINDOW` commits measured there other than
the current run's (each the median of that commit's runs), at least :data:`MIN_COMMITS` of them.
The change is the current value over their median; the noise is their spread, the larger of
1.4826 x the median absolute deviation of their logs and their 10..90 % range / 2.563 (one wild
commit in five widens it rather than being ignored), at least :data:`SIGMA_FLOOR`: each commit
was measured in a process of its own, so that spread is what moves between runs, the noise a
pair must estimate from its other cases. Past that, the rule is the pair's
(:mod:`attnbench.bench.compare`): worse when the change is beyond the floor (1.2x; the
reference's own time 1.4x) and beyond CORROBORATED_Z sigma with another case of the same path
judged so too, or alone beyond SOLO_EFFECT and NOISE_Z sigma; a case alone short of that is
*suspect*, and so is every case whose history scatters so widely that CORROBORATED_Z sigma is
beyond USELESS_NOISE (2x). Like conbench's lookback z-score
(https://github.com/conbench/conbench, "lookback z-score"), with a robust centre and spread.

Each line judged so says it in its ``test`` ("history rule, 12 commits") and its note.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from attnbench.bench.compare.cases import label_of
from attnbench.bench.compare.decision import NOT_JUDGED
from attnbench.bench.compare.records import HISTORY_RULE, Comparison, Line, Thresholds
from attnbench.bench.history.store import (
    DB_NAME,
    History,
    Series,
    case_key,
    env_of,
    matmul_size,
    work_metric,
)
from attnbench.bench.results import read_sidecar
from attnbench.bench.thresholds import (
    CORROBORATED_Z,
    NOISE_Z,
    SOLO_EFFECT,
    USELESS_NOISE,
    WORK_METRIC,
)

#: The commits of history a case is judged against (the most recent, the current one aside).
WINDOW = 20
#: Fewer commits than this: no history verdict (the case stays not judged).
MIN_COMMITS = 5
#: The history's noise is taken as at least this (log units, 1 %): a history of a few identical
#: values would make every small change a regression.
SIGMA_FLOOR = 0.01
#: The 90th percentile of the standard normal: a history's 10..90 % range is 2 x this sigma.
NORMAL_Q90 = 1.2816


@dataclasses.dataclass(frozen=True)
class _Judged:
    index: int  # of the line in the comparison
    change: float
    z: float
    commits: int
    centre: float
    sigma: float


def judge_by_history(
    out: Comparison, current: Path, rows: Mapping[tuple, Mapping[str, Any]], folder: Path
) -> None:
    """Judge ``out``'s lines that the pair could not (too few rounds) against the history in
    ``folder``; ``rows``: the current run's rows by key. Adds a note saying how many it judged
    and why others stay unjudged."""
    undecided = [i for i, line in enumerate(out.lines) if line.verdict == NOT_JUDGED]
    if not undecided:
        return
    if not (Path(folder) / DB_NAME).is_file():
        out.notes.append(f"no results history in {folder} yet: the history rule judged nothing")
        return
    side = read_sidecar(current)
    commit = str(((side or {}).get("git") or {}).get("sha") or "")
    by_label = {label_of(row): row for row in rows.values()}
    with History(folder) as history:
        past = _histories(history, [by_label[out.lines[i].case] for i in undecided], side)
    judged, short = [], 0
    for i in undecided:
        line, row = out.lines[i], by_label[out.lines[i].case]
        found = past.get((case_key(row), _series_metric(line, row, side)))
        values = _before(found, commit) if found else []
        if len(values) < MIN_COMMITS:
            short += 1
            continue
        judged.append(_measure(i, _value(line, row), values))
    for item in judged:
        line = out.lines[item.index]
        out.lines[item.index] = _verdict(line, item, judged, out.lines, out.thresholds)
    _notes(out, folder, len(judged), short)


def _histories(history: History, rows, side) -> dict[tuple[str, str], Series]:
    """The series of ``rows``' cases in their environments, by (case key, metric)."""
    envs = {env_of(row, side) for row in rows}
    return {(s.key, s.metric): s for env in envs for s in history.series("auto", env)}


def _before(series: Series, commit: str) -> list[float]:
    """The last WINDOW values of ``series`` at commits other than ``commit`` (the current)."""
    pairs = zip(series.commits, series.values, strict=True)
    return [v for c, v in pairs if c.removesuffix("-dirty") != commit][-WINDOW:]


def _kind(line: Line) -> str:
    return "reference" if line.metric == WORK_METRIC else "ratio"


def _series_metric(line: Line, row: Mapping[str, Any], side) -> str:
    """The history's name of the line's metric (the reference's: at the current matmul size)."""
    if _kind(line) == "ratio":
        return line.metric
    return work_metric(matmul_size(side, str(row["dtype"])))


def _value(line: Line, row: Mapping[str, Any]) -> float:
    """The current run's value of the line's metric: the ratio to the reference, or (the
    reference's own line) the time in units of matmul work."""
    if _kind(line) == "ratio":
        return float(row["ref_ratio"])
    return float(row["time_median_ms"]) * float(row["matmul_flop_per_s"]) / 1e12


def _measure(index: int, value: float, past: list[float]) -> _Judged:
    """The current ``value`` against ``past``: its change from their median, in their sigma."""
    logs = np.log(np.asarray(past))
    centre = float(np.median(logs))
    mad = 1.4826 * float(np.median(np.abs(logs - centre)))
    low, high = np.quantile(logs, [0.1, 0.9])
    sigma = max(mad, float(high - low) / (2 * NORMAL_Q90), SIGMA_FLOOR)
    change = math.log(value) - centre
    return _Judged(index, math.exp(change), change / sigma, len(past), math.exp(centre), sigma)


def _floor(line: Line, th: Thresholds) -> float:
    return th.ref_time_ratio if line.metric == WORK_METRIC else th.min_effect


def _side(line: Line, item: _Judged, th: Thresholds) -> int:
    """1 (-1) when beyond the floor and CORROBORATED_Z sigma slower (faster), else 0."""
    floor = _floor(line, th)
    if item.change > floor and item.z > CORROBORATED_Z:
        return 1
    return -1 if item.change < 1 / floor and item.z < -CORROBORATED_Z else 0


def _verdict(line: Line, item: _Judged, judged, lines, th: Thresholds) -> Line:
    side = _side(line, item, th)
    others = sum(
        1
        for other in judged
        if other is not item
        and lines[other.index].impl == line.impl
        and _kind(lines[other.index]) == _kind(line)
        and _side(lines[other.index], other, th) == side
    )
    how = (
        f"x{item.change:.3f} against the median of its last {item.commits} commits in the "
        f"history (sigma {item.sigma:.3f}, {item.z:+.1f} sigma)"
    )
    if side == 0:
        verdict = "same"
    elif math.exp(CORROBORATED_Z * item.sigma) > USELESS_NOISE:
        verdict = "suspect" if side > 0 else "same"
        how += "; but its history scatters too widely to show a regression"
    elif others:
        verdict = "worse" if side > 0 else "better"
        how += f", with {others} other case{'s' * (others > 1)} of {line.impl}"
    elif side > 0 and item.change > SOLO_EFFECT and item.z > NOISE_Z:
        verdict = "worse"
    else:
        verdict = "suspect" if side > 0 else "same"
        how += f"; one case of {line.impl} alone" if side > 0 else ""
    return dataclasses.replace(
        line,
        baseline=f"{item.centre:.3f} (history)",
        ratio=item.change,
        verdict=verdict,
        note=f"{HISTORY_RULE}: {how}; the pair: {line.note}",
        test=f"{HISTORY_RULE}, {item.commits} commits",
    )


def _notes(out: Comparison, folder: Path, judged: int, short: int) -> None:
    if judged:
        out.notes.append(
            f"{judged} cases too few rounds for the U test were judged by the {HISTORY_RULE}: "
            f"against the median of their last {WINDOW} commits or fewer in the results "
            f"history {folder} (same machine class, versions and suite)"
        )
    if short:
        out.notes.append(
            f"{short} cases too few rounds for the U test have fewer than {MIN_COMMITS} commits "
            f"of history in {folder}: not judged"
        )
