"""What ``attnbench run speed`` and ``attnbench merge`` print: a sweep's progress (the events of
:mod:`attnbench.runtime.progress` drawn as one plain line per case, or a rich bar when stderr is
a terminal) and the end-of-run summary (a table, or JSON), its warnings and figures."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from attnbench.cli.common import bar_width, err, out, short_reason
from attnbench.cli.inference_report import inference_json, print_inference
from attnbench.core.errors import AttnbenchError

if TYPE_CHECKING:  # the benchmark (torch) is imported when the command runs, not for --help
    from attnbench.bench.summary import SpeedRun


def _ms(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _num(x: Any, fmt: str = "{:.2f}") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    try:
        return fmt.format(float(x))
    except (TypeError, ValueError):
        return "-"


def _mib(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    try:
        return f"{float(x) / 2**20:.3g}"
    except (TypeError, ValueError):
        return "-"


def row_line(row: Mapping[str, Any]) -> str:
    """One plain line per case, for logs: ``softmax:efficient fwd bidir n=1024 ok 4.7 ms x1.00``."""
    tag = "causal" if row["causal"] else "bidir"
    head = f"{row['mechanism']}:{row['path']} {row['direction']} {tag} n={row['seq_len']}"
    if row["status"] != "ok":
        return f"{head} {row['status']}: {row['reason']}"
    ratio = row.get("ref_ratio")
    rel = f" x{ratio:.2f} ref" if ratio is not None else ""
    noisy = " (noisy)" if row.get("noisy") else ""
    return f"{head} ok {_ms(row['time_median_ms'])} ms{rel}{noisy}"


class SweepLines:
    """The sweep's progress as one line per finished case on stderr (when stderr is not a
    terminal: CI logs)."""

    def __init__(self) -> None:
        self.total = 0

    def start(self, title: str, total: int, completed: int = 0) -> None:
        self.total = total
        typer.echo(f"{title}: {total} cases", err=True)

    def stage(self, label: str) -> None:
        typer.echo(f"{label}: warm-up, memory, then timed rounds", err=True)

    def advance(self, completed: int, **fields: Any) -> None:
        typer.echo(f"[{completed}/{self.total}] {row_line(fields['row'])}", err=True)

    def note(self, text: str) -> None:
        typer.echo(f"  {text}", err=True)

    def warning(self, text: str) -> None:
        typer.echo(f"warning: {text}", err=True)

    def finish(self) -> None: ...


class SweepBar:
    """The sweep's progress as a bar (cases done / planned) with the group and round being
    timed. The title is a line of its own above the bar, and the bar narrows on a narrow
    terminal: at 80 columns a title in the bar's row and a 40-column bar left no room, and
    rich cut every field, the counts and the time included."""

    def __init__(self, console: Console | None = None) -> None:
        console = console or err
        self.bar_width = bar_width(console.width)
        self.where_column = Column(no_wrap=True, overflow="ellipsis")
        self.progress = Progress(
            BarColumn(bar_width=self.bar_width),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[where]}", table_column=self.where_column),
            console=console,
            transient=False,
        )
        self.task = None
        self.where = ""

    def start(self, title: str, total: int, completed: int = 0) -> None:
        # The group and round fill what the bar, "done/total" and the time leave of the line.
        numbers = self.bar_width + 2 * len(str(total)) + 1 + 7 + 3
        self.where_column.max_width = max(10, self.progress.console.width - numbers)
        self.progress.console.print(f"[bold]{escape(title)}[/bold]", soft_wrap=True)
        self.progress.start()
        self.task = self.progress.add_task(title, total=total, completed=completed, where="")

    def stage(self, label: str) -> None:
        self.where = label
        self.progress.update(self.task, where=label)

    def advance(self, completed: int, **fields: Any) -> None:
        self.progress.update(self.task, completed=completed)
        row = fields["row"]
        if row["status"] in ("oom", "error"):
            self.progress.console.print(f"[yellow]{escape(row_line(row))}[/yellow]")

    def note(self, text: str) -> None:
        self.progress.update(self.task, where=f"{self.where} {text}".strip())

    def warning(self, text: str) -> None:
        self.progress.console.print(f"[yellow]warning:[/yellow] {escape(text)}", soft_wrap=True)

    def finish(self) -> None:
        self.progress.stop()


#: The summary's columns, from the most to the least needed: a narrow terminal drops the last
#: ones (they stay in --format json and in results.csv), never cuts a mechanism's name.
SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("impl", "left"),
    ("n", "right"),
    ("ms", "right"),
    ("x ref", "right"),
    ("time exp", "right"),
    ("MiB fwd", "right"),
    ("ok", "right"),
    ("series", "left"),
    ("% mm", "right"),
    ("mem exp fwd", "right"),
    ("MiB fwd+bwd", "right"),
    ("mem exp fwd+bwd", "right"),
    ("not ok", "left"),
)


def summary_cells(r: Mapping[str, Any]) -> dict[str, str]:
    unreliable = r.get("time_exp") is None and r.get("time_exp_note")
    return {
        "impl": escape(r["impl"]),
        "ok": r["ok"],
        "not ok": r["other"] or "",
        "series": r.get("series", "-"),
        "n": str(r.get("n", "-")),
        "ms": _ms(r.get("ms")),
        "x ref": _num(r.get("ref_ratio")),
        "% mm": _num(r.get("roofline"), "{:.0%}"),
        "time exp": "?" if unreliable else _num(r.get("time_exp")),
        "mem exp fwd": _num(r.get("mem_exp")),
        "mem exp fwd+bwd": _num(r.get("mem_bwd_exp")),
        "MiB fwd": _mib(r.get("mem_fwd")),
        "MiB fwd+bwd": _mib(r.get("mem_fwdbwd")),
    }


def fitting_columns(rows: list[dict[str, str]], width: int) -> list[tuple[str, str]]:
    """As many of SUMMARY_COLUMNS as fit in ``width`` (3 characters of border per column)."""
    chosen, used = [], 1
    for name, justify in SUMMARY_COLUMNS:
        need = max(len(name), *(len(r[name]) for r in rows)) + 3
        if chosen and used + need > width:
            break
        chosen.append((name, justify))
        used += need
    return chosen


def print_table(cells: list[dict[str, str]], wall_s: float) -> None:
    """The summary table: as many columns as fit the terminal (:func:`fitting_columns`)."""
    columns = fitting_columns(cells, out.width)
    table = Table(
        title=f"speed summary ({wall_s:.0f} s; at each impl's largest n)",
        caption="x ref: time / reference in the same rounds; % mm: share of the measured matmul "
        "FLOP/s; exp: fitted slope of log time / log memory vs log n ('?': not a reliable "
        "trend, see time_note in complexity.csv)",
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name == "impl")
    for c in cells:
        table.add_row(*(c[name] for name, _ in columns))
    out.print(table)
    if len(columns) < len(SUMMARY_COLUMNS):
        out.print("[dim]more columns: a wider terminal, --format json, or results.csv[/dim]")


def print_summary(run: SpeedRun, figures: list[Path] | None = None) -> None:
    """The end-of-run table on stdout, then the matmul rate, row counts and files written. Paths
    that ran nowhere here (all unsupported: CUDA paths on a CPU) are folded into one line."""
    from attnbench.bench.summary import summary_rows

    rows = summary_rows(run)
    ran = [r for r in rows if not r["ok"].startswith("0/")]
    never = [r for r in rows if r["ok"].startswith("0/")]
    inference = print_inference(run)  # decoding and packed batches: their own tables
    if ran:
        print_table([summary_cells(r) for r in ran], run.wall_s)
    elif not inference:  # no table: an empty one squeezed its title and caption into one column
        out.print(f"speed summary ({run.wall_s:.0f} s): no case was measured", highlight=False)
    if never:
        impls = {r["impl"] for r in never}
        reasons = sorted(
            {
                short_reason(str(row["reason"]))
                for row in run.rows
                if f"{row['mechanism']}:{row['path']}" in impls and row.get("reason")
            }
        )
        out.print(
            f"not run here, {len(never)} paths ({'; '.join(reasons) or 'no ok row'}): "
            + escape(", ".join(r["impl"] for r in never))
        )
    for dtype, cal in run.calibration.items():
        shape, note = matmul_shape(cal)
        out.print(
            f"matmul {shape} {dtype}, timed in every group's rounds: "
            f"{cal['flop_per_s_median'] / 1e9:.1f} GFLOP/s median "
            f"({cal['flop_per_s_min'] / 1e9:.1f}..{cal['flop_per_s_max'] / 1e9:.1f} over "
            f"{cal['groups']} groups; the roofline's denominator{note})"
        )
    counts = ", ".join(f"{n} {s}" for s, n in run.counts.items())
    out.print(f"rows: {counts or 'none'}")
    if run.warnings:
        out.print(f"{warnings_line(run)}", highlight=False)
    warn_about(run)
    out.print(f"wrote {run.csv}, {run.complexity}, {run.sidecar}")
    if run.kernels is not None:
        print_profiles(run.kernels, run.profiled)
    if figures:
        out.print(f"figures: {figures[0].parent}/ ({', '.join(p.name for p in figures)})")


#: Profiled cases listed in the summary at most (the rest: kernels.csv).
PROFILES_SHOWN = 24


def print_profiles(path: Path, profiled: int) -> None:
    """Each profiled case in one line: its busy and wall time per call and its three largest
    kernels (operators on the CPU) with their shares; the whole table is in ``path``."""
    from attnbench.bench.profiles import top_entries

    cases = top_entries(path) if path.is_file() else []
    for label, busy, wall, top in cases[:PROFILES_SHOWN]:
        kernels = ", ".join(f"{_short(name)} {share:.0%}" for name, share in top)
        out.print(f"  {escape(label)}: busy {busy:.0f} of {wall:.0f} us a call; {escape(kernels)}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    more = f" (the first {PROFILES_SHOWN} above)" if len(cases) > PROFILES_SHOWN else ""
    out.print(f"kernel profiles of {profiled} cases this run{more}: {path}", highlight=False)


def _short(name: str, width: int = 60) -> str:
    """A kernel's name cut in the middle for a line (a library kernel's C++ name runs to
    hundreds of characters; its start and end tell kernels apart)."""
    if len(name) <= width:
        return name
    half = (width - 1) // 2
    return name[:half] + "\u2026" + name[-half:]


def warnings_line(run: SpeedRun) -> str:
    """How many warnings of torch and the libraries the run kept out of the terminal, and where."""
    plural = "s" if run.warnings != 1 else ""
    return f"{run.warnings} warning{plural} of torch and the libraries: {run.warnings_file}"


def matmul_shape(cal: Mapping[str, Any]) -> tuple[str, str]:
    """The matmul's shape (``512^3``; ``256^3/512^3`` when merged units kept different sizes)
    and, when a call of the suite's size took too long here, a note saying so."""
    sizes = cal["matmul_size"] if isinstance(cal["matmul_size"], list) else [cal["matmul_size"]]
    most = cal.get("matmul_size_max")
    smaller = most is not None and any(size != most for size in sizes)
    note = f"; sized down from {most}^3 by timing.matmul_max_s" if smaller else ""
    return "/".join(f"{size}^3" for size in sizes), note


def warn_about(run: SpeedRun) -> None:
    """On stderr: noisy timings, and what an interrupted run did not measure."""
    from attnbench.bench.summary import describe_not_run

    if run.noisy:
        err.print(
            f"[yellow]warning:[/yellow] {run.noisy} of {len(run.rows)} timings are noisy "
            "(p20..p80 spread > 10% of the median); the machine was busy: compare ratios, "
            "or re-run with more --rounds"
        )
    if run.busy:
        err.print(f"[yellow]warning:[/yellow] during the run, {escape(run.busy)}", soft_wrap=True)
    if run.interrupted:
        err.print(f"[yellow]interrupted:[/yellow] not run: {describe_not_run(run.not_run)}")


#: summary_rows' keys -> the JSON summary's (the table's columns, spelled out).
JSON_KEYS = {
    "impl": "impl",
    "other": "not_ok",
    "series": "series",
    "n": "n",
    "ms": "time_ms",
    "ref_ratio": "ref_ratio",
    "roofline": "roofline",
    "time_exp": "time_exponent",
    "mem_exp": "mem_fwd_exponent",
    "mem_bwd_exp": "mem_fwdbwd_exponent",
    "mem_fwd": "mem_fwd_bytes",
    "mem_fwdbwd": "mem_fwdbwd_bytes",
}


def summary_object(row: Mapping[str, Any]) -> dict[str, Any]:
    """One summary row as JSON values: ``ok`` and ``cases`` as numbers, missing values null."""
    from attnbench.bench.results import plain

    ok, _, cases = str(row["ok"]).partition("/")
    obj: dict[str, Any] = {"impl": row["impl"], "ok": int(ok), "cases": int(cases)}
    for key, name in JSON_KEYS.items():
        if key != "impl":
            obj[name] = plain(row.get(key))
    return obj


def summary_json(run: SpeedRun, figures: list[Path]) -> str:
    """What the table shows, as JSON: a list of objects, the counts and the files written."""
    from attnbench.bench.summary import summary_rows

    data = {
        "wall_s": round(run.wall_s, 2),
        "counts": run.counts,
        "noisy": run.noisy,
        "interrupted": run.interrupted,
        "stopped": run.stopped,
        "not_run": len(run.not_run),
        "warnings": {
            "count": run.warnings,
            "file": str(run.warnings_file) if run.warnings_file else None,
        },
        "summary": [summary_object(r) for r in summary_rows(run)],
        **inference_json(run),
        "calibration": run.calibration,
        "files": {
            "results": str(run.csv),
            "complexity": str(run.complexity),
            "sidecar": str(run.sidecar),
            "kernels": str(run.kernels) if run.kernels is not None else None,
            "figures": [str(p) for p in figures],
        },
    }
    return json.dumps(data, indent=2, allow_nan=False, default=_json_value)


def _json_value(x: Any) -> Any:
    """numpy scalars as Python numbers; anything else json cannot write as its text."""
    from attnbench.bench.results import plain

    return plain(x) if hasattr(x, "item") else str(x)


def draw_figures(run: SpeedRun) -> list[Path]:
    """``attnbench plot``'s figures, into ``figures/`` beside the CSV. A failure is a warning on
    stderr: the rows are on disk already, and the exit code stays the run's."""
    from attnbench.bench.failures import one_line

    if run.interrupted:
        err.print(f"figures not drawn (the run stopped early): attnbench plot {run.csv}")
        return []
    from attnbench.bench.plot import plot_results  # matplotlib only when plotting

    try:
        figures = plot_results(run.csv)
    except Exception as e:  # any failure: the measurements must survive a broken figure
        why = str(e) if isinstance(e, AttnbenchError) else one_line(e)  # ours: already a sentence
        err.print(
            f"[yellow]warning:[/yellow] figures not drawn ({escape(why)}); the results "
            f"are in {run.csv}: attnbench plot {run.csv}"
        )
        return []
    for note in figures.notes:
        err.print(f"figures: {escape(note)}")
    return figures.paths
