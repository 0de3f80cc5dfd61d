"""The causal objective's fair floor: predict each next byte from counts, no model at all.

``count-baseline`` of a ``clm`` run (:class:`NextByteCounts`) is the causal counterpart of the
masked-language model's mask-aware count table (:mod:`.floors`): it predicts the byte after
position t as the byte seen most often after the same ``width`` previous bytes *as the model sees
them* (positions before the window's start are the symbol EDGE: a causal model knows how far it
is from its window's first byte), counted over the model's own training examples (every position
of the first seed's training batches, drawn by
:class:`~attnbench.extrapolation.training.batches.TrainingBatches` under the config's training
options), so from exactly as many examples as each model was trained on. Where a context never
occurred it backs off to the last ``width - 1`` bytes, down to none: the most frequent byte.
``width`` is 6 by default, the same number of context symbols as the masked floor's +-3.

A model row below it has learned less about this text than a table of six-byte contexts counted
from the same examples. It does not depend on n except through the window's first ``width``
positions.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from attnbench.extrapolation.evaluation.floors import EDGE, SYMBOLS, _most_frequent
from attnbench.extrapolation.training.batches import TrainingBatches
from attnbench.extrapolation.training.options import TrainConfig

#: Previous bytes the largest context uses (6 base-258 symbols and the byte fit an int64 key).
WIDTH = 6


def describe(width: int = WIDTH) -> str:
    """The causal fair floor, :class:`NextByteCounts`."""
    return (
        f"no model: the byte most often seen after the same {width} previous bytes as the model "
        "sees them (the window's start as a symbol), counted over every position of the model's "
        f"own training batches, backing off to {width - 1}..0 bytes where a context was never "
        "counted"
    )


def previous_symbols(tokens: np.ndarray, rows: np.ndarray, cols: np.ndarray, width: int):
    """The ``width`` bytes up to and including position (``rows``, ``cols``) of windows
    ``tokens`` [W, n], farthest first, :data:`EDGE` before the window's start: [N, width] int16."""
    at = cols[:, None] + np.arange(-width + 1, 1, dtype=np.int64)  # (N, w)
    seen = tokens[rows[:, None], np.clip(at, 0, None)]
    return np.where(at >= 0, seen, EDGE).astype(np.int16)


def _last_keys(symbols: np.ndarray, k: int) -> np.ndarray:
    """The last (nearest) k symbols of each row of ``symbols`` [N, w] as one int64 (base 258)."""
    key = np.zeros(len(symbols), dtype=np.int64)
    for col in range(symbols.shape[1] - k, symbols.shape[1]):
        key = key * SYMBOLS + symbols[:, col].astype(np.int64)
    return key


class NextByteCounts:
    """For each k = ``width``..0: every k-byte context of the counted examples as the model sees
    it, and its most frequent next byte (ties: the smaller byte). ``examples``: how many."""

    def __init__(self, symbols: np.ndarray, nexts: np.ndarray) -> None:
        if symbols.ndim != 2 or symbols.shape[1] > WIDTH:
            raise ValueError(f"symbols of shape {symbols.shape}: [N, w] with w <= {WIDTH}")
        self.width = symbols.shape[1]
        self.examples = len(nexts)
        self.tables = {
            k: _most_frequent(_last_keys(symbols, k), nexts.astype(np.int64))
            for k in range(self.width, -1, -1)
        }

    @classmethod
    def from_training(
        cls, train: Tensor, cfg: TrainConfig, train_len: int, seed: int, width: int = WIDTH
    ) -> NextByteCounts:
        """Counted over every position of the ``cfg.steps`` next-byte batches that training
        draws with ``seed`` under ``cfg`` (window lengths included)."""
        batches = TrainingBatches(train, cfg, train_len, seed, causal=True)
        parts, nexts = [], []
        for _ in range(cfg.steps):
            batch = batches.next()
            inputs = batch.inputs.numpy()
            rows, cols = np.nonzero(batch.mask.numpy())
            parts.append(previous_symbols(inputs, rows, cols, width))
            nexts.append(batch.targets.numpy().astype(np.int16))
        return cls(np.concatenate(parts), np.concatenate(nexts))

    def predict(self, tokens: Tensor, rows: Tensor) -> Tensor:
        """The predicted next byte after every position of windows ``tokens`` [W, n] where
        ``rows`` [W, n] is set (-1 elsewhere)."""
        toks = tokens.numpy().astype(np.int64)
        r, c = np.nonzero(rows.numpy())
        symbols = previous_symbols(toks, r, c, self.width)
        guess = np.full(len(r), -1, dtype=np.int64)
        todo = np.arange(len(r))
        for k in range(self.width, -1, -1):
            contexts, best = self.tables[k]
            if len(todo) == 0 or len(contexts) == 0:
                continue
            keys = _last_keys(symbols[todo], k)
            at = np.minimum(np.searchsorted(contexts, keys), len(contexts) - 1)
            seen = contexts[at] == keys
            guess[todo[seen]] = best[at[seen]]
            todo = todo[~seen]
        out = np.full(toks.shape, -1, dtype=np.int64)
        out[r, c] = guess
        return torch.from_numpy(out)

    def accuracy(self, tokens: Tensor, rows: Tensor, targets: Tensor) -> tuple[int, int]:
        """(correct, scored) over the ``rows`` of windows ``tokens`` [W, n], each predicting its
        entry of ``targets`` [W, n]."""
        guess = self.predict(tokens, rows)
        return int((guess[rows] == targets[rows].long()).sum()), int(rows.sum())
