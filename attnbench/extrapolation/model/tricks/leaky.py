"""``leaky``: Leaky ReRoPE (Su 2023, ReRoPE): r kept when abs(r) < w, else sign(r) (w + (abs(r) -
w) / k). The score at a fractional relative position comes from q rotated to (i +- w (k - 1)) / k
and k rotated to j / k (Su's own code): three score matrices, dense, evaluation-only. w as for
``rerope`` (the run's ``rerope_window``, or the row's ``leaky@W``).

k = ``leaky_k``; by default (leaky_k = 0) k depends on n: k = max(1, (n - 1 - w) / (L - 1 - w)), the
least compression that maps the farthest key (abs(r) = n - 1) to L - 1, inside the trained range.
Su's patch keeps that range too (L = 4096, w = 512, k = 16 and 16k tokens: the farthest key lands
at 1504), but a fixed k = 16 at L = 64, w = 32 leaves it beyond n = 529; needs w < L - 1 when k is
chosen per n.

Su 2023, ReRoPE: Su Jianlin, "Transformer升级之路：12、无限外推的ReRoPE？" (ReRoPE, infinite
extrapolation), 2023, https://kexue.fm/archives/9708, with the code https://github.com/bojone/
rerope (``leaky_rerope_patch.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.model.positions import rotate
from attnbench.extrapolation.model.tricks.base import (
    LEAKY_AUTO,
    RELATIVE,
    WINDOW_MARK,
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

SUMMARY = (
    "Leaky ReRoPE: relative positions beyond +-rerope_window (L/2; leaky@W: W) compressed by 1/k"
)


def remap(at: At, q: Tensor, k: Tensor, rot: Rotary, s: Tensor) -> Tensor:
    """Beyond +-w the score at relative position +-(w + (abs(r) - w) / k). Query i rotated to
    (i +- w (k - 1)) / k and key j to j / k give exactly that (Su's code): ReRoPE's clipping is
    the limit k -> inf. At k = 1 (n short enough) the scores are RoPE's, as they are."""
    T, w = q.shape[-2], at.row.rerope_window
    lk = at.row.leaky_factor(T)
    if lk == 1:
        return s
    pos = torch.arange(T, dtype=torch.float64)  # (T,)
    k_rot = rotate(k, rot.angles(pos / lk).to(q.device))  # (B, H, T, D), key j at j / k
    shift = w * (lk - 1)
    q_pos = rotate(q, rot.angles((pos + shift) / lk).to(q.device))  # (B, H, T, D)
    q_neg = rotate(q, rot.angles((pos - shift) / lk).to(q.device))  # (B, H, T, D)
    s_pos = q_pos @ k_rot.transpose(-2, -1)  # (B, H, T, T), r >= w
    s_neg = q_neg @ k_rot.transpose(-2, -1)  # (B, H, T, T), r <= -w
    return beyond_window(q, w, s, s_pos, s_neg)


def check(row: Tricks, text: str) -> None:
    """With k chosen per n, the farthest key maps to L - 1, which needs w < L - 1; the error
    names the row's ``@W`` or the run's ``rerope_window``, whichever set w."""
    limit = row.train_len - 1
    if row.leaky_k != LEAKY_AUTO or row.rerope_window < limit:
        return
    what, smaller = "rerope_window", "a smaller rerope_window"
    if row.window_from_row:
        what, smaller = f"leaky{WINDOW_MARK}W", f"leaky{WINDOW_MARK}W with W < {limit}"
    raise AttnbenchError(
        f"evaluation-time row {text!r}: leaky with k chosen per n maps the farthest key to "
        f"L - 1 = {limit}, which needs {what} < {limit} (it is {row.rerope_window}); accepted: "
        f"{smaller}, or leaky_k >= 1"
    )


def spelled(row: Tricks) -> str:
    return window_spelled("leaky", row)


def describe(row: Tricks) -> str:
    return window_text(row, "leaky", SUMMARY)


def settings(row: Tricks) -> str:
    per_n = "per n, (n - 1 - w) / (L - 1 - w)"
    k = per_n if row.leaky_k == LEAKY_AUTO else f"{row.leaky_k:g}"
    return f"{window_setting(row)}, leaky_k={k}"


TRICK = Trick(
    "leaky",
    SUMMARY,
    family=RELATIVE,
    remap=remap,
    spelled=spelled,
    describe=describe,
    settings=settings,
    check=check,
)
