"""What every command shares: the error convention and the consoles."""

from __future__ import annotations

import ast
import inspect
import os
import re
import sys
from collections.abc import Callable
from enum import Enum
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from attnbench.core.errors import AttnbenchError
from attnbench.runtime.interrupts import Stopped
from attnbench.runtime.outputs import os_error_words

#: Data goes to stdout (the terminal's width; when piped, $COLUMNS or 120); messages to stderr.
out = Console() if sys.stdout.isatty() else Console(width=int(os.environ.get("COLUMNS") or 120))
err = Console(stderr=True)

USAGE_ERROR = 2
INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C (128 + SIGINT)


def fail(message: str) -> typer.Exit:
    """Print one line saying what was wrong and return the exit (code 2) to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(USAGE_ERROR)


class Choice(str, Enum):
    """The values a fixed-choice option accepts (``--format``, ``--device``...): declared as
    ``Annotated[SomeChoice, typer.Option(...)]``, Typer checks the value and ``--help`` lists
    them (``<table|json>``); a value outside them is one line saying which are accepted
    (:class:`Group`). Plain ``str`` underneath: no torch import to define one."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)

    @classmethod
    def bad_value(cls, option: str, value: object) -> str:
        """The one line for ``value`` given to ``option``, which is not among the choices."""
        return f"{option} {value!r}: accepted: {', '.join(cls.values())}"


class Group(TyperGroup):
    """Turns the library's AttnbenchError, raised anywhere below a command, and a value outside
    a fixed-choice option's choices, into one line on stderr and exit code 2, with no
    traceback; and Ctrl-C (SIGTERM too: :func:`attnbench.cli.app.main`) that a command did
    not report itself into one line saying what it stopped and what is kept, and exit code 130
    (Typer would exit 130 saying nothing)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as e:
            typer.echo(interrupted_line(e, ctx), err=True)
            raise typer.Exit(INTERRUPTED) from None
        except AttnbenchError as e:
            raise fail(str(e)) from None
        except typer.BadParameter as e:
            message = bad_choice_line(e)
            if message is None:
                raise
            raise fail(message) from None
        except OSError as e:  # a file that cannot be read or written: full disk, permissions...
            raise fail(os_error_line(e)) from None
        except MemoryError:
            raise fail(
                "out of memory: this machine cannot hold what was asked; try a shorter --n, "
                "a smaller batch or fewer heads"
            ) from None


def interrupted_line(e: KeyboardInterrupt, ctx: typer.Context) -> str:
    """The one line for a command that Ctrl-C stopped: the library's own when it raised
    :class:`Stopped` (``interrupted during evaluation; 3 finished rows are in ...``), else
    which command stopped, and that the files it finished writing are kept (files are written
    whole or not at all: :mod:`attnbench.runtime.outputs`)."""
    if isinstance(e, Stopped):
        return str(e)
    command = " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand)))
    return f"interrupted `{command}` before it finished; the files it finished writing are kept"


def bad_choice_line(e: typer.BadParameter) -> str | None:
    """``--format 'yaml': accepted: table, json`` for a value outside an option's choices (the
    choices' own :meth:`Choice.bad_value` when they are a Choice); None for any other bad value
    (``--n abc``), which keeps click's message."""
    param = e.param
    # Typer >= 0.2x describes the annotation (type_descriptor); older ones give a click.Choice.
    choices = getattr(getattr(param, "type_descriptor", None), "choices", None)
    choices = choices or getattr(getattr(param, "type", None), "choices", None)
    if param is None or not choices:
        return None
    option = next((o for o in param.opts if o.startswith("--")), param.name)
    value = _given_value(e)
    if isinstance(choices[0], Choice):
        return type(choices[0]).bad_value(option, value)
    accepted = ", ".join(str(c.value if isinstance(c, Enum) else c) for c in choices)
    return f"{option} {value!r}: accepted: {accepted}"


def _given_value(e: typer.BadParameter) -> object:
    """The value the user gave, from the validation error Typer raised it from, else from the
    message (``'yaml' is not one of 'table', 'json'.``); None when neither says."""
    errors = getattr(e.__cause__, "errors", None)
    if callable(errors):
        try:
            return errors()[0]["input"]
        except (LookupError, TypeError, ValueError):
            pass
    found = re.search(r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\") is not one of", e.message)
    return ast.literal_eval(found.group(1)) if found else None


def os_error_line(e: OSError) -> str:
    """``runs/x/results.csv: No space left on device`` from any OSError, naming the real trouble
    where the OS's words do not (``afile is a file, not a folder`` for ``File exists``)."""
    what = os_error_words(e)
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


def command_help(fn: Callable[..., Any]) -> dict[str, str]:
    """``help`` and ``short_help`` for registering ``fn`` as a command, from its docstring.

    Typer's rich help keeps a docstring's line breaks inside a paragraph: a hard-wrapped
    docstring broke mid-sentence at every width ("(outputs and" / "gradients), with ..."), and
    the command list showed the whole first paragraph so. Here each paragraph becomes one line
    (the terminal wraps it), and the list shows the first sentence of the first paragraph."""
    paragraphs = [p for p in inspect.cleandoc(fn.__doc__ or "").split("\n\n") if p.strip()]
    help_text = "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    )
    first = help_text.split("\n\n", 1)[0]
    sentence = re.match(r"(.+?[.!?])(\s|$)", first)
    return {"help": help_text, "short_help": sentence.group(1) if sentence else first}


def bar_width(width: int) -> int:
    """A progress bar's width on a terminal ``width`` columns wide: 40 where there is room, as
    little as 10 on a narrow one, so that the counts, the times and the text beside the bar
    stay whole (rich squeezes every column alike, cutting the numbers first)."""
    return max(10, min(40, width - 100))


def short_reason(reason: str) -> str:
    """``needs CUDA (no GPU visible to torch)`` -> ``needs CUDA``: the label of a folded line."""
    return reason.split(" (", 1)[0]
