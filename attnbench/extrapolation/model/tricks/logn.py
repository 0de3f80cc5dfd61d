"""``logn``: scores times max(1, log n_i / log L)^p, n_i the keys query i sees: Su 2021's log_L n,
clipped as Su 2021 advises for use beyond the trained length (Qwen's logn-attn). ``logn^P`` sets
the power p (``logn`` is p = 1): ``logn^2`` is a sharper length temperature.

Su 2021: Su Jianlin, "Looking at attention's scale operation from entropy invariance (in Chinese)",
2021, https://kexue.fm/archives/8823.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbench.extrapolation.model.tricks.base import LOGN_POWER_PREFIX, Trick, everywhere

if TYPE_CHECKING:
    from attnbench.extrapolation.model.tricks.base import Tricks


def spelled(row: Tricks) -> str:
    return f"{LOGN_POWER_PREFIX}{row.logn_power:g}" if row.logn_power != 1 else "logn"


def settings(row: Tricks) -> str:
    return f"p={row.logn_power:g}"


TRICK = Trick(
    "logn",
    "scores x max(1, log n / log L)^p (Su 2021's log_L n, clipped; logn^P: p = P)",
    log_scaled=everywhere,
    spelled=spelled,
    settings=settings,
)
