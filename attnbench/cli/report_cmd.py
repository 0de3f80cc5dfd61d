"""``attnbench report EXTRAPOLATION_DIR SPEED_DIR``: accuracy beyond the training length against
the attention cost that buys it (:mod:`attnbench.costreport`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from attnbench.cli.common import Choice, err, out
from attnbench.cli.plot import FigureFormat


class Direction(Choice):
    """``--direction``: which of the speed CSV's times and peak memories price a row."""

    fwd = "fwd"
    fwdbwd = "fwdbwd"


def report_cmd(
    extrapolation_dir: Annotated[
        Path, typer.Argument(help="The --out folder of `run extrapolate` (extrapolate.csv).")
    ],
    speed_dir: Annotated[
        Path, typer.Argument(help="The --out folder of `run speed` (results.csv).")
    ],
    out_dir: Annotated[
        Path, typer.Option("--out", help="Where to write the report (made if needed).")
    ] = Path("runs/report"),
    direction: Annotated[
        Direction,
        typer.Option(
            "--direction",
            help="fwd: inference at length n; fwdbwd: a training step's attention at n.",
        ),
    ] = Direction.fwd,
    format: Annotated[
        FigureFormat, typer.Option("--format", help="The figures' file format.")
    ] = FigureFormat.png,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an earlier report's files in --out.")
    ] = False,
) -> None:
    """Join an extrapolation table with speed results: accuracy at each n against its cost.

    For every row of extrapolate.csv and every evaluated length n: the accuracy (mean and 95 %
    t-interval over seeds; a count row: its single value) beside the time and peak memory per
    token, at the same n, of the registry path that computes that row's attention (the mapping
    in attnbench/costreport/mapping.py, printed in the report). Costs are the speed CSV's
    forward times (--direction fwdbwd: forward + backward) divided by batch x n tokens.

    Writes accuracy_vs_cost.csv, a figure per machine (a panel per n: the rows, the Pareto
    front, the count floor) and report.md (the mapping, the joined table, the shape notes, the
    rows not joined and why). Rows that cannot be joined are listed on stderr too.

    Example: [bold]attnbench report results/extrapolate/cpu results/report/cpu/speed
    --out results/report/cpu[/bold]
    """
    from attnbench.bench.provenance import command_line
    from attnbench.costreport.make import make_report

    written = make_report(
        extrapolation_dir,
        speed_dir,
        out_dir,
        direction=direction.value,
        command=shlex.join(command_line()),
        fmt=format.value,
        overwrite=overwrite,
    )
    for note in written.notes:
        err.print(note, soft_wrap=True, markup=False)
    for path in written.paths:
        out.print(f"wrote {path}", markup=False)
