"""The ``attnbench`` executable (``python -m attnbench`` too): the command-line modules are
imported only here, inside the one place that turns a Ctrl-C into a line. Importing them takes a
second or two (torch among them), and a Ctrl-C in that second would otherwise print a Python
traceback instead of the line every other stop gets."""

from __future__ import annotations

import sys

#: The shell's code for a command stopped by Ctrl-C (128 + SIGINT), as every command exits.
INTERRUPTED = 130


def main() -> None:
    try:
        from attnbench.cli.app import main as run_command
    except KeyboardInterrupt:
        sys.stderr.write("stopped while starting; nothing was run\n")
        raise SystemExit(INTERRUPTED) from None
    run_command()
