"""``pi``: positions times min(1, L / n): position interpolation (Chen, Wong, Chen, Tian, "Extending
Context Window of Large Language Models via Positional Interpolation", 2023,
https://arxiv.org/abs/2306.15595)."""

from __future__ import annotations

from typing import Any

from attnbench.extrapolation.model.tricks.base import ROTARY, At, Trick


def rotary(at: At) -> dict[str, Any]:
    return {"position_scale": min(1.0, at.row.train_len / at.n)}


TRICK = Trick("pi", "position interpolation: positions x L/n", family=ROTARY, rotary=rotary)
