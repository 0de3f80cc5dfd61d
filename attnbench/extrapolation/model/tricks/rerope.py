"""``rerope``: relative positions clipped to +-w: ReRoPE (Su 2023, ReRoPE). It needs the scores with
and without rotation, so it is dense and evaluation-only. Any w >= 1 works; w = L keeps every
trained distance 0..L-1 (farther keys sit at L), w >= n - 1 is plain RoPE. w is the run's
``rerope_window`` (L/2 by default), or the row's own: ``rerope@W`` sets w = W for that row only
(``rerope@63+logn`` beside ``rerope+logn``).

Su 2023, ReRoPE: Su Jianlin, "Transformer升级之路：12、无限外推的ReRoPE？" (ReRoPE, infinite
extrapolation), 2023, https://kexue.fm/archives/9708, with the code https://github.com/bojone/
rerope (``rerope_patch.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnbench.extrapolation.model.positions import rotate
from attnbench.extrapolation.model.tricks.base import (
    RELATIVE,
    At,
    Trick,
    beyond_window,
    window_setting,
    window_spelled,
    window_text,
)

if TYPE_CHECKING:
    from attnbench.core.building_blocks import Rotary
    from attnbench.extrapolation.model.tricks.base import Tricks

SUMMARY = "ReRoPE: relative positions clipped at +-rerope_window (L/2; rerope@W: W)"


def remap(at: At, q: Tensor, k: Tensor, rot: Rotary, s: Tensor) -> Tensor:
    """Beyond +-w the score at relative position +-w: the score at r = i - j is rotate(q, r) . k,
    r clipped to [-w, w]."""
    w = at.row.rerope_window
    far = rot.angles(torch.tensor([float(w), float(-w)])).to(q.device)  # (2, D/2)
    s_pos = rotate(q, far[:1]) @ k.transpose(-2, -1)  # (B, H, T, T), r = +w
    s_neg = rotate(q, far[1:]) @ k.transpose(-2, -1)  # (B, H, T, T), r = -w
    return beyond_window(q, w, s, s_pos, s_neg)


def spelled(row: Tricks) -> str:
    return window_spelled("rerope", row)


def describe(row: Tricks) -> str:
    return window_text(row, "rerope", SUMMARY)


TRICK = Trick(
    "rerope",
    SUMMARY,
    family=RELATIVE,
    remap=remap,
    spelled=spelled,
    describe=describe,
    settings=window_setting,
)
