"""The root ``attnbench`` command and the groups mounted on it."""

from __future__ import annotations

import signal
import sys
from typing import Annotated

import typer

from attnbench import __version__
from attnbench.cli import (
    check_cmd,
    compare,
    export,
    gate,
    gpu_check_cmd,
    list_cmd,
    merge_cmd,
    plot,
    report_cmd,
    show,
)
from attnbench.cli.common import INTERRUPTED, USAGE_ERROR, Group, command_help
from attnbench.cli.history import history_app
from attnbench.cli.run import run_app
from attnbench.runtime import logs

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
    logs.show_on_stderr()  # the library logs; the command line shows it


for _name, _fn in (
    ("list", list_cmd.list_mechanisms),
    ("check", check_cmd.check),
    ("show", show.show),
):
    app.command(_name, **command_help(_fn))(_fn)
app.add_typer(run_app, name="run")
for _name, _fn in (
    ("plot", plot.plot_cmd),
    ("compare", compare.compare_cmd),
    ("export", export.export_cmd),
    ("merge", merge_cmd.merge_cmd),
    ("gate", gate.gate_cmd),
    ("report", report_cmd.report_cmd),
    ("gpu-check", gpu_check_cmd.gpu_check_cmd),
):
    app.command(_name, **command_help(_fn))(_fn)
app.add_typer(history_app, name="history")


# Typer may vendor its own click (typer._click): take click's exception classes from Typer's own
# public exceptions rather than from the click package.
_MRO = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
UsageError, ClickException = _MRO["UsageError"], _MRO["ClickException"]


def main() -> None:
    """The ``attnbench`` executable: SIGTERM (what ``timeout``, CI cancellation and schedulers
    send) stops a command the way Ctrl-C does; usage errors are one line, like every other error."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = app(standalone_mode=False)
    except UsageError as e:
        where = e.ctx.command_path if e.ctx is not None else "attnbench"
        typer.echo(f"error: {_usage_message(e)} (see `{where} --help`)", err=True)
        sys.exit(USAGE_ERROR)
    except ClickException as e:
        typer.echo(f"error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("stopped", err=True)
        sys.exit(INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_message(e) -> str:
    """One line for a usage error. A group called without a command (its help is printed
    first, and click's message is empty) or with an unknown one names the commands it has."""
    message = e.format_message().rstrip(".")
    command = e.ctx.command if e.ctx is not None else None
    if command is None or not hasattr(command, "list_commands"):
        return message
    names = ", ".join(command.list_commands(e.ctx))
    if not message:
        return f"no command given; accepted: {names}"
    if message.startswith("No such command"):
        return f"{message}; accepted: {names}"
    return message


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt
