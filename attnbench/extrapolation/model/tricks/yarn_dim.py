"""``yarn-dim``: YaRN as its reference code (jquesnelle/yarn) and Hugging Face Transformers'
``_compute_yarn_parameters`` compute it: the ramp runs over the pair index i, not the turns.

c(b) = d ln(L / (2 pi b)) / (2 ln base) is the pair making b turns over L; low =
floor(c(beta_fast)), high = ceil(c(beta_slow)), clamped to [0, d - 1] as that code does (d - 1, not
d/2 - 1: the two differ only when high > d/2 - 1, which with beta_slow = 1 needs L > 2 pi base^(1 -
2/d), 47,000 at d = 64, base = 10^4); ramp_i = clip((i - low) / (high - low), 0, 1) (high raised by
0.001 when equal to low, as there); theta_i' = (1 - ramp_i) theta_i + ramp_i theta_i / s: pairs
below low (the fastest) keep their frequency, pairs from high on are divided by s; beta_fast =
``yarn_beta_fast`` = 32, beta_slow = ``yarn_beta_slow`` = 1 (that code's defaults); plus the
temperature (0.1 ln s + 1)^2 of :mod:`.temperature`.

Peng et al. 2023: Bowen Peng, Jeffrey Quesnelle, Honglu Fan, Enrico Shippole, "YaRN: Efficient
Context Window Extension of Large Language Models", 2023, https://arxiv.org/abs/2309.00071; the
reference code https://github.com/jquesnelle/yarn (its ``_yarn_find_correction_range``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnbench.extrapolation.model.tricks.base import (
    ROTARY,
    YARN_BETA_FAST,
    YARN_BETA_SLOW,
    At,
    Trick,
)

if TYPE_CHECKING:
    from attnbench.extrapolation.model.tricks.base import Tricks


def yarn_correction_pair(dim: int, base: float, train_len: int, turns: float) -> float:
    """The (fractional) pair index whose frequency makes ``turns`` turns over the training
    length: d ln(L / (2 pi turns)) / (2 ln base) (YaRN's code: ``find_correction_dim``)."""
    return dim * math.log(train_len / (turns * 2 * math.pi)) / (2 * math.log(base))


def yarn_dim_freq_scale(
    dim: int,
    base: float,
    train_len: int,
    s: float,
    beta_fast: float = YARN_BETA_FAST,
    beta_slow: float = YARN_BETA_SLOW,
) -> Tensor:
    """YaRN's factor on each rotary frequency [D/2] (float64) as its code computes it: a ramp
    over the pair index from low = floor(pair(beta_fast)) to high = ceil(pair(beta_slow)),
    clamped to [0, d - 1]; (1 - ramp) + ramp / s. 1 everywhere for s <= 1."""
    low = max(math.floor(yarn_correction_pair(dim, base, train_len, beta_fast)), 0)
    high = min(math.ceil(yarn_correction_pair(dim, base, train_len, beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # the reference code's guard against 0 / 0
    pair = torch.arange(dim // 2, dtype=torch.float64)  # (D/2,)
    ramp = ((pair - low) / (high - low)).clamp(0.0, 1.0)  # 0: kept, 1: divided by s
    return (1 - ramp) + ramp / max(1.0, s)


def rotary(at: At) -> dict[str, Any]:
    row = at.row
    scale = yarn_dim_freq_scale(at.head_dim, at.rope_base, row.train_len, at.s,
                                row.yarn_beta_fast, row.yarn_beta_slow)  # fmt: skip
    return {"freq_scale": scale}


def settings(row: Tricks) -> str:
    return f"yarn_beta_fast={row.yarn_beta_fast:g}, yarn_beta_slow={row.yarn_beta_slow:g}"


TRICK = Trick(
    "yarn-dim",
    "YaRN as its code and HF Transformers compute it: ramp over the pair index between the "
    "pairs making beta_fast and beta_slow turns over L + scores x (0.1 ln(n/L) + 1)^2",
    family=ROTARY,
    holds=("temperature",),
    rotary=rotary,
    temperature=True,
    settings=settings,
)
