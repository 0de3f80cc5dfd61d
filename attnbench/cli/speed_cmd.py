"""``attnbench run speed``: time, throughput, roofline and peak memory of every mechanism."""

from __future__ import annotations

import datetime as _dt
import json
import math
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from attnbench.cli.common import err, out, parse_params, short_reason
from attnbench.core.errors import AttnbenchError

if TYPE_CHECKING:  # the benchmark (torch) is imported when the command runs, not for --help
    from attnbench.bench.run import SpeedRun

INTERRUPTED = 130  # the shell's code for a run stopped by Ctrl-C (128 + SIGINT)
#: The sweep stopped on a sticky CUDA error: run the same command again with --resume (EX_TEMPFAIL).
STOPPED = 75
#: What ``--format`` accepts: the summary as a table (rich, for people) or JSON (for programs).
SUMMARY_FORMATS = ("table", "json")


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

    def warning(self, text: str) -> None:
        typer.echo(f"warning: {text}", err=True)

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

    def warning(self, text: str) -> None:
        self.progress.console.print(f"[yellow]warning:[/yellow] {escape(text)}", soft_wrap=True)

    def group(self, label: str) -> None:
        self.where = label
        self.progress.update(self.task, where=label)

    def row(self, row: Mapping[str, Any]) -> None:
        self.progress.advance(self.task)
        if row["status"] in ("oom", "error"):
            self.progress.console.print(f"[yellow]{escape(row_line(row))}[/yellow]")

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


def print_summary(run: SpeedRun, figures: list[Path] | None = None) -> None:
    """The end-of-run table on stdout, then the matmul rate, row counts and files written. Paths
    that ran nowhere here (all unsupported: CUDA paths on a CPU) are folded into one line."""
    from attnbench.bench.run import summary_rows

    rows = summary_rows(run)
    ran = [r for r in rows if not r["ok"].startswith("0/")]
    never = [r for r in rows if r["ok"].startswith("0/")]
    cells = [summary_cells(r) for r in ran]
    columns = fitting_columns(cells, out.width) if cells else SUMMARY_COLUMNS[:1]
    table = Table(
        title=f"speed summary ({run.wall_s:.0f} s; at each impl's largest n)",
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
        out.print(
            f"matmul {cal['matmul_size']}^3 {dtype}, timed in every group's rounds: "
            f"{cal['flop_per_s_median'] / 1e9:.1f} GFLOP/s median "
            f"({cal['flop_per_s_min'] / 1e9:.1f}..{cal['flop_per_s_max'] / 1e9:.1f} over "
            f"{cal['groups']} groups; the roofline's denominator)"
        )
    counts = ", ".join(f"{n} {s}" for s, n in run.counts.items())
    out.print(f"rows: {counts or 'none'}")
    warn_about(run)
    out.print(f"wrote {run.csv}, {run.complexity}, {run.sidecar}")
    if figures:
        out.print(f"figures: {figures[0].parent}/ ({', '.join(p.name for p in figures)})")


def warn_about(run: SpeedRun) -> None:
    """On stderr: noisy timings, and what an interrupted run did not measure."""
    from attnbench.bench.run import describe_not_run

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
    from attnbench.bench.run import summary_rows

    data = {
        "wall_s": round(run.wall_s, 2),
        "counts": run.counts,
        "noisy": run.noisy,
        "interrupted": run.interrupted,
        "stopped": run.stopped,
        "not_run": len(run.not_run),
        "summary": [summary_object(r) for r in summary_rows(run)],
        "calibration": run.calibration,
        "files": {
            "results": str(run.csv),
            "complexity": str(run.complexity),
            "sidecar": str(run.sidecar),
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
    from attnbench.bench.run import one_line

    if run.interrupted:
        err.print(f"figures not drawn (the run stopped early): attnbench plot {run.csv}")
        return []
    from attnbench.bench.plot import plot_results  # matplotlib only when plotting

    try:
        figures = plot_results(run.csv)
    except Exception as e:  # any failure: the measurements must survive a broken figure
        err.print(
            f"[yellow]warning:[/yellow] figures not drawn ({escape(one_line(e))}); the results "
            f"are in {run.csv}: attnbench plot {run.csv}"
        )
        return []
    for note in figures.notes:
        err.print(f"figures: {escape(note)}")
    return figures.paths


def print_units(suite, shard: tuple[int, int] | None, fmt: str) -> None:
    """--list-units: every unit of the sweep, in plan order, with the shard that runs it."""
    from attnbench.bench.units import speed_units
    from attnbench.runtime.engines import in_shard

    units = [u for u in speed_units(suite) if in_shard(u.index, shard)]
    if fmt == "json":
        typer.echo(json.dumps([
            {"index": u.index, "id": u.id, "device": u.device, "dtype": u.dtype,
             "head_dim": u.head_dim, "causal": u.causal, "mechanism": u.mechanism,
             "cases": len(u.cases)} | ({"shard": u.index % shard[1]} if shard else {})
            for u in units
        ], indent=1))  # fmt: skip
        return
    for u in units:
        out.print(f"{u.index:4d} {escape(u.id)} ({len(u.cases)} cases)")
    out.print(f"{len(units)} units")


def run_units(suite, out_dir: Path, executor: str, shard, resume: bool, overwrite: bool,
              ray_address: str | None) -> SpeedRun | None:  # fmt: skip
    """A unit-wise run (:mod:`attnbench.bench.sweep`); once every unit of the plan is in
    ``out_dir``, merged there into the usual results (returned); else None, with the merge
    command to run when the other shards are done."""
    from attnbench.bench.merge import merge_runs
    from attnbench.bench.sweep import run_sweep
    from attnbench.bench.units import PLAN_NAME

    if ray_address is not None and executor != "ray":
        raise AttnbenchError("--ray-address needs --executor ray")

    def log(line: str) -> None:
        typer.echo(line, err=True)

    outcome = run_sweep(suite, out_dir, executor=executor, shard=shard, resume=resume,
                        overwrite=overwrite, ray_address=ray_address, log=log)  # fmt: skip
    if outcome.interrupted:
        err.print(f"[yellow]interrupted:[/yellow] finished units are kept in {out_dir}; "
                  "run the same command with --resume")  # fmt: skip
        raise typer.Exit(INTERRUPTED)
    if not outcome.complete:
        mine_failed = len(outcome.failed)
        err.print(
            f"this shard: {len(outcome.records) - mine_failed} units ok, {mine_failed} failed, "
            f"{len(outcome.skipped)} done before ({outcome.wall_s:.0f} s). When every shard is "
            f"done: attnbench merge {out_dir} --out {out_dir} (the folders of all shards, if "
            f"they differ; {PLAN_NAME} is in each)"
        )
        return None
    if outcome.failed:
        err.print(f"[yellow]warning:[/yellow] {len(outcome.failed)} units failed twice "
                  f"({', '.join(outcome.failed[:5])}): their cases are error rows; --resume "
                  "runs them again")  # fmt: skip
    from attnbench.bench.run import command_line

    return merge_runs([out_dir], out_dir, command=shlex.join(command_line()))


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
    plot: Annotated[
        bool,
        typer.Option(
            "--plot/--no-plot", help="Draw attnbench plot's figures into --out/figures at the end."
        ),
    ] = True,
    summary_format: Annotated[
        str,
        typer.Option(
            "--format", help="The end-of-run summary on stdout: table, or json (with the files)."
        ),
    ] = "table",
    executor: Annotated[
        str | None,
        typer.Option(
            help="Run unit by unit, each unit in a worker process: local (one worker here) or "
            'ray (one Ray task per unit; pip install "attnbench\\[ray]").'
        ),
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="I/N: run only units I, I+N, I+2N... (an array job's task); then attnbench merge."
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(help="--executor ray: the cluster to join (default: start a local Ray)."),
    ] = None,
    list_units: Annotated[
        bool,
        typer.Option("--list-units", help="Print the sweep's units (with --format json: JSON)."),
    ] = False,
) -> None:
    """Time, throughput, FLOPs, roofline and peak memory of every mechanism and path.

    Writes results.csv (one row per case, flushed as soon as it is measured).

    Also complexity.csv (fitted exponents of time and memory in n) and results.json (provenance).

    Then the figures of attnbench plot, in --out/figures (--no-plot: none).

    Ctrl-C stops cleanly and keeps every finished row; --resume continues such a run (and one
    stopped by a sticky CUDA error, exit 75) in the same --out.

    Example: [bold]attnbench run speed --impl softmax --impl flash-tiled --lengths 512,2048[/bold]
    """
    if summary_format not in SUMMARY_FORMATS:
        raise AttnbenchError(f"--format {summary_format!r}: accepted: {', '.join(SUMMARY_FORMATS)}")
    if resume and overwrite:
        raise AttnbenchError(
            "--resume and --overwrite exclude each other: --resume keeps the rows in --out and "
            "runs the missing cases, --overwrite runs everything again"
        )
    from attnbench.bench.config import load_suite, override
    from attnbench.bench.run import run_speed

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
    if list_units or executor is not None or shard is not None:
        from attnbench.runtime.engines import parse_shard

        parsed_shard = parse_shard(shard) if shard is not None else None
        from attnbench.runtime.engines import EXECUTORS

        if executor is not None and executor not in EXECUTORS:
            raise AttnbenchError(f"--executor {executor!r}: accepted: {', '.join(EXECUTORS)}")
        if list_units:
            print_units(chosen, parsed_shard, summary_format)
            return
        if out_dir is None:
            raise AttnbenchError(
                "--shard / --executor: give --out (the folder every shard writes its units to)"
            )
        run = run_units(chosen, out_dir, executor or "local", parsed_shard, resume, overwrite,
                        ray_address)  # fmt: skip
        if run is None:  # a shard: the others' units are not here yet
            return
    else:
        if ray_address is not None:
            raise AttnbenchError("--ray-address needs --executor ray")
        if out_dir is None:
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            out_dir = Path("runs") / "speed" / f"{chosen.name}-{stamp}"
        reporter = RichReporter() if sys.stderr.isatty() else PlainReporter()
        run = run_speed(chosen, out_dir, reporter=reporter, overwrite=overwrite, resume=resume)
    figures = draw_figures(run) if plot else []
    if summary_format == "json":
        typer.echo(summary_json(run, figures))
        warn_about(run)
    else:
        print_summary(run, figures)
    if run.stopped:
        err.print(f"[red]stopped:[/red] {run.stopped}")
        raise typer.Exit(STOPPED)
    if run.interrupted:
        raise typer.Exit(INTERRUPTED)
