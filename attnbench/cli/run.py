"""``attnbench run ...``: the suites (speed, extrapolate, entropy), one command each."""

from __future__ import annotations

import typer

from attnbench.cli.common import Group

run_app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    help="Run a suite: speed and memory, length extrapolation, attention entropy.",
)

# Suites register their commands on run_app when imported (after run_app exists).
from attnbench.cli import extrapolate as _extrapolate  # noqa: E402, F401
