"""Floors to read the table against: predict each masked byte from counts, no model at all.

``count-baseline`` (:class:`MaskedContextCounts`) is the fair floor. It predicts a masked byte as
the byte seen most often with the same ``width`` neighbours on each side *as the model sees them*
(width 3 by default: the +-3 symbols around it), where a masked neighbour is the symbol [MASK] and a
position beyond the window's edge is the symbol EDGE, exactly the information the model's input
holds about those seven positions. The table is counted from the masked positions of the model's own
training batches (:class:`~attnbench.extrapolation.training.batches.TrainingBatches` under the
config's training options, seeded like the first training seed), so it is built from the very masked
examples the first seed's models were trained on, as many as they saw. Where a context never
occurred in those examples it backs off to +-(width - 1) symbols, down to +-0: the most frequent
masked byte.

``count-backoff`` (:class:`ContextCounts`) is the rule the table used first, kept as a second,
labelled row: counted over every position of the training text, keyed on visible bytes only, so it
backs off to a smaller context whenever any of the neighbours is masked or beyond the edge (about
63 % of the masked bytes at 15 % masking). It loses about ten points to the fair floor and so
flatters every model read against it.

``count-eval-masks`` is the same fair table counted on contexts masked at the evaluation rate
instead of the training rate (the same training windows drawn with the same seed, masked at
``eval.mask_prob``, and as many masked examples as the training-rate table): its contexts look
like the evaluation's, so where training masks more than the evaluation (the ``cpu`` preset: 40 %
against 15 %) it is the stricter floor. A run whose two rates are equal has only the one table.

Any model row below ``count-baseline`` has learned less about this text than a table of seven-symbol
counts built from the same examples; a claim of clearing the floor holds against the higher of the
two. Neither depends on n except through the window edges.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import Tensor

from attnbench.extrapolation.training.batches import TrainingBatches
from attnbench.extrapolation.training.options import TrainConfig

#: Symbols on each side of the masked byte the largest context uses.
WIDTH = 3
LABEL = "count-baseline"
EVAL_MASKS_LABEL = "count-eval-masks"
BACKOFF_LABEL = "count-backoff"
#: Context symbols besides the 256 byte values: a masked neighbour, a position beyond the edge.
MASKED, EDGE = 256, 257
SYMBOLS = 258


def describe(width: int = WIDTH) -> str:
    """The fair floor, :class:`MaskedContextCounts`."""
    return (
        f"no model: the byte most often seen with the same +-{width} neighbours as the model sees "
        "them ([MASK] and the window edge as symbols), counted over the masked positions of the "
        f"model's own training batches, backing off to +-{width - 1}..+-0 where a context was "
        "never counted"
    )


def describe_eval_masks(rate: float, width: int = WIDTH) -> str:
    """The fair floor counted at the evaluation's masking rate (``count-eval-masks``)."""
    return (
        f"no model: the same +-{width}-symbol table as count-baseline, counted on the model's own "
        f"training windows masked at the evaluation rate ({rate:.0%}) instead of the training "
        "rate, from as many masked examples"
    )


def describe_backoff(width: int = WIDTH) -> str:
    """The first rule, :class:`ContextCounts`."""
    return (
        f"no model: the byte most often seen between the same +-{width} visible bytes in the "
        f"training text, backing off to +-{width - 1}..+-0 whenever a neighbour is masked or "
        "beyond the edge"
    )


def _context_keys(data: np.ndarray, centres: np.ndarray, k: int) -> np.ndarray:
    """The 2k bytes around each centre position as one int64 (left bytes, then right)."""
    key = np.zeros(len(centres), dtype=np.int64)
    for offset in (*range(-k, 0), *range(1, k + 1)):
        key = key * 256 + data[centres + offset]
    return key


class ContextCounts:
    """For each width k = ``width``..0: every (left k, right k) context of the training text and
    its most frequent centre byte (ties: the smaller byte)."""

    def __init__(self, train: Tensor, width: int = WIDTH) -> None:
        if width < 0 or width > 3:
            raise ValueError(f"width {width}: 0..3 (a context of 2 x 3 bytes fills 48 bits)")
        data = train.numpy().astype(np.int64)
        self.width = width
        self.examples = len(data)  # every position of the training text
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for k in range(width, -1, -1):
            centres = np.arange(k, len(data) - k)
            if len(centres) == 0:
                continue
            self.tables[k] = _most_frequent(_context_keys(data, centres, k), data[centres])

    def predict(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """The predicted byte at every masked position of windows ``tokens`` [W, n] with
        ``mask`` [W, n] (True: masked, so unknown to the predictor); -1 elsewhere."""
        toks = tokens.numpy().astype(np.int64)
        hidden = mask.numpy()
        W, n = toks.shape
        flat, gone = toks.reshape(-1), hidden.reshape(-1)
        col = np.tile(np.arange(n), W)  # position inside its window
        todo = np.flatnonzero(gone)
        out = np.full(W * n, -1, dtype=np.int64)
        for k in range(self.width, -1, -1):
            if k not in self.tables or len(todo) == 0:
                continue
            inside = (col[todo] >= k) & (col[todo] < n - k)
            cand = todo[inside]
            for offset in (*range(-k, 0), *range(1, k + 1)):
                cand = cand[~gone[cand + offset]]  # every neighbour of the context visible
            if len(cand) == 0:
                continue
            keys = _context_keys(flat, cand, k)
            contexts, best = self.tables[k]
            at = np.searchsorted(contexts, keys)
            at_valid = np.minimum(at, len(contexts) - 1)
            seen = (at < len(contexts)) & (contexts[at_valid] == keys)
            out[cand[seen]] = best[at_valid[seen]]
            todo = np.setdiff1d(todo, cand[seen], assume_unique=True)
        return torch.from_numpy(out.reshape(W, n))

    def accuracy(self, tokens: Tensor, mask: Tensor) -> tuple[int, int]:
        """(correct, masked) over the masked positions of windows ``tokens`` [W, n]."""
        guess = self.predict(tokens, mask)
        return int((guess[mask] == tokens[mask].long()).sum()), int(mask.sum())


def context_symbols(
    tokens: np.ndarray, mask: np.ndarray, rows: np.ndarray, cols: np.ndarray, width: int
) -> np.ndarray:
    """The ``2 * width`` neighbours of positions (``rows``, ``cols``) of windows ``tokens``
    [W, n] as the model sees them: the byte, :data:`MASKED` where ``mask`` is set, :data:`EDGE`
    beyond the window. Left neighbours first (farthest first), then right (nearest first);
    [N, 2 * width] int16."""
    n = tokens.shape[1]
    offsets = np.array([*range(-width, 0), *range(1, width + 1)], dtype=np.int64)
    at = cols[:, None] + offsets  # (N, 2w)
    inside = (at >= 0) & (at < n)
    safe = np.clip(at, 0, n - 1)
    seen = np.where(mask[rows[:, None], safe], MASKED, tokens[rows[:, None], safe])
    return np.where(inside, seen, EDGE).astype(np.int16)  # 258 symbols; small at 25M examples


def _inner_keys(symbols: np.ndarray, k: int) -> np.ndarray:
    """The +-k inner symbols of each row of ``symbols`` [N, 2w] as one int64 (base 258)."""
    w = symbols.shape[1] // 2
    key = np.zeros(len(symbols), dtype=np.int64)
    for col in (*range(w - k, w), *range(w, w + k)):
        key = key * SYMBOLS + symbols[:, col].astype(np.int64)
    return key


class MaskedContextCounts:
    """The fair floor (module docstring): for each width k = ``width``..0, every +-k context of
    the counted masked examples as the model sees it, and its most frequent centre byte (ties: the
    smaller byte). ``examples`` is how many masked examples it was counted from."""

    def __init__(self, symbols: np.ndarray, centres: np.ndarray) -> None:
        if symbols.ndim != 2 or symbols.shape[1] % 2 or symbols.shape[1] > 2 * 3:
            raise ValueError(f"symbols of shape {symbols.shape}: [N, 2w] with w <= 3")
        self.width = symbols.shape[1] // 2
        self.examples = len(centres)
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for k in range(self.width, -1, -1):
            self.tables[k] = _most_frequent(_inner_keys(symbols, k), centres.astype(np.int64))

    @classmethod
    def from_training(
        cls,
        train: Tensor,
        cfg: TrainConfig,
        train_len: int,
        seed: int,
        width: int = WIDTH,
        examples: int | None = None,
    ) -> MaskedContextCounts:
        """Counted over the masked positions of the ``cfg.steps`` training batches that
        :func:`~attnbench.extrapolation.training.loop.train` draws with ``seed`` under ``cfg``
        (window lengths and planted copies included). With ``examples``: batches are drawn on
        past ``cfg.steps`` until exactly that many masked examples are counted (a table counted
        at a lower masking rate from the same example budget)."""
        batches = TrainingBatches(train, cfg, train_len, seed)
        parts, centres, counted, step = [], [], 0, 0
        while step < cfg.steps if examples is None else counted < examples:
            batch = batches.next()
            hidden = batch.mask.numpy()
            rows, cols = np.nonzero(hidden)
            parts.append(context_symbols(batch.inputs.numpy(), hidden, rows, cols, width))
            centres.append(batch.targets.numpy())
            counted, step = counted + len(rows), step + 1
        symbols, bytes_ = np.concatenate(parts), np.concatenate(centres)
        if examples is not None:
            symbols, bytes_ = symbols[:examples], bytes_[:examples]
        return cls(symbols, bytes_)

    @classmethod
    def at_eval_rate(
        cls, train: Tensor, cfg: TrainConfig, train_len: int, seed: int, eval_rate: float,
        examples: int,
    ) -> MaskedContextCounts:  # fmt: skip
        """``count-eval-masks``: the training windows of ``seed``, masked at ``eval_rate`` (one
        rate throughout), counted until ``examples`` masked examples (the training-rate table's
        count)."""
        at_rate = dataclasses.replace(cfg, mask_prob=eval_rate, final_mask_prob=0.0)
        return cls.from_training(train, at_rate, train_len, seed, examples=examples)

    def predict(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """The predicted byte at every masked position of windows ``tokens`` [W, n] with ``mask``
        [W, n] (True: masked); -1 elsewhere."""
        toks, hidden = tokens.numpy().astype(np.int64), mask.numpy()
        rows, cols = np.nonzero(hidden)
        symbols = context_symbols(toks, hidden, rows, cols, self.width)
        guess = np.full(len(rows), -1, dtype=np.int64)
        todo = np.arange(len(rows))
        for k in range(self.width, -1, -1):
            contexts, best = self.tables[k]
            if len(todo) == 0 or len(contexts) == 0:
                continue
            keys = _inner_keys(symbols[todo], k)
            at = np.minimum(np.searchsorted(contexts, keys), len(contexts) - 1)
            seen = contexts[at] == keys
            guess[todo[seen]] = best[at[seen]]
            todo = todo[~seen]
        out = np.full(toks.shape, -1, dtype=np.int64)
        out[rows, cols] = guess
        return torch.from_numpy(out)

    def accuracy(self, tokens: Tensor, mask: Tensor) -> tuple[int, int]:
        """(correct, masked) over the masked positions of windows ``tokens`` [W, n]."""
        guess = self.predict(tokens, mask)
        return int((guess[mask] == tokens[mask].long()).sum()), int(mask.sum())


def _most_frequent(keys: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique ``keys`` and, per key, its most frequent centre byte (ties: the smaller)."""
    pairs, counts = np.unique(keys * 256 + centres, return_counts=True)
    context, byte = pairs // 256, pairs % 256
    order = np.lexsort((byte, -counts, context))
    context, byte = context[order], byte[order]
    first = np.ones(len(context), dtype=bool)
    first[1:] = context[1:] != context[:-1]
    return context[first], byte[first]
