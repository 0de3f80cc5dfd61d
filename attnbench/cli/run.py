"""``attnbench run ...``: the suites (speed, extrapolate, entropy), one command each."""

from __future__ import annotations

import typer

from attnbench.cli import extrapolate, speed_cmd
from attnbench.cli.common import Group

run_app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    help="Run a suite: speed and memory, length extrapolation, attention entropy.",
)

run_app.command("speed")(speed_cmd.speed)
run_app.command("extrapolate")(extrapolate.extrapolate)
run_app.command("entropy")(extrapolate.entropy)
