"""The long-range span: masked bytes that can be recovered by reading far back, and only so.

On the standard span a window of 65 keys scores within 1-2 points of full attention, so a row can
do well beyond the training length by ignoring distant text; the standard table cannot tell "not
hurt by a longer context" from "reads it". Su evaluates ReRoPE on text whose second half repeats
the first (Su 2023, "Transformer升级之路：12、无限外推的ReRoPE？", https://kexue.fm/archives/9708).
This span does the same at chosen distances.

Each window of length n of the standard span (the same text and the same masks as the main table)
gets a verbatim copy of one of its own earlier pieces at distance d: the m = min(``length``, d -
GAP, n - d) bytes at a - d .. a - d + m - 1 (a drawn per window, a in [d, n - m]) are written again
at a .. a + m - 1, over what was there. Masks are left as they are, so the model's input is masked
exactly as in training (each byte with probability ``mask_prob``). Accuracy is scored only on the
*recoverable* bytes of the copy: masked, and with the byte d before them visible.

The control, the *no-copy level*, is the same window with the two pieces swapped instead: the
copied bytes stand at a .. a + m - 1 with the same targets and the same near neighbours (the GAP =
4 bytes before the copy are original text in both: the source piece ends before them), but the
source place holds the text that was at a, so there is nothing to copy from. Each (row, n) costs
two forward passes per distance (copy and control) beside the standard span's one. The difference
between the two is what reading d back is worth; a row that reads only a window falls to the no-
copy level once d is beyond its window, a row that extrapolates keeps copying.

The training option that gives models the skill at all (``train.copy_share``, default off: the
published experiment is unchanged) plants the same kind of copy in a share of the training
windows at distances below L; ``train.copy_weight`` weights the copies' recoverable bytes in the
training loss (both in :mod:`attnbench.extrapolation.training.copies`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnbench.extrapolation.model.encoder import MASK_ID
from attnbench.extrapolation.model.positions import EvalPositions
from attnbench.extrapolation.training.copies import MIN_COPY, Copies, plant

#: Bytes copied per window (at most n - d).
COPY_LENGTH = 64
#: Distances d evaluated (those with d + MIN_COPY <= n at each length n).
DISTANCES = (16, 32, 48, 96, 192, 384, 768)
SPAN = "long-range"


def distances_at(
    n: int, distances: Sequence[int] = DISTANCES, min_copy: int = MIN_COPY
) -> list[int]:
    """The distances evaluated at length n: room for a copy of at least ``min_copy`` bytes."""
    return [d for d in distances if d >= 1 and d + min_copy <= n]


def recoverable(copies: Copies, mask: Tensor) -> Tensor:
    """[W, n] bool: masked bytes of the copied region whose byte ``distance`` back is visible."""
    back = torch.zeros_like(mask)
    back[:, copies.distance :] = ~mask[:, : -copies.distance]
    return mask & copies.region & back


@torch.no_grad()
def hits(
    model: nn.Module,
    tokens: Tensor,
    mask: Tensor,
    scored: Tensor,
    *,
    chunk: int | None = None,
    batch_tokens: int = 4096,
    positions: EvalPositions | None = None,
) -> Tensor:
    """[W, n] bool: where ``model``, reading windows ``tokens`` [W, n] with the ``mask``
    positions given as [MASK], predicts the byte right, at the ``scored`` positions (a subset of
    the mask; False elsewhere). ``chunk``: each window run as independent chunks of that many
    tokens (the O+chunk row). ``positions``: the windows' (or chunks') rotary positions for a
    model trained with randomized positions; None: 0..n-1."""
    if bool((scored & ~mask).any()):
        raise ValueError("scored positions must be masked")
    model.eval()
    shape = tokens.shape
    if chunk and chunk < shape[1]:
        full = shape[1] // chunk * chunk  # whole chunks, then the shorter tail, as evaluate does
        parts = [(0, full, chunk)] + (
            [(full, shape[1], shape[1] - full)] if full < shape[1] else []
        )
        return torch.cat(
            [
                hits(model, *(_chunked(t[:, lo:hi], size) for t in (tokens, mask, scored)),
                     batch_tokens=batch_tokens, positions=positions).view(shape[0], hi - lo)
                for lo, hi, size in parts
            ],
            dim=1,
        )  # fmt: skip
    device = next(model.parameters()).device
    out = torch.zeros(tokens.shape, dtype=torch.bool)
    per_batch = max(1, batch_tokens // tokens.shape[1])
    rotary = positions.draw(*tokens.shape) if positions is not None else None  # (W, n) or None
    for b0 in range(0, tokens.shape[0], per_batch):
        rows = slice(b0, b0 + per_batch)
        x, xm, xs = (t[rows].to(device) for t in (tokens, mask, scored))
        if not bool(xs.any()):
            continue
        at = rotary[rows].to(device) if rotary is not None else None
        hidden = model.hidden_at(x.masked_fill(xm, MASK_ID), xs, at)  # (N, C)
        right = (model.logits(hidden).argmax(-1) == x[xs]).cpu()  # (N,)
        block = out[rows]
        block[xs.cpu()] = right
        out[rows] = block
    return out.view(shape)


def score(model: nn.Module, tokens: Tensor, mask: Tensor, scored: Tensor, **kw) -> tuple[int, int]:
    """(correct, scored) of :func:`hits`."""
    right = hits(model, tokens, mask, scored, **kw)
    return int(right[scored].sum()), int(scored.sum())


def _chunked(t: Tensor, size: int) -> Tensor:
    """Windows [W, n] as independent pieces of ``size`` (n a multiple of size)."""
    W, n = t.shape
    return t.reshape(W * (n // size), size)


@dataclass(frozen=True)
class LongRangeResult:
    """One (length, distance) cell: accuracy on the copy and on the same bytes without it."""

    n: int
    distance: int
    length: int  # bytes copied per window
    scored: int
    correct: int
    no_copy_correct: int

    @property
    def accuracy(self) -> float:
        return 100.0 * self.correct / max(1, self.scored)

    @property
    def no_copy_accuracy(self) -> float:
        return 100.0 * self.no_copy_correct / max(1, self.scored)


def evaluate_long_range(
    model: nn.Module,
    tokens: Tensor,
    mask: Tensor,
    *,
    seed: int,
    length: int = COPY_LENGTH,
    distances: Sequence[int] = DISTANCES,
    chunk: int | None = None,
    batch_tokens: int = 4096,
    positions: EvalPositions | None = None,
) -> list[LongRangeResult]:
    """Every distance of :func:`distances_at` on windows ``tokens`` [W, n] with ``mask``: the
    copy planted with a generator seeded by ``seed`` and the distance (the same copies for every
    row and training seed), scored with and without it."""
    n = tokens.shape[1]
    kw = {"chunk": chunk, "batch_tokens": batch_tokens, "positions": positions}
    out = []
    for d in distances_at(n, distances):
        gen = torch.Generator().manual_seed((seed * 100_003 + d) % 2**63)
        copies = plant(tokens, d, length, gen)
        scored = recoverable(copies, mask)
        correct, total = score(model, copies.tokens, mask, scored, **kw)
        no_copy, _ = score(model, copies.control, mask, scored, **kw)
        out.append(LongRangeResult(n, d, copies.length, total, correct, no_copy))
    return out
