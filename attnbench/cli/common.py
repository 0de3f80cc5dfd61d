"""What every command shares: the error convention and the consoles."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from typer.core import TyperGroup

from attnbench.errors import AttnbenchError

#: Data goes to stdout (wide when piped, so tables do not fold); messages go to stderr.
out = Console() if sys.stdout.isatty() else Console(width=200)
err = Console(stderr=True)

USAGE_ERROR = 2


def fail(message: str) -> typer.Exit:
    """Print one line saying what was wrong and return the exit (code 2) to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(USAGE_ERROR)


class Group(TyperGroup):
    """Turns the library's AttnbenchError, raised anywhere below a command, into one line on
    stderr and exit code 2, with no traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except AttnbenchError as e:
            raise fail(str(e)) from None


def parse_params(items: list[str] | None) -> dict[str, str]:
    """``["k=8", "base=e"]`` -> ``{"k": "8", "base": "e"}``; values are parsed by the mechanism."""
    params = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise AttnbenchError(f"--param {item!r} is not NAME=VALUE (e.g. --param base=e)")
        params[key.strip()] = value.strip()
    return params
