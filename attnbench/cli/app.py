"""The root ``attnbench`` command and the groups mounted on it."""

from __future__ import annotations

from typing import Annotated

import typer

from attnbench import __version__
from attnbench.cli import check_cmd, compare, list_cmd, plot, show
from attnbench.cli.common import Group
from attnbench.cli.run import run_app

app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    help="Benchmark attention mechanisms: correctness, speed, memory and length extrapolation.",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"attnbench {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Benchmark attention mechanisms: correctness, speed, memory and length extrapolation."""


app.command("list")(list_cmd.list_mechanisms)
app.command("check")(check_cmd.check)
app.command("show")(show.show)
app.add_typer(run_app, name="run")
app.command("plot")(plot.plot_cmd)
app.command("compare")(compare.compare_cmd)


def main() -> None:
    app()
