"""``attnbench run speed``: time, throughput, roofline and peak memory of every mechanism."""

from __future__ import annotations

import datetime as _dt
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from attnbench.bench.config import load_suite, override
from attnbench.bench.run import SpeedRun, describe_not_run, run_speed, summary_rows
from attnbench.cli.common import err, out, parse_params

INTERRUPTED = 130  # the shell's code for a run stopped by Ctrl-C (128 + SIGINT)
#: The sweep stopped on a sticky CUDA error: run the same command again with --resume (EX_TEMPFAIL).
STOPPED = 75


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


class PlainReporter:
    """One line per finished case on stderr (when stderr is not a terminal: CI logs)."""

    def __init__(self) -> None:
        self.total = 0
        self.done = 0

    def start(self, total: int, description: str) -> None:
        self.total = total
        typer.echo(f"{description}: {total} cases", err=True)

    def note(self, text: str) -> None:
        typer.echo(f"  {text}", err=True)

    def group(self, label: str) -> None:
        typer.echo(f"{label}: warm-up, memory, then timed rounds", err=True)

    def row(self, row: Mapping[str, Any]) -> None:
        self.done += 1
        typer.echo(f"[{self.done}/{self.total}] {row_line(row)}", err=True)

    def finish(self) -> None: ...


class RichReporter:
    """A progress bar (cases done / planned) with the group and round being timed."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[where]}"),
            console=err,
            transient=False,
        )
        self.task = None
        self.where = ""

    def start(self, total: int, description: str) -> None:
        self.progress.start()
        self.task = self.progress.add_task(description, total=total, where="")

    def note(self, text: str) -> None:
        self.progress.update(self.task, where=f"{self.where} {text}".strip())

    def group(self, label: str) -> None:
        self.where = label
        self.progress.update(self.task, where=label)

    def row(self, row: Mapping[str, Any]) -> None:
        self.progress.advance(self.task)
        if row["status"] in ("oom", "error"):
            self.progress.console.print(f"[yellow]{escape(row_line(row))}[/yellow]")

    def finish(self) -> None:
        self.progress.stop()


def print_summary(run: SpeedRun) -> None:
    rows = summary_rows(run)
    table = Table(
        title=f"speed summary ({run.wall_s:.0f} s; at each impl's largest n)",
        caption="x ref: time / reference in the same rounds; % mm: share of the measured matmul "
        "FLOP/s; exp: fitted slope of log time / log memory vs log n",
    )
    for col in ("impl", "ok", "not ok", "series", "n", "ms", "x ref", "% mm"):
        table.add_column(col, justify="left" if col in ("impl", "not ok", "series") else "right")
    for col in ("time exp", "mem exp fwd", "mem exp fwd+bwd", "MiB fwd", "MiB fwd+bwd"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            escape(r["impl"]),
            r["ok"],
            r["other"] or "",
            r.get("series", "-"),
            str(r.get("n", "-")),
            _ms(r.get("ms")),
            _num(r.get("ref_ratio")),
            _num(r.get("roofline"), "{:.0%}"),
            _num(r.get("time_exp")),
            _num(r.get("mem_exp")),
            _num(r.get("mem_bwd_exp")),
            _mib(r.get("mem_fwd")),
            _mib(r.get("mem_fwdbwd")),
        )
    out.print(table)
    for dtype, cal in run.calibration.items():
        out.print(
            f"matmul {cal['matmul_size']}^3 {dtype}, timed in every group's rounds: "
            f"{cal['flop_per_s_median'] / 1e9:.1f} GFLOP/s median "
            f"({cal['flop_per_s_min'] / 1e9:.1f}..{cal['flop_per_s_max'] / 1e9:.1f} over "
            f"{cal['groups']} groups; the roofline's denominator)"
        )
    counts = ", ".join(f"{n} {s}" for s, n in run.counts.items())
    out.print(f"rows: {counts or 'none'}")
    if run.noisy:
        err.print(
            f"[yellow]warning:[/yellow] {run.noisy} of {len(run.rows)} timings are noisy "
            "(p20..p80 spread > 10% of the median); the machine was busy: compare ratios, "
            "or re-run with more --rounds"
        )
    if run.interrupted:
        err.print(f"[yellow]interrupted:[/yellow] not run: {describe_not_run(run.not_run)}")
    out.print(f"wrote {run.csv}, {run.complexity}, {run.sidecar}")


def speed(
    suite: Annotated[
        str, typer.Option("--suite", help="Suite name (speed, speed-gpu, ci) or a TOML file.")
    ] = "speed",
    impl: Annotated[
        list[str] | None,
        typer.Option(
            "--impl", help="NAME or NAME:PATH to run instead of the suite's list (repeatable)."
        ),
    ] = None,
    lengths: Annotated[
        str | None,
        typer.Option(help="Comma-separated lengths, e.g. 256,1024,4096 (lifts per-kind caps)."),
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
    dtype: Annotated[
        str | None, typer.Option(help="float32, float64, bfloat16 or float16.")
    ] = None,
    direction: Annotated[str | None, typer.Option(help="fwd, fwdbwd or both.")] = None,
    causal: Annotated[
        bool | None,
        typer.Option("--causal/--no-causal", help="Only causal / only bidirectional."),
    ] = None,
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads (0: one per core); recorded.")
    ] = None,
    rounds: Annotated[int | None, typer.Option(help="Timed rounds (more: less noise).")] = None,
    reference: Annotated[
        str | None,
        typer.Option(help="NAME:PATH every time is divided by (same rounds), or 'none'."),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param", help="NAME=VALUE for every selected mechanism that has NAME (repeatable)."
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Output directory (default runs/speed/SUITE-TIME)."),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace results already in --out.")] = False,
    resume: Annotated[
        bool,
        typer.Option(help="Continue the run in --out: cases that already have a row are kept."),
    ] = False,
) -> None:
    """Time, throughput, FLOPs, roofline and peak memory of every mechanism and path.

    Writes results.csv (one row per case, flushed as soon as it is measured).

    Also complexity.csv (fitted exponents of time and memory in n) and results.json (provenance).

    Ctrl-C stops cleanly and keeps every finished row; --resume continues such a run (and one
    stopped by a sticky CUDA error, exit 75) in the same --out.

    Example: [bold]attnbench run speed --impl softmax --impl flash-tiled --lengths 512,2048[/bold]
    """
    chosen = load_suite(suite)
    chosen = override(
        chosen,
        impls=impl or (),
        lengths=lengths,
        device=device,
        dtype=dtype,
        direction=direction,
        causal=causal,
        threads=threads,
        rounds=rounds,
        reference=reference,
        params=parse_params(param),
    )
    if out_dir is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out_dir = Path("runs") / "speed" / f"{chosen.name}-{stamp}"
    reporter = RichReporter() if sys.stderr.isatty() else PlainReporter()
    run = run_speed(chosen, out_dir, reporter=reporter, overwrite=overwrite, resume=resume)
    print_summary(run)
    if run.stopped:
        err.print(f"[red]stopped:[/red] {run.stopped}")
        raise typer.Exit(STOPPED)
    if run.interrupted:
        raise typer.Exit(INTERRUPTED)
