"""The fair count floor (``count-baseline``) against a plain-Python count table written here."""

from collections import Counter, defaultdict

import numpy as np
import torch

from attnbench.extrapolation.evaluation import floors as baseline
from attnbench.extrapolation.training.batches import BatchSampler
from attnbench.extrapolation.training.options import TrainConfig

EDGE, MASK = "E", "M"


def seen(window, hidden, i, j):
    """Position j of a window as the model sees it."""
    if j < 0 or j >= len(window):
        return EDGE
    return MASK if hidden[j] else int(window[j])


def context(window, hidden, i, k):
    return tuple(seen(window, hidden, i, j) for j in (*range(i - k, i), *range(i + 1, i + k + 1)))


def plain_table(windows, masks, width):
    """{k: {context: most frequent centre (ties: smaller byte)}} over every masked position."""
    counts = {k: defaultdict(Counter) for k in range(width + 1)}
    for window, hidden in zip(windows, masks, strict=True):
        for i in range(len(window)):
            if hidden[i]:
                for k in range(width + 1):
                    counts[k][context(window, hidden, i, k)][int(window[i])] += 1
    return {
        k: {c: min(cnt, key=lambda b: (-cnt[b], b)) for c, cnt in table.items()}
        for k, table in counts.items()
    }


def plain_predict(table, window, hidden, i, width):
    for k in range(width, -1, -1):
        c = context(window, hidden, i, k)
        if c in table[k]:
            return table[k][c]
    return -1


def test_predictions_match_a_plain_count_table():
    gen = torch.Generator().manual_seed(0)
    text = torch.randint(
        0, 4, (3000,), generator=gen, dtype=torch.uint8
    )  # 4 symbols: contexts recur
    width, length, batch, prob, steps = 3, 16, 8, 0.3, 20
    cfg = TrainConfig(batch=batch, mask_prob=prob, steps=steps)
    floor = baseline.MaskedContextCounts.from_training(text, cfg, length, seed=5)

    sampler = BatchSampler(text, length, batch, prob, 5)
    windows, masks = [], []
    for _ in range(steps):
        inputs, targets, mask = sampler.next()
        full = inputs.clone()
        full[mask] = targets
        windows += list(full.numpy())
        masks += list(mask.numpy())
    assert floor.examples == sum(int(m.sum()) for m in masks)
    table = plain_table(windows, masks, width)

    tokens = torch.randint(0, 4, (6, 23), generator=gen)
    mask = torch.rand(tokens.shape, generator=gen) < 0.3
    got = floor.predict(tokens, mask)
    for w in range(tokens.shape[0]):
        for i in range(tokens.shape[1]):
            want = plain_predict(table, tokens[w].numpy(), mask[w].numpy(), i, width)
            assert int(got[w, i]) == (want if mask[w, i] else -1), (w, i)


def test_masked_and_edge_neighbours_are_symbols_not_backoff():
    """The window edge and a masked neighbour are part of the key: a context seen only with a
    masked neighbour is predicted from that context, not from a shorter one."""
    tokens = np.array([[7, 1, 2, 3, 4, 5, 6]])
    mask = np.array([[False, False, True, True, False, False, False]])
    rows, cols = np.array([0, 0]), np.array([2, 0])
    got = baseline.context_symbols(tokens, mask, rows, cols, 3)
    assert got[0].tolist() == [baseline.EDGE, 7, 1, baseline.MASKED, 4, 5]
    assert got[1].tolist() == [baseline.EDGE] * 3 + [1, baseline.MASKED, baseline.MASKED]


def test_the_fair_floor_reads_a_context_the_backoff_rule_cannot():
    # "ab?d" always has centre c when the right neighbour is masked: the fair table learns it,
    # the visible-bytes rule backs off to +-0.
    symbols = np.array([[0, 1, 2, baseline.MASKED, 4, 5]] * 5 + [[9, 9, 9, 9, 9, 9]] * 9)
    centres = np.array([2] * 5 + [8] * 9)
    floor = baseline.MaskedContextCounts(symbols, centres)
    tokens = torch.tensor([[0, 1, 2, 6, 3, 4, 5]])
    mask = torch.tensor([[False, False, False, True, True, False, False]])
    assert floor.predict(tokens, mask)[0, 3] == 2
    assert floor.examples == 14
