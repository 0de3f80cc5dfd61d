"""``attnbench compare CURRENT BASELINE``: the regression gate (exit 1 on a regression)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.bench.compare import (
    MEM_SLACK_BYTES,
    MEM_TOLERANCE,
    MEM_TOLERANCE_OTHER,
    REF_TIME_RATIO,
    TIME_RATIO,
    Thresholds,
    compare,
    markdown,
)
from attnbench.cli.common import err, out
from attnbench.errors import AttnbenchError

STYLE = {
    "worse": "bold red",
    "unconfirmed": "yellow",
    "better": "green",
    "new": "cyan",
    "missing": "yellow",
}


def compare_cmd(
    current: Annotated[Path, typer.Argument(help="Results CSV of this run.")],
    baseline: Annotated[Path, typer.Argument(help="Results CSV to compare against.")],
    confirm: Annotated[
        list[Path] | None,
        typer.Option(
            "--confirm",
            help="Results of the same grid run again: a regression counts only if it repeats "
            "there too (repeatable).",
        ),
    ] = None,
    markdown_file: Annotated[
        Path | None, typer.Option("--markdown", help="Also write the comparison as markdown.")
    ] = None,
    time_ratio: Annotated[
        float, typer.Option(help="A time ratio to the reference must grow by more than this.")
    ] = TIME_RATIO,
    ref_time_ratio: Annotated[
        float, typer.Option(help="The reference's own time (x matmul rate) threshold.")
    ] = REF_TIME_RATIO,
    mem_tolerance: Annotated[
        float, typer.Option(help="Relative memory tolerance, deterministic methods.")
    ] = MEM_TOLERANCE,
    mem_slack: Annotated[
        int, typer.Option(help="Absolute memory slack in bytes, deterministic methods.")
    ] = MEM_SLACK_BYTES,
    mem_tolerance_other: Annotated[
        float, typer.Option(help="Relative memory tolerance, other methods (CUDA allocator).")
    ] = MEM_TOLERANCE_OTHER,
    separation: Annotated[
        bool,
        typer.Option(
            "--separation/--no-separation",
            help="Also require the p20..p80 bands of the two time ratios not to overlap.",
        ),
    ] = True,
    show_all: Annotated[
        bool,
        typer.Option("--all", help="Show every compared quantity, not only the changes."),
    ] = False,
) -> None:
    """Compare a speed run with a baseline: time as ratio to the reference, FLOPs, memory.

    Exit code 0: nothing worse; 1: a regression; 2: usage error; 3: nothing comparable
    (e.g. a baseline from another machine class or torch version: a warning, not a failure).

    The terminal table shows what changed (--all: everything); --markdown writes every time
    line too. With --confirm, something worse in CURRENT alone is reported as unconfirmed.

    Example: [bold]attnbench compare runs/ci/results.csv runs/ci-before/results.csv[/bold]
    """
    for name, value in (("--time-ratio", time_ratio), ("--ref-time-ratio", ref_time_ratio)):
        if not value > 1:
            raise AttnbenchError(f"{name} {value}: accepted: a factor > 1 (e.g. 1.3)")
    for name, value in (("--mem-tolerance", mem_tolerance), ("--mem-slack", mem_slack)):
        if value < 0:
            raise AttnbenchError(f"{name} {value}: accepted: a number >= 0")
    thresholds = Thresholds(
        time_ratio=time_ratio,
        ref_time_ratio=ref_time_ratio,
        mem_tolerance=mem_tolerance,
        mem_slack_bytes=mem_slack,
        mem_tolerance_other=mem_tolerance_other,
        require_separation=separation,
    )
    result = compare(current, baseline, thresholds, confirm or ())
    if markdown_file is not None:
        try:
            markdown_file.parent.mkdir(parents=True, exist_ok=True)
            markdown_file.write_text(markdown(result, show_all), encoding="utf-8")
        except OSError as e:
            msg = f"--markdown {markdown_file}: cannot write there ({e.strerror})"
            raise AttnbenchError(msg) from None
    table = Table(title=f"attnbench compare: {result.headline()}", caption=thresholds.describe())
    for col in ("case", "metric", "baseline", "current", "ratio", "verdict", "note"):
        table.add_column(col, justify="right" if col == "ratio" else "left", overflow="fold")
    changes = result.shown(show_all, changes_only=True)
    for ln in changes:
        style = STYLE.get(ln.verdict, "")
        ratio = f"{ln.ratio:.3f}" if ln.ratio is not None else ""
        verdict = f"[{style}]{ln.verdict}[/{style}]" if style else ln.verdict
        cells = (ln.case, ln.metric, ln.baseline, ln.current)
        table.add_row(*map(escape, cells), ratio, verdict, escape(ln.note))
    quiet = len(result.lines) - len(changes)
    if changes:
        out.print(table)
    if quiet:
        out.print(f"{quiet} more quantities unchanged or not run (--all shows them)")
    for w in result.warnings:
        err.print(f"[yellow]warning:[/yellow] {w}")
    # Last, so that a log cut to its tail still says what failed.
    for ln in result.lines:
        if ln.verdict in ("worse", "unconfirmed"):
            ratio = f" ({ln.ratio:.3f}x)" if ln.ratio is not None else ""
            err.print(
                f"{ln.verdict}: {escape(ln.case)}: {escape(ln.metric)} {escape(ln.baseline)} -> "
                f"{escape(ln.current)}{ratio}",
                soft_wrap=True,
            )
    out.print(f"attnbench compare: {result.headline()}", soft_wrap=True)
    raise typer.Exit(result.exit_code)
