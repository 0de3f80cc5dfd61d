"""What ``attnbench report`` writes: ``accuracy_vs_cost.csv`` (the joined table, one line per
row, length and machine, floors included), one figure per machine and ``report.md`` (the
mapping, the joined table per length, the floors, the shape notes and the not-joined list).

Every file is written whole or not at all (:mod:`attnbench.runtime.outputs`), after both inputs
were read and joined, so bad input writes nothing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnbench.bench.results import files_read
from attnbench.costreport import figure
from attnbench.costreport.join import Floor, NotJoined, Point, Report
from attnbench.costreport.mapping import mapping_lines
from attnbench.costreport.tables import (
    EXTRAPOLATION_CSV,
    EXTRAPOLATION_SIDECAR,
    SPEED_CSV,
    Extrapolation,
    Speed,
)
from attnbench.runtime.outputs import ensure_dir, refuse_to_replace, write_csv, write_text
from attnbench.runtime.portable import portable

CSV_NAME, REPORT_NAME, FIGURE_STEM = "accuracy_vs_cost.csv", "report.md", "accuracy_vs_cost"

#: The joined CSV's columns, in order.
CSV_COLUMNS = (
    "machine", "eval_len", "train_len", "variant", "kind", "role", "seeds", "accuracy_mean",
    "accuracy_low", "accuracy_high", "mechanism", "path", "params", "last_layer", "time_factor",
    "direction",
    "batch", "heads", "head_dim", "dtype", "time_ms", "time_per_token_ns", "memory_bytes",
    "memory_per_token_bytes", "pareto", "reason",
)  # fmt: skip

INT_COLUMNS = ("eval_len", "train_len", "seeds", "batch", "heads", "head_dim")

DIRECTION_TEXT = {
    "fwd": "forward time (the report's use is inference at length n)",
    "fwdbwd": "forward + backward time (a training step's attention at length n)",
}


@dataclass(frozen=True)
class Written:
    """The files written, and the lines to show on the terminal (shape notes, not joined)."""

    paths: list[Path]
    notes: list[str]


def write_report(
    report: Report,
    extrapolation: Extrapolation,
    speed: Speed,
    out: Path,
    command: str,
    fmt: str = "png",
    overwrite: bool = False,
) -> Written:
    """Write the CSV, the figures and ``report.md`` into ``out`` (made if needed); an earlier
    report's files there are replaced only with ``overwrite``."""
    csv_path = out / CSV_NAME
    figure_paths = {
        machine: out / f"{_figure_stem(report, machine)}.{fmt}"
        for machine in report.machines
        if any(p.machine == machine for p in report.points)
    }
    read = [extrapolation.folder / name for name in (EXTRAPOLATION_CSV, EXTRAPOLATION_SIDECAR)]
    refuse_to_replace(
        [csv_path, *figure_paths.values(), out / REPORT_NAME], option="--out", folder=out,
        inputs=read + files_read(speed.folder / SPEED_CSV), overwrite=overwrite,
    )  # fmt: skip
    ensure_dir(out, "--out folder")
    write_csv(joined_frame(report), csv_path, index=False, float_format="%.6g")
    figures = [
        figure.draw(report, machine, path, _figure_title(report, machine))
        for machine, path in figure_paths.items()
    ]
    text = markdown(report, extrapolation, speed, portable(command, out), figures, out)
    write_text(out / REPORT_NAME, text)
    notes = [f"note: {line}" for line in report.mismatches]
    notes += [f"not joined: {line}" for line in not_joined_lines(report.not_joined)]
    return Written([csv_path, *figures, out / REPORT_NAME], notes)


def _figure_stem(report: Report, machine: str) -> str:
    """``accuracy_vs_cost``, or with one figure per machine ``accuracy_vs_cost-<machine>``."""
    return FIGURE_STEM if len(report.machines) == 1 else f"{FIGURE_STEM}-{_slug(machine)}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "machine"


def _figure_title(report: Report, machine: str) -> str:
    m = report.model
    return (
        f"MLM accuracy against attention cost, trained at L = {m.train_len} (preset "
        f"{m.preset or '?'}); {machine}, {report.direction}"
    )


# --------------------------------------------------------------------------------------------
# The CSV
# --------------------------------------------------------------------------------------------


def joined_frame(report: Report) -> pd.DataFrame:
    """One line per joined point, then one per floor (``role`` says which)."""
    lines = [_point_line(p, report) for p in report.points]
    lines += [_floor_line(f, report) for f in report.floors]
    frame = pd.DataFrame(lines, columns=list(CSV_COLUMNS))
    for column in INT_COLUMNS:  # whole numbers stay whole beside the floors' empty cells
        frame[column] = frame[column].astype("Int64")
    frame["pareto"] = frame["pareto"].map({True: "true", False: "false"}).fillna("")
    return frame


def _point_line(p: Point, report: Report) -> dict:
    m = p.measured
    return {
        "machine": p.machine,
        "eval_len": p.eval_len,
        "train_len": report.model.train_len,
        "variant": p.variant,
        "kind": p.kind,
        "role": "point",
        "seeds": p.accuracy.seeds,
        "accuracy_mean": p.accuracy.mean,
        "accuracy_low": p.accuracy.low,
        "accuracy_high": p.accuracy.high,
        "mechanism": p.cost.mechanism,
        "path": p.cost.path,
        "params": p.cost.params,
        "last_layer": p.cost.last_layer.impl if p.cost.last_layer else "",
        "time_factor": p.cost.time_factor,
        "direction": report.direction,
        "batch": m["batch"],
        "heads": m["heads"],
        "head_dim": m["head_dim"],
        "dtype": m["dtype"],
        "time_ms": m["time_ms"],
        "time_per_token_ns": p.time_per_token_ns,
        "memory_bytes": m["memory_bytes"],
        "memory_per_token_bytes": p.memory_per_token_bytes,
        "pareto": p.pareto,
        "reason": p.cost.reason,
    }


def _floor_line(f: Floor, report: Report) -> dict:
    return {
        "eval_len": f.eval_len,
        "train_len": report.model.train_len,
        "variant": f.variant,
        "kind": "baseline",
        "role": "floor",
        "seeds": 0,
        "accuracy_mean": f.accuracy.mean,
        "reason": "no model and no attention: the count floor",
    }


# --------------------------------------------------------------------------------------------
# report.md
# --------------------------------------------------------------------------------------------


def markdown(
    report: Report,
    extrapolation: Extrapolation,
    speed: Speed,
    command: str,
    figures: list[Path],
    out: Path,
) -> str:
    m = report.model
    lines = [
        "# Accuracy beyond the training length against its attention cost",
        "",
        f"Made by: `{command}`",
        "",
        *_inputs(report, extrapolation, speed, out),
        "",
        f"Cost: the speed CSV's {DIRECTION_TEXT[report.direction]} of one bidirectional "
        "attention call of the registry path that computes the row's attention (the mapping "
        "below), divided by the call's batch x n tokens; peak memory of that call likewise per "
        "token. One attention call, not the model: the projections and FFN are the same for "
        "every row, except GAU and FLASH, whose model stacks twice as many layers and no FFN. "
        "Accuracy: masked-token accuracy (%), mean over seeds with its 95 % t-interval "
        "(Student's t, k - 1 degrees of freedom); a count row has no seed: its single value, "
        "drawn as the floor.",
        "",
        *[f"![accuracy against cost]({f.name})" for f in figures],
        "",
        "## Shape of the speed cases",
        "",
        *(
            [f"- {line}" for line in report.mismatches]
            or [
                f"Every speed case joined was measured at the shape the model's layer runs "
                f"(heads {m.heads} x head dim {m.head_dim}, or GAU/FLASH's one head of width "
                f"s), {m.dtype}."
            ]
        ),
        "",
        *_joined_sections(report),
        "## Not joined",
        "",
        *([f"- {line}" for line in not_joined_lines(report.not_joined)] or ["None."]),
        "",
        "## The rows and their cost",
        "",
        *_costs_table(report),
        "",
        "## The mapping (attnbench/costreport/mapping.py)",
        "",
        "Evaluation-time tricks compose with `+`: a row is costed by its one trick that is not "
        "a rescaling (logn, temperature, yarn, ntk, pi), dense SDPA when all are. Parameters in "
        "braces are the run's: L, and the evaluation windows "
        f"(local_window = {m.local_window}, rerope_window = {m.rerope_window} here).",
        "",
        "| row | cost path | parameters | time x | why |",
        "|---|---|---|---:|---|",
        *[f"| {' | '.join(cells)} |" for cells in mapping_lines()],
        "",
    ]
    return "\n".join(lines)


def _inputs(report: Report, extrapolation: Extrapolation, speed: Speed, out: Path) -> list[str]:
    m = report.model
    suites = ", ".join(sorted(set(speed.rows["suite"]))) or "?"
    threads = ", ".join(str(t) for t in sorted(set(speed.rows["threads"].dropna()))) or "?"
    return [
        f"- Extrapolation: `{portable(str(extrapolation.folder), out)}`: preset "
        f"{m.preset or '?'}, trained at L = {m.train_len}, d_model {m.d_model}, {m.heads} heads "
        f"of {m.head_dim}, evaluated at n = {', '.join(map(str, report.lengths))}.",
        f"- Speed: `{portable(str(speed.folder), out)}`: suite {suites}, on "
        f"{'; '.join(report.machines)}, {threads} thread(s).",
    ]


def _joined_sections(report: Report) -> list[str]:
    lines = []
    for machine in report.machines:
        for n in report.lengths:
            points = [p for p in report.points if p.machine == machine and p.eval_len == n]
            floors = [f for f in report.floors if f.eval_len == n]
            if not points and not floors:
                continue
            where = f", {machine}" if len(report.machines) > 1 else ""
            lines += [f"## {figure.panel_title(n, report.model.train_len)}{where}", ""]
            lines += _points_table(points)
            lines += [f"Floor (no model): {f.variant} {f.accuracy.text()}." for f in floors]
            lines += [""]
    return lines


def _points_table(points: list[Point]) -> list[str]:
    if not points:
        return ["No row joined at this length.", ""]
    lines = [
        "| row | kind | accuracy % [95 %] | seeds | cost path | time / token (ns) "
        "| memory / token (B) | Pareto |",
        "|---|---|---:|---:|---|---:|---:|:---:|",
    ]
    for p in points:
        factor = f" x {p.cost.time_factor:g}" if p.cost.time_factor != 1 else ""
        lines.append(
            f"| {p.variant} | {p.kind} | {p.accuracy.text()} | {p.accuracy.seeds} | "
            f"{p.cost.describe()}{factor} | {p.time_per_token_ns:.3g} | "
            f"{_bytes(p.memory_per_token_bytes)} | {'yes' if p.pareto else ''} |"
        )
    return [*lines, ""]


def _bytes(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def _costs_table(report: Report) -> list[str]:
    if not report.costs:
        return ["No row has a cost."]
    lines = ["| row | cost path | parameters | time x | why |", "|---|---|---|---:|---|"]
    for variant, cost in report.costs.items():
        lines.append(
            f"| {variant} | {cost.describe()} | {cost.params or '-'} | {cost.time_factor:g} | "
            f"{cost.reason} |"
        )
    return lines


def not_joined_lines(items: tuple[NotJoined, ...]) -> list[str]:
    """``O+hwfa (every n): no mapping entry ...``; one line per row and reason, its lengths
    gathered."""
    grouped: dict[tuple[str, str], list[int | None]] = {}
    for item in items:
        grouped.setdefault((item.variant, item.reason), []).append(item.eval_len)
    lines = []
    for (variant, reason), lengths in grouped.items():
        where = (
            "every n"
            if None in lengths
            else "n = " + ", ".join(str(n) for n in sorted(n for n in lengths if n is not None))
        )
        lines.append(f"{variant} ({where}) because {reason}")
    return lines
