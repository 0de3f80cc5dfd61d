"""A floor to read the table against: predict each masked byte from counts, no model at all.

``count-baseline`` predicts a masked byte as the byte seen most often, in the *training* text,
between the same ``width`` bytes on its left and on its right (width 3 by default: the +-3 bytes
around it). Where those are not all visible (a neighbour is itself masked, or beyond the window's
edge) or that context never occurred in training, it backs off to +-(width - 1) bytes, down to
+-0: the most frequent byte of the training text. It reads the same windows and the same masks as
every model row, so at each length n it is scored on exactly the masked positions the models are.

Any model row below it has learned less about this text than a table of seven-byte counts; rows
above it by how much say what the attention adds. It does not depend on n except through the
window edges (a position within ``width`` of an edge has fewer visible neighbours).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

#: Bytes on each side of the masked byte the largest context uses.
WIDTH = 3
LABEL = "count-baseline"


def describe(width: int = WIDTH) -> str:
    return (
        f"no model: the byte most often seen between the same +-{width} visible bytes in the "
        f"training text, backing off to +-{width - 1}..+-0"
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
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for k in range(width, -1, -1):
            centres = np.arange(k, len(data) - k)
            if len(centres) == 0:
                continue
            keys = _context_keys(data, centres, k)
            pairs, counts = np.unique(keys * 256 + data[centres], return_counts=True)
            context, byte = pairs // 256, pairs % 256
            # Per context, the byte with the most counts: sort by (context, -count, byte).
            order = np.lexsort((byte, -counts, context))
            context, byte = context[order], byte[order]
            first = np.ones(len(context), dtype=bool)
            first[1:] = context[1:] != context[:-1]
            self.tables[k] = (context[first], byte[first])

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
