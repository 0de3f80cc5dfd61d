"""Two results files: read, checked for being comparable, matched case by case, weighed against
the comparison's noise, and confirmed by re-runs. See :mod:`attnbench.bench.compare`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.bench.compare.cases import (
    compare_rows,
    group_of,
    keyed,
    label_of,
    machine_of,
    missing,
    uses_ref_ratio,
    work_timing,
)
from attnbench.bench.compare.decision import NOT_JUDGED, weigh_noise
from attnbench.bench.compare.history_rule import judge_by_history
from attnbench.bench.compare.records import Comparison, Line, Noise, Thresholds
from attnbench.bench.compare.statistics import limits_for, smallest_p, too_noisy
from attnbench.bench.results import read_results, read_samples, read_sidecar
from attnbench.bench.thresholds import CORROBORATED_Z, SETUP_COLUMNS
from attnbench.core.errors import AttnbenchError


def compare(
    current: Path,
    baseline: Path,
    thresholds: Thresholds | None = None,
    confirm: Sequence[Path] = (),
    history: Path | None = None,
) -> Comparison:
    """Compare two results CSVs (see :mod:`attnbench.bench.compare`); ``confirm``: re-runs of
    the same grid that a regression must repeat in; ``history``: a results history folder that
    judges the cases with too few rounds for the U test (:mod:`.history_rule`). Raises
    AttnbenchError on bad input (re-runs included, whether or not they are needed)."""
    th = thresholds or Thresholds()
    current, baseline, confirm = Path(current), Path(baseline), [Path(p) for p in confirm]
    for path in confirm:
        read_measured(path, lambda _: None)
    out = _compare(current, baseline, th, history)
    if confirm and (out.count("worse") or out.count("suspect")):
        reruns = [_compare(path, baseline, th, history) for path in confirm]
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
    cur, base = (_matmul_sizes(side) for side in sides)
    if any(cur.get(dtype) != size for dtype, size in base.items() if dtype in cur):
        out.append(
            f"the roofline's matmul differs from the baseline's (sized by timing.matmul_max_s; "
            f"baseline {base}, this run {cur}): times in units of matmul work, the reference's "
            "own included, do not compare"
        )
    return out


def _matmul_sizes(side: Mapping[str, Any]) -> dict[str, Any]:
    """dtype -> the matmul size(s) a run's sidecar records (a run sizes its matmul by time)."""
    calibration = side.get("calibration") or {}
    return {
        str(dtype).removeprefix("torch."): cal.get("matmul_size")
        for dtype, cal in calibration.items()
        if isinstance(cal, Mapping)
    }


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
        if not missing(b["matmul_flop_per_s"]) and not missing(c["matmul_flop_per_s"]):
            work.append((group_of(c), work_timing(c, None).median / work_timing(b, None).median))
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


def _compare(current: Path, baseline: Path, th: Thresholds, history: Path | None) -> Comparison:
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
    cur, base = keyed(cur_df, current), keyed(base_df, baseline)
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
    if history is not None:
        judge_by_history(out, current, cur, history)
    _unmatched(out, cur, base)
    _few_rounds_note(out)
    out.notes.extend(noise_notes(out.limits.noise))
    return out


def _unmatched(out: Comparison, cur: dict, base: dict) -> None:
    for key, c in cur.items():
        if key not in base:
            out.lines.append(Line(label_of(c), "case", "-", c["status"], None, "new"))
    for key, b in base.items():
        if key not in cur:
            out.lines.append(Line(label_of(b), "case", b["status"], "-", None, "missing"))
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
    """Say how many time lines were not judged (too few rounds for the U test), and how many
    rounds a side would let the test judge them."""
    few = [line for line in out.lines if line.verdict == NOT_JUDGED]
    if not few:
        return
    least = min(int(part) for line in few for part in line.test.split()[0].split("+"))
    needed = next(r for r in range(2, 64) if smallest_p(r, r) < out.thresholds.p_value)
    out.notes.append(
        f"{len(few)} cases not judged on time: as few as {least} rounds a side, and the U test "
        f"at p < {out.thresholds.p_value:g} needs {needed} and {needed}; re-run both as the ci "
        f"suite runs (--suite ci, or --threads 1 --set timing.clock=cpu --set "
        f"timing.retain_memory=true --set timing.min_rounds={needed}): more rounds alone left "
        f"one path 2x apart between two processes of the same code in an A/A test"
    )
