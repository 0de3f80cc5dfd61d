"""``yarn``: YaRN, the paper's equation (Peng et al. 2023). Each rotary frequency theta_i is
interpolated by parts, theta_i' = (1 - g) theta_i / s + g theta_i with g = clip((r_i - alpha) /
(beta - alpha), 0, 1) and r_i = L theta_i / 2 pi the turns pair i makes over the training length
(alpha = ``yarn_alpha`` = 1, beta = ``yarn_beta`` = 32: the paper's values, set for LLaMA's L =
4096; at L = 64 no pair makes 32 turns, so every pair is interpolated, at least in part), plus the
temperature (0.1 ln s + 1)^2 of :mod:`.temperature`. ``yarn-dim`` is YaRN as its code computes it.

Peng et al. 2023: Bowen Peng, Jeffrey Quesnelle, Honglu Fan, Enrico Shippole, "YaRN: Efficient
Context Window Extension of Large Language Models", 2023, https://arxiv.org/abs/2309.00071.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from torch import Tensor

from attnbench.core.building_blocks import Rotary
from attnbench.extrapolation.model.tricks.base import ROTARY, YARN_ALPHA, YARN_BETA, At, Trick

if TYPE_CHECKING:
    from attnbench.extrapolation.model.tricks.base import Tricks


def yarn_freq_scale(
    dim: int,
    base: float,
    train_len: int,
    s: float,
    alpha: float = YARN_ALPHA,
    beta: float = YARN_BETA,
) -> Tensor:
    """YaRN's factor on each rotary frequency [D/2] (float64) for an extension s = n / L, the
    paper's equation: (1 - g) / s + g, g = clip((r - alpha) / (beta - alpha), 0, 1), r = L theta
    / (2 pi) the turns the pair makes over the training length. 1 everywhere for s <= 1."""
    theta = Rotary(dim, base=base).inv_freq()  # (D/2,) float64
    turns = train_len * theta / (2 * math.pi)  # (D/2,)
    g = ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (1 - g) / max(1.0, s) + g


def rotary(at: At) -> dict[str, Any]:
    row = at.row
    scale = yarn_freq_scale(at.head_dim, at.rope_base, row.train_len, at.s, row.yarn_alpha,
                            row.yarn_beta)  # fmt: skip
    return {"freq_scale": scale}


def settings(row: Tricks) -> str:
    return f"yarn_alpha={row.yarn_alpha:g}, yarn_beta={row.yarn_beta:g}"


TRICK = Trick(
    "yarn",
    "YaRN, the paper's equation: frequencies interpolated by parts, ramp in turns "
    "r = L/lambda (alpha, beta set for L = 4096: at L = 64 every pair is interpolated) "
    "+ scores x (0.1 ln(n/L) + 1)^2",
    family=ROTARY,
    holds=("temperature",),
    rotary=rotary,
    temperature=True,
    settings=settings,
)
