"""``attnbench plot RESULTS.csv``: time, throughput and memory against n, one figure per setting."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnbench.cli.common import out


def plot_cmd(
    results: Annotated[Path, typer.Argument(help="A results CSV from attnbench run speed.")],
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Where to write the figures (default: figures/ beside it)."),
    ] = None,
    format: Annotated[str, typer.Option("--format", help="png or svg.")] = "png",
) -> None:
    """Plot time, throughput and peak memory against n (log-log), one figure per direction and
    causal flag; cases that did not run are marked, not left out.

    Example: [bold]attnbench plot results/speed/cpu/results.csv --format svg[/bold]
    """
    from attnbench.bench.plot import plot_results  # matplotlib only when plotting

    for path in plot_results(results, out_dir, format):
        out.print(f"wrote {path}")
