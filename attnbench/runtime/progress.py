"""What an experiment tells its caller while it works: one protocol for the speed sweep and the
trainings. The library only emits these events; the command line draws them (a rich bar, or
plain lines when stderr is not a terminal: :mod:`attnbench.cli.progress`,
:mod:`attnbench.cli.speed_report`). A library caller gets :class:`Silent` unless it passes its
own, such as :class:`LogLines` (lines through :mod:`attnbench.runtime.logs`, what a training in
a worker process reports).

One task at a time: ``start`` once, then any number of ``stage``, ``advance``, ``note`` and
``warning`` (a warning may also come before ``start``), then ``finish``.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from attnbench.runtime import logs


class Progress(Protocol):
    """The events of one task (a sweep of cases, a training of steps)."""

    def start(self, title: str, total: int, completed: int = 0) -> None:
        """The task begins: ``total`` units of work, ``completed`` of them already done (a
        resumed training)."""

    def stage(self, label: str) -> None:
        """The part of the task now under way (a sweep's group of cases)."""

    def advance(self, completed: int, **fields: Any) -> None:
        """``completed`` units are done; ``fields`` say how the last one went (a training's
        ``loss`` and ``tokens_per_s``, the ``row`` a sweep just measured)."""

    def note(self, text: str) -> None:
        """A passing detail (the round being timed)."""

    def warning(self, text: str) -> None:
        """Something the user should know."""

    def finish(self) -> None:
        """The task is over (also after an error or Ctrl-C)."""


class Silent:
    """Tells nothing."""

    def start(self, title: str, total: int, completed: int = 0) -> None: ...
    def stage(self, label: str) -> None: ...
    def advance(self, completed: int, **fields: Any) -> None: ...
    def note(self, text: str) -> None: ...
    def warning(self, text: str) -> None: ...
    def finish(self) -> None: ...


#: How a field of ``advance`` reads in a line; a field not named here reads ``NAME VALUE``, and
#: one that is neither a number nor a string (a sweep's row) is left out.
FIELD_FORMATS: dict[str, str] = {"loss": "loss {:.3f}", "tokens_per_s": "{:,.0f} tok/s"}


def describe(fields: dict[str, Any]) -> str:
    """The fields of an advance as the words of a line: ``loss 2.500 12,345 tok/s``."""
    words = []
    for name, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            continue
        words.append(FIELD_FORMATS.get(name, name + " {}").format(value))
    return " ".join(words)


class LogLines:
    """About ``lines`` plain lines per task, through :mod:`attnbench.runtime.logs` (the command
    line shows them on stderr): ``TITLE: step 5/10 loss 2.500 12,345 tok/s 3s``. Subclasses
    send them elsewhere by overriding :meth:`say` and :meth:`warning`."""

    def __init__(self, lines: int = 10):
        self.lines = lines
        self._every, self._title, self._total, self._t0 = 1, "", 0, 0.0

    def say(self, text: str) -> None:
        logs.info(text)

    def start(self, title: str, total: int, completed: int = 0) -> None:
        self._title, self._total, self._t0 = title, total, time.perf_counter()
        self._every = max(1, total // max(1, self.lines))
        if completed:
            self.say(f"{title}: resuming at step {completed}/{total}")

    def stage(self, label: str) -> None:
        self.say(label)

    def advance(self, completed: int, **fields: Any) -> None:
        if completed % self._every and completed != self._total:
            return
        words = describe(fields)
        self.say(
            f"{self._title}: step {completed}/{self._total} {words + ' ' if words else ''}"
            f"{time.perf_counter() - self._t0:.0f}s"
        )

    def note(self, text: str) -> None:
        self.say(f"  {text}")

    def warning(self, text: str) -> None:
        logs.warn(text)

    def finish(self) -> None:
        pass
