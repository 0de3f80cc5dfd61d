"""``local``: query i sees keys j with abs(i - j) <= local_window (L/2 by default), as a dense -inf
mask (the SDPA path takes it as a boolean mask)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbench.extrapolation.model.tricks.base import Trick, everywhere

if TYPE_CHECKING:
    from attnbench.extrapolation.model.tricks.base import Tricks

SUMMARY = "local window: each query sees keys within +-local_window (L/2)"


def describe(row: Tricks) -> str:
    return SUMMARY.replace("(L/2)", f"({row.local_window})")


def settings(row: Tricks) -> str:
    return f"local_window={row.local_window}"


TRICK = Trick("local", SUMMARY, windowed=everywhere, describe=describe, settings=settings)
