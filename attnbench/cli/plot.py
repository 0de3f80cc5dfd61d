"""``attnbench plot RESULTS.csv``: per-family time and memory figures, and the headline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnbench.cli.common import Choice, err, out


class FigureFormat(Choice):
    """``--format``: the figures' file format."""

    png = "png"
    svg = "svg"


def plot_cmd(
    results: Annotated[
        Path,
        typer.Argument(
            help="A results CSV of run speed, or extrapolate.csv / curves.csv of run extrapolate."
        ),
    ],
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Where to write the figures (default: figures/ beside it)."),
    ] = None,
    format: Annotated[
        FigureFormat, typer.Option("--format", help="The figures' file format.")
    ] = FigureFormat.png,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Replace figures already in an --out other than the default."
        ),
    ] = False,
) -> None:
    """Draw a run's figures: time and memory against n, accuracy or training loss.

    Given a results CSV of `run speed`: time and peak memory against n (log-log), one panel per
    family with dense SDPA in each, one figure of each per direction and causal flag
    (time-*.png, memory-*.png); and headline.png: each efficient path's speed-up and memory
    relative to dense SDPA at the longest n it reached. Where a series stops, a marker says why
    (oom, skipped, unsupported).

    Given the extrapolate.csv of `run extrapolate`: its accuracy figure, redrawn (default:
    beside the CSV), and its loss by position when positions.csv is beside it. Given its
    curves.csv: the training loss against step.

    Figures where they are drawn by default are the CSV's own and are drawn again; in another
    --out, figures already there are replaced only with --overwrite.

    Example: [bold]attnbench plot results/speed/cpu/results.csv --format svg[/bold]
    """
    from attnbench.bench.plot import plot_results  # matplotlib only when plotting
    from attnbench.extrapolation.analysis.figures import (
        figure_from_csv,
        is_table_csv,
        position_figure_from_csv,
    )
    from attnbench.extrapolation.training.curves import FIGURE_NAME, is_curves_csv, plot_curves

    fmt = format.value
    if is_table_csv(results):  # extrapolate.csv of run extrapolate: accuracy against length
        _refuse_to_replace(results, out_dir, results.parent, "accuracy_vs_length", fmt, overwrite)
        _refuse_to_replace(results, out_dir, results.parent, "loss_by_position", fmt, overwrite)
        out.print(f"wrote {figure_from_csv(results, out_dir, fmt)}")
        if (by_position := position_figure_from_csv(results, out_dir, fmt)) is not None:
            out.print(f"wrote {by_position}")
        return
    if is_curves_csv(results):  # curves.csv of run extrapolate: loss against step
        _refuse_to_replace(results, out_dir, results.parent / "figures", FIGURE_NAME, fmt,
                           overwrite)  # fmt: skip
        for path in plot_curves(results, out_dir, fmt):
            out.print(f"wrote {path}")
        return

    figures = plot_results(results, out_dir, fmt, overwrite)
    for path in figures.paths:
        out.print(f"wrote {path}")
    for note in figures.notes:
        err.print(note)


def _refuse_to_replace(
    csv: Path, out_dir: Path | None, default: Path, stem: str, fmt: str, overwrite: bool
) -> None:
    """The figure ``stem.fmt`` of ``csv``: drawn again where it is drawn by default (``default``,
    the CSV's own), refused over another one in an explicit ``--out`` unless ``overwrite``."""
    from attnbench.runtime.outputs import refuse_to_replace

    folder = out_dir if out_dir is not None else default
    refuse_to_replace(
        [folder / f"{stem}.{fmt}"], option="--out", folder=folder, inputs=[csv],
        overwrite=overwrite or folder.resolve() == default.resolve(),
    )  # fmt: skip
