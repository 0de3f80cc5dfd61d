"""AFT-simple: no position bias (Zhai et al. 2021).

    Y[t] = sigmoid(Q[t]) * sum_t' softmax(K, over t')[t'] * V[t']

Bidirectional, the sum is one pooled vector per (batch, head, feature) shared by every query:
O(T d). Causal (t' <= t), it is a prefix sum, computed by the exactly stabilised tree scan of
:mod:`attnbench.variants.aft.softmax_sums` (each row's own running maximum, no loop over T).
Both stabilise by actual maxima of K, so every denominator is >= 1 (no 0/0 for any finite input);
half inputs are summed in float32 and the output cast back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnbench.core import sources
from attnbench.core.precision import float32_sums
from attnbench.core.spec import Mechanism, PathSpec, Shape
from attnbench.variants.aft.common import check_elementwise
from attnbench.variants.aft.decode import SIMPLE
from attnbench.variants.aft.dense import aft_dense
from attnbench.variants.aft.layer import aft_layer, no_bias, same_at_every_length
from attnbench.variants.aft.softmax_sums import average, leaves, prefix_scan


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """Dense AFT with a zero bias. q, k, v: [B, H, T, D] -> [B, H, T, D]."""
    t = q.shape[-2]
    return aft_dense(q, k, v, torch.zeros(t, t, dtype=q.dtype, device=q.device), causal=causal)


@float32_sums(name="aft-simple:efficient")
def pooled(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """Global (or prefix) softmax pooling. q, k, v: [B, H, T, D] -> [B, H, T, D]."""
    if causal:
        avg = average(prefix_scan(leaves(k, v)))  # (B, H, T, D)
    else:
        avg = (torch.softmax(k, dim=-2) * v).sum(-2, keepdim=True)  # (B, H, 1, D)
    return torch.sigmoid(q) * avg


def flops(shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
    """4 per (key, feature): one term in each of the two sums (see aft.common)."""
    return 4 * shape.batch * shape.heads * shape.seq_len * shape.head_dim


MECHANISM = Mechanism(
    name="aft-simple",
    family="aft",
    description="AFT without position bias: sigmoid(Q) * sum softmax_t(K) * V",
    sources=(sources.ZHAI_2021,),
    paths=(
        PathSpec("reference", "reference", reference, memory="O(n^2 d)"),
        PathSpec(
            "efficient",
            "efficient",
            pooled,
            memory="O(n d)",
            note="global softmax pooling; causal: exactly stabilised prefix tree scan",
        ),
    ),
    check_inputs=check_elementwise,
    flops=flops,
    decode=(SIMPLE,),
    layer=aft_layer(no_bias, same_at_every_length),
    time="O(n d)",
    memory="O(n d)",
)
