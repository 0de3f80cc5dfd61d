"""What every command shares: the error convention and the consoles."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from typer.core import TyperGroup

from attnbench.core.errors import AttnbenchError

#: Data goes to stdout (the terminal's width; when piped, $COLUMNS or 120); messages to stderr.
out = Console() if sys.stdout.isatty() else Console(width=int(os.environ.get("COLUMNS") or 120))
err = Console(stderr=True)

USAGE_ERROR = 2
INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C (128 + SIGINT)


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
        except OSError as e:  # a file that cannot be read or written: full disk, permissions...
            raise fail(os_error_line(e)) from None
        except MemoryError:
            raise fail(
                "out of memory: this machine cannot hold what was asked; try a shorter --n, "
                "a smaller batch or fewer heads"
            ) from None


def os_error_line(e: OSError) -> str:
    """``cannot write runs/x/results.csv: No space left on device`` from any OSError."""
    what = e.strerror or str(e) or type(e).__name__
    if e.filename is None:
        return what
    where = f"{e.filename}" + (f" -> {e.filename2}" if e.filename2 else "")
    return f"{where}: {what}"


def parse_params(
    items: list[str] | None, option: str = "--param", example: str = "base=e"
) -> dict[str, str]:
    """``["k=8", "base=e"]`` -> ``{"k": "8", "base": "e"}``; values are parsed by the mechanism.
    ``option`` and ``example`` name the flag in the error message."""
    params = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise AttnbenchError(f"{option} {item!r} is not NAME=VALUE (e.g. {option} {example})")
        params[key.strip()] = value.strip()
    return params


def short_reason(reason: str) -> str:
    """``needs CUDA (no GPU visible to torch)`` -> ``needs CUDA``: the label of a folded line."""
    return reason.split(" (", 1)[0]
