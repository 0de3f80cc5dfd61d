"""``attnbench merge DIR... --out DIR``: the units of a sharded speed sweep, as one run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated

import typer

from attnbench.cli.common import err


def merge_cmd(
    folders: Annotated[
        list[Path],
        typer.Argument(help="The --out folders of the shards (or of one unit-wise run)."),
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="Where to write the merged results.")],
    allow_mixed: Annotated[
        bool,
        typer.Option(
            "--allow-mixed",
            help="Merge units measured on different device models or torch versions.",
        ),
    ] = False,
    plot: Annotated[
        bool, typer.Option("--plot/--no-plot", help="Draw the figures into --out/figures.")
    ] = True,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Replace results in --out that are not this sweep's merge."
        ),
    ] = False,
) -> None:
    """Join the units of a speed sweep run with --shard or --executor into one run's files.

    The units of a sweep run with --shard I/N (an array job) or --executor become the files of a
    single run: results.csv in plan order, samples.jsonl, complexity.csv re-fitted, results.json
    listing every unit (host, device, versions, status).

    A unit no folder finished, or one that failed twice, becomes error rows naming it.

    Results already in --out are replaced when they are this sweep's (a merge again, as more
    shards finish); any others only with --overwrite.

    Example: [bold]attnbench merge runs/shard-0 runs/shard-1 --out runs/speed-all[/bold]
    """
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
