"""What a training run tells its caller as it goes; the CLI draws it (:mod:`attnbench.cli.progress`)
and a library caller gets :class:`NoProgress` unless it passes its own."""

from __future__ import annotations

import sys
import time
from typing import Protocol


class TrainProgress(Protocol):
    def start(self, title: str, total: int, completed: int) -> None: ...
    def update(self, step: int, loss: float, tokens_per_s: float) -> None: ...
    def stop(self) -> None: ...


class NoProgress:
    def start(self, title: str, total: int, completed: int) -> None:
        pass

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        pass

    def stop(self) -> None:
        pass


class LineProgress:
    """Plain lines on stderr (not a terminal: CI logs, pipes), about ``lines`` per training."""

    def __init__(self, lines: int = 10, stream=None):
        self.lines, self.stream = lines, stream or sys.stderr
        self._every, self._title, self._total, self._t0 = 1, "", 0, 0.0

    def start(self, title: str, total: int, completed: int) -> None:
        self._title, self._total, self._t0 = title, total, time.perf_counter()
        self._every = max(1, total // max(1, self.lines))
        if completed:
            print(f"{title}: resuming at step {completed}/{total}", file=self.stream, flush=True)

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if step % self._every and step != self._total:
            return
        print(
            f"{self._title}: step {step}/{self._total} loss {loss:.3f} "
            f"{tokens_per_s:,.0f} tok/s {time.perf_counter() - self._t0:.0f}s",
            file=self.stream,
            flush=True,
        )

    def stop(self) -> None:
        pass
