"""``ntk``: the rotary base times s^(d / (d - 2)), s = max(1, n / L): NTK-aware scaling (bloc97,
2023, "NTK-Aware Scaled RoPE allows LLaMA models to have extended (8k+) context size without any
fine-tuning and minimal perplexity degradation", https://www.reddit.com/r/LocalLLaMA/comments/
14lz7j5/)."""

from __future__ import annotations

from typing import Any

from attnbench.extrapolation.model.tricks.base import ROTARY, At, Trick


def rotary(at: At) -> dict[str, Any]:
    d = at.head_dim
    return {"base": at.rope_base * at.s ** (d / (d - 2))}


TRICK = Trick("ntk", "NTK-aware rotary base: base x (n/L)^(d/(d-2))", family=ROTARY, rotary=rotary)
