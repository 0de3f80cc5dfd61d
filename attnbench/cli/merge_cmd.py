"""``attnbench merge``: the units of a sharded speed sweep as one run (``merge DIR... --out DIR``),
or the tables of extrapolation runs side by side with paired contrasts (``merge LABEL=RUN...
--out FILE.md``)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated

import typer

from attnbench.cli.common import err, fail

Sources = Annotated[
    list[str],
    typer.Argument(
        help="The --out folders of a speed sweep's shards (or of one unit-wise run); or "
        "extrapolation runs as LABEL=RUN (RUN: a run's folder or its extrapolate.csv).",
        metavar="RUNS",
    ),
]

OutTarget = Annotated[
    Path,
    typer.Option(
        "--out",
        help="Where to write: the merged speed run's folder, or the joined table's Markdown file.",
    ),
]

AllowMixed = Annotated[
    bool,
    typer.Option(
        "--allow-mixed",
        help="Speed: merge units measured on different device models or torch versions.",
    ),
]

Plot = Annotated[
    bool, typer.Option("--plot/--no-plot", help="Speed: draw the figures into --out/figures.")
]

Rows = Annotated[
    str | None,
    typer.Option(help="Extrapolation: the rows to keep, comma-separated, e.g. O,E,O+logn."),
]

Seeds = Annotated[
    str | None,
    typer.Option(help="Extrapolation: the seeds to keep, comma-separated, e.g. 0,1,2."),
]

Contrasts = Annotated[
    list[str] | None,
    typer.Option(
        help="Extrapolation: 'A - B', two rows of the joined table (VARIANT [LABEL]), their "
        "difference paired by seed. Repeatable."
    ),
]

LongRange = Annotated[
    bool,
    typer.Option(
        "--long-range", help="Extrapolation: add the long-range span's copy accuracy beyond L."
    ),
]

Overwrite = Annotated[
    bool,
    typer.Option(
        "--overwrite",
        help="Replace results in --out that are not this sweep's merge (or an existing "
        "joined table).",
    ),
]


def merge_cmd(
    sources: Sources,
    out_dir: OutTarget,
    allow_mixed: AllowMixed = False,
    plot: Plot = True,
    rows: Rows = None,
    seeds: Seeds = None,
    contrast: Contrasts = None,
    long_range: LongRange = False,
    overwrite: Overwrite = False,
) -> None:
    """Join the units of a sharded speed sweep, or the tables of extrapolation runs.

    Speed: the units of a sweep run with --shard I/N (an array job) or --executor become the
    files of a single run: results.csv in plan order, samples.jsonl, complexity.csv re-fitted,
    results.json listing every unit. A unit no folder finished, or one that failed twice,
    becomes error rows naming it.

    Extrapolation: each run's rows among --rows and --seeds become VARIANT [LABEL] in one table
    (mean ± std over seeds), with each --contrast paired by seed; runs of one label pool.

    Results already in --out are replaced when they are this sweep's (a merge again, as more
    shards finish); any others only with --overwrite.

    Example: [bold]attnbench merge runs/shard-0 runs/shard-1 --out runs/speed-all[/bold]

    Example: [bold]attnbench merge L=64=runs/a vary=runs/b --rows O --seeds 0,1,2
    --contrast "O \\[vary] - O \\[L=64]" --out joined.md[/bold]
    """
    from attnbench.extrapolation.analysis.join import is_extrapolation_run

    kinds = {is_extrapolation_run(text) for text in sources}
    if kinds == {True, False}:
        raise fail("merge: these are speed folders and extrapolation runs; merge one kind")
    if True in kinds:
        if allow_mixed or not plot:
            raise fail("--allow-mixed and --no-plot are for speed sweeps, not extrapolation runs")
        _join_tables(sources, out_dir, rows, seeds, contrast or [], long_range, overwrite)
        return
    if rows is not None or seeds is not None or contrast or long_range:
        raise fail(
            "--rows, --seeds, --contrast and --long-range join extrapolation runs (LABEL=RUN), "
            "not speed folders"
        )
    _merge_speed([Path(s) for s in sources], out_dir, allow_mixed, plot, overwrite)


def _join_tables(sources: list[str], target: Path, rows: str | None, seeds: str | None,
                 contrasts: list[str], long_range: bool, overwrite: bool) -> None:  # fmt: skip
    """The extrapolation runs' rows in one Markdown table (printed, and written to ``target``)."""
    from attnbench.bench.provenance import command_line
    from attnbench.extrapolation.analysis.join import (
        join_runs,
        parse_contrast,
        parse_run,
    )
    from attnbench.runtime.outputs import refuse_to_replace, write_text

    if rows is None or seeds is None:
        raise fail("merge: joining extrapolation runs needs --rows (e.g. O,E) and --seeds "
                   "(e.g. 0,1,2)")  # fmt: skip
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise fail(f"--seeds {seeds!r}: accepted: whole numbers, comma-separated") from None
    row_list = [r.strip() for r in rows.split(",") if r.strip()]
    if not row_list or not seed_list:
        raise fail("--rows and --seeds: accepted: at least one each, comma-separated")
    runs = [parse_run(text) for text in sources]
    text = join_runs(runs, row_list, seed_list, [parse_contrast(c) for c in contrasts],
                     command=shlex.join(command_line()), with_long_range=long_range)  # fmt: skip
    if target.is_dir():
        raise fail(f"--out {target} is a folder; accepted: the Markdown file to write")
    inputs = [run.csv for run in runs]
    refuse_to_replace([target], option="--out", inputs=inputs, overwrite=overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text(target, text)
    typer.echo(text, nl=False)
    err.print(f"wrote {target}", markup=False, highlight=False)


def _merge_speed(
    folders: list[Path], out_dir: Path, allow_mixed: bool, plot: bool, overwrite: bool
) -> None:
    """The units of a speed sweep as one run's files in ``out_dir``."""
    from attnbench.bench.merge import merge_runs
    from attnbench.bench.provenance import command_line
    from attnbench.cli.speed_report import draw_figures, print_summary

    run = merge_runs(folders, out_dir, allow_mixed=allow_mixed, command=shlex.join(command_line()),
                     overwrite=overwrite)  # fmt: skip
    merged = json.loads(run.sidecar.read_text(encoding="utf-8"))["merged"]
    missing = [u for u in merged["units"] if u["status"] != "ok"]
    figures = draw_figures(run) if plot else []
    print_summary(run, figures)
    if missing:
        names = ", ".join(u["unit"] for u in missing[:5]) + (" ..." if len(missing) > 5 else "")
        err.print(
            f"[yellow]warning:[/yellow] {len(missing)} units missing or failed ({names}): their "
            "cases are error rows"
        )
    for mix in merged["mixed"]:
        err.print(f"[yellow]warning:[/yellow] merged across {mix} (--allow-mixed)")
