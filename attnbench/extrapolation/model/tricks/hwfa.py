"""``hwfa``: HWFA (Su 2023, HWFA; Su 2023, HWFA meets ReRoPE): keys within +-local_window in every
layer but the last, full attention scaled by max(1, log n / log L) in the last: global through depth
only. Su trains HWFA's last layer without positions (NoPE); the O weights here have RoPE in every
layer, so the last keeps it (``hwfa+rerope`` clips it: the second post's pairing). Plain O for n <=
min(local_window + 1, L). Needs each mixer's layer index and the layer count.

Su 2023, HWFA: Su Jianlin, "Transformer升级之路：9、一种全局长度外推的新思路" (a new idea for
global length extrapolation), 2023, https://kexue.fm/archives/9603.
Su 2023, HWFA meets ReRoPE: Su Jianlin, "Transformer升级之路：14、当HWFA遇见ReRoPE", 2023,
https://kexue.fm/archives/9731.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbench.extrapolation.model.tricks.base import At, Trick

if TYPE_CHECKING:
    from attnbench.extrapolation.model.tricks.base import Tricks

SUMMARY = (
    "HWFA: keys within +-local_window (L/2) in every layer but the last, full attention "
    "x max(1, log n / log L) in the last (global through depth only)"
)


def windowed(at: At) -> bool:
    return not at.last_layer


def log_scaled(at: At) -> bool:
    return at.last_layer


def describe(row: Tricks) -> str:
    return SUMMARY.replace("(L/2)", f"({row.local_window})")


def settings(row: Tricks) -> str:
    return f"local_window={row.local_window}"


TRICK = Trick(
    "hwfa",
    SUMMARY,
    holds=("local", "logn"),
    windowed=windowed,
    log_scaled=log_scaled,
    needs_layers=True,
    describe=describe,
    settings=settings,
)
