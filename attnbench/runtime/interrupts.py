"""What a Ctrl-C stopped, and what it kept, said in one line.

Ctrl-C (or SIGTERM, which the CLI turns into it) is a KeyboardInterrupt wherever it lands. The
code that knows what was running and what stays on disk raises :class:`Stopped` instead; it is
still a KeyboardInterrupt, so every ``except KeyboardInterrupt`` and ``finally`` on its way out
(workers asked to stop, Ray shut down, threads put back) runs as before. The CLI prints it as
the command's one line and exits 130 (:class:`attnbench.cli.common.Group`). No torch here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


class Stopped(KeyboardInterrupt):
    """Ctrl-C stopped ``what`` (``during evaluation``); ``kept`` says what stays and how to go
    on (``3 rows are in out/extrapolate.csv; continue with --resume``)."""

    def __init__(self, what: str, kept: str):
        super().__init__(what, kept)
        self.what, self.kept = what, kept

    def __str__(self) -> str:
        return f"interrupted {self.what}; {self.kept}"


@contextlib.contextmanager
def said_as(what: str, kept: Callable[[], str]) -> Iterator[None]:
    """A Ctrl-C inside the block comes out as ``Stopped(what, kept())``; ``kept`` is asked only
    then, as what stays depends on how far the block got. A :class:`Stopped` raised inside
    keeps its own line (it knows more)."""
    try:
        yield
    except Stopped:
        raise
    except KeyboardInterrupt:
        raise Stopped(what, kept()) from None
