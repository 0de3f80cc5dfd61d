"""Jobs for worker processes in the stop tests (importable: spawned workers import them)."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variant:
    label: str


@dataclass(frozen=True)
class Job:
    variant: Variant
    seed: int
    saved: Path  # where a training "writes its checkpoint" when stopped

    @property
    def path(self) -> Path:
        return self.saved

    @property
    def unit_id(self) -> str:
        return f"train-{self.variant.label}-seed{self.seed}"


def ctrl_c_or_save(job: Job, attempt: int = 1) -> str:
    """Seed 0 gets its Ctrl-C before a training began (KeyboardInterrupt at once); the others
    train until SIGTERM, then take a while to save, then raise Interrupted, as a training does."""
    from attnbench.extrapolation.training.loop import Interrupted

    if job.seed == 0:
        time.sleep(0.3)  # let the other start
        raise KeyboardInterrupt
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        time.sleep(0.05)
    time.sleep(1.0)  # saving
    job.saved.write_text("checkpoint")
    raise Interrupted(job.saved, 3, 10)
