"""Progress of a training run on the terminal: a rich bar, or plain lines when stderr is not a
terminal (CI logs, pipes)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from attnbench.extrapolation.progress import LogProgress, TrainProgress


class LineProgress(LogProgress):
    """Plain lines on ``stream`` (stderr: not a terminal, as CI logs and pipes), about ``lines``
    per training."""

    def __init__(self, lines: int = 10, stream=None):
        super().__init__(lines)
        self.stream = stream or sys.stderr

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


class RichProgress:
    """One bar per training: steps, loss, tokens/s, elapsed, remaining."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self._bar: Progress | None = None
        self._task = None

    def start(self, title: str, total: int, completed: int) -> None:
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task(title, total=total, completed=completed, loss="-", tps="-")

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        self._bar.update(self._task, completed=step, loss=f"{loss:.3f}", tps=f"{tokens_per_s:,.0f}")

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def default_progress() -> TrainProgress:
    """A rich bar when stderr is a terminal, plain lines otherwise."""
    return RichProgress() if sys.stderr.isatty() else LineProgress()
