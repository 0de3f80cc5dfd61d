"""What a training run tells its caller as it goes; the CLI draws it (:mod:`attnbench.cli.progress`)
and a library caller gets :class:`NoProgress` unless it passes its own (:class:`LogProgress`:
lines through :mod:`logging`)."""

from __future__ import annotations

import time
from typing import Protocol

from attnbench.runtime import logs


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


class LogProgress:
    """About ``lines`` plain lines per training, through :mod:`attnbench.runtime.logs` (what a
    training in a worker process reports; the command line shows them on stderr)."""

    def __init__(self, lines: int = 10):
        self.lines = lines
        self._every, self._title, self._total, self._t0 = 1, "", 0, 0.0

    def say(self, text: str) -> None:
        logs.info(text)

    def start(self, title: str, total: int, completed: int) -> None:
        self._title, self._total, self._t0 = title, total, time.perf_counter()
        self._every = max(1, total // max(1, self.lines))
        if completed:
            self.say(f"{title}: resuming at step {completed}/{total}")

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if step % self._every and step != self._total:
            return
        self.say(
            f"{self._title}: step {step}/{self._total} loss {loss:.3f} "
            f"{tokens_per_s:,.0f} tok/s {time.perf_counter() - self._t0:.0f}s"
        )

    def stop(self) -> None:
        pass
