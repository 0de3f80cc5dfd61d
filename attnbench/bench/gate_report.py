"""The report of repeated gates (:mod:`attnbench.bench.gate_study`): ``trials.csv`` (one row per
trial) and ``summary.md`` (one row per set of trials: A/A or a slowdown, quiet or loaded), drawn
from the records the trials left (``SET/trial-K/trial.json``) and the study's ``study.json``."""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnbench.runtime.outputs import atomic_open, write_text

STUDY_RECORD = "study.json"
#: The verdicts of one pair compared alone that a trial counts.
VERDICTS = ("worse", "suspect", "unconfirmed", "not judged", "better")
COLUMNS = (
    "set", "trial", "started_utc", "slow", "load", "gate_exit", "verdict", "caught",
    "other_worse", "slowed_cases", "slowed_change_min", "slowed_change_max", "pair_exit_codes",
    "pair_worse", "pair_suspect", "pair_not_judged", "compared", "noise_sigma",
    "loadavg_before_1min", "loadavg_after_1min", "wall_s", "run_wall_s", "neighbours",
    "neighbour_cpu_s", "cpu_signature",
)  # fmt: skip
#: The issue's goals: no false alarm in 10 A/A trials, a slowdown caught in at least 9 of 10.
GOAL_TRIALS = 10


def records(out: Path) -> list[dict[str, Any]]:
    """Every finished trial under ``out``, with its set's name (``aa-quiet``, ...)."""
    found = []
    for path in sorted(out.glob("*/trial-*/trial.json")):
        found.append({"set": path.parent.parent.name, **json.loads(path.read_text())})
    return found


def flat(record: dict[str, Any]) -> dict[str, Any]:
    """A trial's CSV row: its pairs summed (exit codes and sigmas listed), lists as ``a; b``."""
    pairs = record["pairs"]
    row = {k: v for k, v in record.items() if k != "pairs"}
    row |= {
        "pair_exit_codes": [p["exit_code"] for p in pairs],
        "pair_worse": sum(p["worse"] for p in pairs),
        "pair_suspect": sum(p["suspect"] for p in pairs),
        "pair_not_judged": sum(p["not_judged"] for p in pairs),
        "compared": [p["compared"] for p in pairs],
        "noise_sigma": [p["noise_sigma"] for p in pairs],
    }
    return {k: "; ".join(map(str, v)) if isinstance(v, list) else v for k, v in row.items()}


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with atomic_open(path, "w", newline="", what="trials.csv") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(flat(r) for r in rows)


def span(values: Sequence[Any]) -> str:
    """``1.2..3.4`` over the values given (``-`` when none)."""
    known = [v for v in values if v is not None]
    return f"{min(known):g}..{max(known):g}" if known else "-"


def goal(met: bool, n: int) -> str:
    """Whether the goal is met, over at least GOAL_TRIALS trials."""
    return f"only {n} of {GOAL_TRIALS}" if n < GOAL_TRIALS else ("met" if met else "MISSED")


def _walls(rows: Sequence[dict[str, Any]]) -> str:
    walls = [w for r in rows for w in r["run_wall_s"] if w is not None]
    return f"{statistics.median(walls):g}" if walls else "-"


def unslowed_table(rows: Sequence[dict[str, Any]], same_code: bool) -> list[str]:
    """Per set of trials without a slowdown: the gate's verdicts and the pairs compared alone."""
    alarm = "false alarms" if same_code else "regressions"
    out = [
        f"| set | trials | gate passed | gate {alarm} | pairs | pairs exit 1 (compare alone) | "
        "cases worse (compare alone) | suspect | not judged | cases compared | noise sigma | "
        "load avg before | load avg after | run wall s (median) | neighbours | goal (no false "
        "alarm in 10) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|---|---|",
    ]
    for name in sorted({r["set"] for r in rows}):
        of = [r for r in rows if r["set"] == name]
        pairs = [p for r in of for p in r["pairs"]]
        alarms = sum(bool(r["other_worse"]) for r in of)
        out.append(
            f"| {name} | {len(of)} | {sum(r['gate_exit'] == 0 for r in of)} | {alarms} | "
            f"{len(pairs)} | {sum(p['exit_code'] == 1 for p in pairs)} | "
            f"{sum(p['worse'] for p in pairs)} | {sum(p['suspect'] for p in pairs)} | "
            f"{sum(p['not_judged'] for p in pairs)} | {span([p['compared'] for p in pairs])} | "
            f"{span([p['noise_sigma'] for p in pairs])} | "
            f"{span([r['loadavg_before_1min'] for r in of])} | "
            f"{span([r['loadavg_after_1min'] for r in of])} | {_walls(of)} | "
            f"{of[0]['neighbours']} | {goal(alarms == 0, len(of)) if same_code else '-'} |"
        )
    return out


def slowed_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Per set of slowed trials: how often the gate caught the slowdown, what else it flagged."""
    out = [
        "| set | slowed | trials | caught | catch rate | trials with another case worse | "
        "other cases worse | slowed cases | slowed cases read (pair 1) | load avg after | "
        "goal (caught in >= 9 of 10) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for name in sorted({r["set"] for r in rows}):
        of = [r for r in rows if r["set"] == name]
        caught = sum(bool(r["caught"]) for r in of)
        moved = [r["slowed_change_min"] for r in of] + [r["slowed_change_max"] for r in of]
        out.append(
            f"| {name} | {of[0]['slow']} | {len(of)} | {caught} | {caught / len(of):.0%} | "
            f"{sum(bool(r['other_worse']) for r in of)} | "
            f"{sum(len(r['other_worse']) for r in of)} | {span([r['slowed_cases'] for r in of])} | "
            f"x{span(moved)} | {span([r['loadavg_after_1min'] for r in of])} | "
            f"{goal(caught >= 0.9 * len(of), len(of))} |"
        )
    return out


def machine_lines(study: dict[str, Any], rows: Sequence[dict[str, Any]]) -> list[str]:
    m = study["machine"]
    memory = f"{m['memory_bytes'] / 2**30:.0f} GiB" if m.get("memory_bytes") else "?"
    mode = (
        "a baseline is saved for this class: the plain gate compares with it first"
        if study["saved_baseline"]
        else "no baseline saved for this class: the plain gate measures one, as these trials do"
    )
    lines = [
        f"- CPU: {m['cpu_model']}; signature `{m['cpu_signature']}`; {m['logical_cores']} logical "
        f"cores; {memory}; {m['platform']}; torch {m['torch']}",
        f"- gate class `{study['gate_class']}`: {mode}",
    ]
    seen = sorted({r["cpu_signature"] for r in rows})
    if len(seen) > 1:
        lines.append(f"- warning: the trials were made on {len(seen)} CPUs: {'; '.join(seen)}")
    return lines


def summary(study: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    same = study["same_code"]
    base = f"`{study['base']}` ({study['base_sha'][:10]})"
    grid = " ".join([study["suite"], *study["run_args"]])
    plain = [r for r in rows if not r["slow"]]
    slowed = [r for r in rows if r["slow"]]
    lines = [
        "# Does the gate cry wolf, and does it catch a slowdown?",
        "",
        f"Made by `{study['command']}` (`attnbench gate --help`; the study's module docstring, "
        "`attnbench/bench/gate_study.py`, says how). Every trial's runs, logs and comparisons "
        "are under `SET/trial-K/`; one row per trial in `trials.csv`.",
        "",
        f"- base {base} against the current code"
        + (": the same code (A/A), so anything worse is a false alarm" if same else ""),
        f"- each trial: the grid `{grid}`, base and current alternately, {study['pairs']} "
        "pairs, each run in its own process; a regression must show in every pair",
        *machine_lines(study, rows),
        "",
        "## Without a slowdown",
        "",
        *(unslowed_table(plain, same) if plain else ["(no trials)"]),
        "",
        "## An injected slowdown: the current runs' forward of one path made slower",
        "",
        *(slowed_table(slowed) if slowed else ["(no trials)"]),
    ]
    return "\n".join(lines) + "\n"


def write_report(out: Path) -> str:
    """``trials.csv`` and ``summary.md`` over every trial in ``out``; a one-line account."""
    study = json.loads((out / STUDY_RECORD).read_text())
    rows = records(out)
    write_csv(out / "trials.csv", rows)
    write_text(out / "summary.md", summary(study, rows))
    plain = [r for r in rows if not r["slow"]]
    slowed = [r for r in rows if r["slow"]]
    alarm = "false alarms" if study["same_code"] else "regressions"
    parts = []
    if plain:
        alarms = sum(bool(r["other_worse"]) for r in plain)
        parts.append(f"{alarms} {alarm} in {len(plain)} trials")
    if slowed:
        caught = sum(bool(r["caught"]) for r in slowed)
        parts.append(f"slowdown caught in {caught} of {len(slowed)}")
    return f"gate study: {'; '.join(parts) or 'no trials'} ({out / 'summary.md'})"
