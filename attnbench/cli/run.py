"""``attnbench run ...``: the suites (speed, extrapolate, entropy), one command each."""

from __future__ import annotations

import typer

from attnbench.cli import extrapolate, speed_cmd
from attnbench.cli.common import Group, command_help

run_app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    help="Run a suite: speed and memory, length extrapolation, attention entropy.",
)

for _name, _fn in (
    ("speed", speed_cmd.speed),
    ("extrapolate", extrapolate.extrapolate),
    ("entropy", extrapolate.entropy),
):
    run_app.command(_name, **command_help(_fn))(_fn)
