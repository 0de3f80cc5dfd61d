"""Progress of a training run on the terminal (:class:`attnbench.runtime.progress.Progress`
drawn): a rich bar, or plain lines when stderr is not a terminal (CI logs, pipes)."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column

from attnbench.cli.common import bar_width
from attnbench.runtime import progress


class LineProgress(progress.LogLines):
    """Plain lines on ``stream`` (stderr: not a terminal, as CI logs and pipes), about ``lines``
    per training."""

    def __init__(self, lines: int = 10, stream=None):
        super().__init__(lines)
        self.stream = stream or sys.stderr

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def warning(self, text: str) -> None:
        self.say(f"warning: {text}")


class RichProgress:
    """One bar per training: steps, loss, tokens/s, elapsed, remaining. On a narrow terminal
    the bar narrows and a long label is cut, never the numbers (rich squeezes every column
    alike: at 80 columns a long label left no bar, count or time)."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self._bar: Progress | None = None
        self._task = None

    def start(self, title: str, total: int, completed: int = 0) -> None:
        bar = bar_width(self.console.width)
        # What the numbers beside the label take: the bar, steps/total, "loss 2.345", the
        # tokens/s, two times, and the spaces between the columns.
        numbers = bar + 2 * len(str(total)) + 1 + 10 + 16 + 7 + 7 + 6
        label = Column(max_width=max(8, self.console.width - numbers), no_wrap=True,
                       overflow="ellipsis")  # fmt: skip
        self._bar = Progress(
            TextColumn("{task.description}", table_column=label),
            BarColumn(bar_width=bar),
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

    def stage(self, label: str) -> None:
        pass

    def advance(self, completed: int, **fields: Any) -> None:
        shown = {}
        if "loss" in fields:
            shown["loss"] = f"{fields['loss']:.3f}"
        if "tokens_per_s" in fields:
            shown["tps"] = f"{fields['tokens_per_s']:,.0f}"
        self._bar.update(self._task, completed=completed, **shown)

    def note(self, text: str) -> None:
        self.console.print(escape(text), soft_wrap=True)

    def warning(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {escape(text)}", soft_wrap=True)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def default_progress() -> progress.Progress:
    """A rich bar when stderr is a terminal, plain lines otherwise."""
    return RichProgress() if sys.stderr.isatty() else LineProgress()
