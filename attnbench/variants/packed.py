"""Packed batches through the dense references (:mod:`attnbench.core.varlen`): the whole packed
row at once, with a block-diagonal mask that keeps every query inside its own sequence. The
``varlen`` entry of the softmax references (softmax, MQA, GQA): T x T scores, as a reference
builds n x n, and the oracle a packed path is judged by besides the loop over sequences."""

from __future__ import annotations

from torch import Tensor

from attnbench.core.varlen import block_diagonal
from attnbench.variants.dense import softmax_attention


def masked_reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, offsets: Tensor) -> Tensor:
    """Dense softmax over the packed row, pairs across sequences masked. q [1, H, T, D]."""
    return softmax_attention(q, k, v, mask=block_diagonal(offsets, causal))
