"""What a training run tells its caller as it goes; the CLI draws it (:mod:`attnbench.cli.progress`)
and a library caller gets :class:`NoProgress` unless it passes its own."""

from __future__ import annotations

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
