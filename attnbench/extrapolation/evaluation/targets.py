"""What an evaluation at length n scores, for either objective, as grids over the span's windows
(:class:`Targets`), and the position bins of the per-position view (:func:`position_bins`).

- Masked-language model (``mlm``): the input is the window with its masked bytes replaced by the
  [MASK] id; each masked position predicts its own byte.
- Causal language model (``clm``): the input is the window as it is; position t predicts byte
  t + 1, so a window of n bytes scores its last n - 1 bytes, each predicted by the position
  before it (which attends to t + 1 keys). Every byte of the span but each window's first is
  scored, the same bytes for every row at one n.

A row's position (its ``columns`` entry) is that of the hidden state read: the masked byte's own
(mlm), the predicting position t (clm). The per-position view bins them at L, 2L, 4L, ...: at
t >= L a causal query attends to more keys, and sees larger distances, than training ever showed
it; in a bidirectional encoder every query of a window longer than 2L sees distances beyond L, so
the bins there say where in the window a byte lies, not which queries are new.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnbench.extrapolation.model.encoder import MASK_ID


@dataclass(frozen=True)
class Targets:
    """One length's prediction problem over W windows of n tokens: [W, n] grids."""

    inputs: Tensor  # (W, n) long: what the model reads (mlm: masked bytes set to MASK_ID)
    rows: Tensor  # (W, n) bool: the positions whose hidden state predicts a byte
    targets: Tensor  # (W, n) long: at a row, the byte it predicts (0 elsewhere)
    places: Tensor  # (W, n) long: at a row, where that byte lies in the span (0 elsewhere)
    columns: Tensor  # (W, n) long: each position's index in its window

    @property
    def length(self) -> int:
        return self.inputs.shape[1]

    def __getitem__(self, index) -> Targets:
        """The same grids of some windows (a slice or index of the first dimension)."""
        return Targets(*(grid[index] for grid in self.grids()))

    def grids(self) -> tuple[Tensor, ...]:
        return self.inputs, self.rows, self.targets, self.places, self.columns


def make_targets(tokens: Tensor, mask: Tensor, places: Tensor, causal: bool) -> Targets:
    """The prediction problem of windows ``tokens`` [W, n] (long) whose span positions are
    ``places`` [W, n]: masked-byte prediction on ``mask`` [W, n], or next-byte prediction
    (``causal``; the mask is not used)."""
    W, n = tokens.shape
    columns = torch.arange(n).expand(W, n)
    if not causal:
        inputs = tokens.masked_fill(mask, MASK_ID)
        return Targets(inputs, mask, tokens, places, columns)
    rows = torch.zeros_like(mask)
    rows[:, :-1] = True  # (W, n): position t predicts byte t + 1
    targets = torch.zeros_like(tokens)
    targets[:, :-1] = tokens[:, 1:]
    where = torch.zeros_like(places)
    where[:, :-1] = places[:, 1:]
    return Targets(tokens, rows, targets, where, columns)


def chunked(problem: Targets, size: int) -> list[Targets]:
    """Each window cut into independent chunks of ``size`` tokens (the last may be shorter), the
    grids cut alike: the ``chunk`` row. A causal chunk's last position still predicts the next
    byte (the first of the next chunk) from its own chunk, so the scored bytes do not change."""
    W, n = problem.inputs.shape
    full = (n // size) * size
    parts = []
    if full:
        parts.append(Targets(*(g[:, :full].reshape(-1, size) for g in problem.grids())))
    if n > full:
        parts.append(problem[:, full:])
    return parts


def position_bins(n: int, train_len: int) -> list[tuple[int, int]]:
    """The per-position view's bins of window positions [start, end): [0, L), [L, 2L),
    [2L, 4L), ... up to n (one bin [0, n) at n <= L)."""
    edges = [0]
    edge = train_len
    while edge < n:
        edges.append(edge)
        edge *= 2
    edges.append(n)
    return list(zip(edges[:-1], edges[1:], strict=True))
