"""attnbench's own messages go through :mod:`logging` (the ``attnbench`` logger): the library
never prints. Whoever runs it decides where they show: the command line installs
:class:`StderrLines` (one plain line per message on standard error, ``warning:`` before a
warning), and so does every worker process attnbench spawns (:mod:`attnbench.runtime.processes`),
so that a training in another process reports as one in this process does. A program that uses
attnbench as a library configures the ``attnbench`` logger as it likes.
"""

from __future__ import annotations

import logging
import sys

LOGGER = logging.getLogger("attnbench")


def info(message: str) -> None:
    """A line of progress or a note."""
    LOGGER.info(message)


def warn(message: str) -> None:
    """Something the user should know: shown as ``warning: MESSAGE``."""
    LOGGER.warning(message)


class StderrLines(logging.Handler):
    """Each message as one line on the *current* ``sys.stderr`` (looked up when it is written,
    so a test runner that swaps the stream sees it), ``warning:`` before a warning or worse."""

    def emit(self, record: logging.LogRecord) -> None:
        prefix = "warning: " if record.levelno >= logging.WARNING else ""
        try:
            print(prefix + record.getMessage(), file=sys.stderr, flush=True)
        except Exception:  # a closed stream must not end the run
            self.handleError(record)


def show_on_stderr() -> None:
    """Show attnbench's messages (INFO and above) on standard error, once per process."""
    if not any(isinstance(h, StderrLines) for h in LOGGER.handlers):
        LOGGER.addHandler(StderrLines())
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False  # shown here; not twice through a root handler
