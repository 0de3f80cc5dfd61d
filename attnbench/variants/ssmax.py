"""Scalable-Softmax (SSMax): softmax(s_h log(n_i) q_i.k_j / sqrt(d)) V (Nakanishi 2025).

SSMax replaces softmax(z) over n scores by n^(s z) / sum_j n^(s z_j) = softmax(s log(n) z): the
base of the exponential grows with the number of scores, so the largest weight does not fade
towards 0 as n grows. In attention z = q.k / sqrt(d) (the 1/sqrt(d) stays; SSMax only replaces
the softmax, and is implemented by scaling q by s log n), n is the number of keys the query sees
(T bidirectional, i + 1 for the i-th query causal) and the log is natural. s is a learned scalar
per head (the paper: per layer and head), an extra input ``s`` [H] here.

``bias=True`` is the paper's variant with a learned bias per head, softmax((s log n + b) z),
an extra input ``b`` [H]; off by default (the paper's SSMax has none).

Initialisation: a layer starts at s = 1/log(L), L its ``max_len`` (the training length in the
extrapolation experiment), and b = 0, so that at n = L the factor s log n is 1 and the layer
starts as plain softmax(q.k / sqrt(d)) there: attnbench's choice, not taken from the paper.

In a bidirectional encoder trained at one length L, log n = log L in every row of every step:
s still receives gradient, but only as a learned temperature per head (s log L / sqrt(d) is all
the model sees), and the log n matters only at other lengths, where the factor becomes
s log(n) = (s log L) log_L(n): Attention-E with base L times that learned temperature. In a
causal model n_i = i + 1 varies along every sequence, so the log n shape is trained too.

Paths: ``reference`` builds the n x n scores; ``efficient`` folds the per-(head, row) factor
into q and calls SDPA with scale 1, as softmax-logn does. Both run half inputs in float32 and
round the output once. The reason is the gradient of s: it is sum_i log(n_i) q_i . dq'_i / sqrt(d)
over every row (dq' the gradient of the folded q), a sum that cancels heavily (measured: the sum
of its terms' magnitudes 190-470 times its value, T = 515, q x5), so the dq' of a float16 kernel,
right to 1-2 ulps, gave ds 5-15 % off. For the same reason there are no ``sdpa-*`` paths pinned to
a half-precision fused kernel, and no FlexAttention path (the flex paths also take no tensor
parameters: they cache their score_mod by parameter value).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.core import sources
from attnbench.core.errors import AttnbenchError
from attnbench.core.precision import float32_sums
from attnbench.core.spec import ExtraInput, Mechanism, Param, PathSpec
from attnbench.variants.dense import causal_mask, keys_seen, softmax_attention
from attnbench.variants.softmax_decode import cache_forms, ssmax_scale

#: Spread of ``s`` in test inputs (``make_inputs``): learned values sit around 1/log(L),
#: 0.1-0.3 for L = 32-4096; a larger spread also tries sharp heads and negative s.
S_TEST_STD = 0.5


def initial_scale(dims: tuple[int, ...], max_len: int) -> Tensor:
    """s at initialisation: 1/log(max_len) in every head, so that s log n = 1 at n = max_len."""
    if max_len < 2:
        raise AttnbenchError(
            f"ssmax: max_len={max_len}; accepted: an integer >= 2 (s starts at 1/log(max_len))"
        )
    return torch.full(dims, 1.0 / math.log(max_len))


def zero_bias(dims: tuple[int, ...], max_len: int) -> Tensor:
    """b at initialisation: 0, so the bias variant starts where plain SSMax does."""
    return torch.zeros(dims)


def row_scale(q: Tensor, k: Tensor, causal: bool, s: Tensor, b: Tensor | None) -> Tensor:
    """The score factor (s_h log(n_i) + b_h) / sqrt(d) as an [H, Tq, 1] tensor in q's dtype,
    differentiable in s and b."""
    log_n = torch.log(keys_seen(q.shape[-2], k.shape[-2], causal, q.device))  # (Tq, 1) float64
    factor = s[:, None, None] * log_n.to(s.dtype)  # (H, Tq, 1)
    if b is not None:
        factor = factor + b[:, None, None]
    return (factor / math.sqrt(q.shape[-1])).to(q.dtype)


@float32_sums(name="ssmax:reference")
def reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, bias: bool, s: Tensor, b: Tensor | None = None
) -> Tensor:
    """Dense scores times the per-(head, row) factor, then softmax. q, k, v: [B, H, T, D]."""
    mask = causal_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    scale = row_scale(q, k, causal, s, b if bias else None)  # (H, Tq, 1)
    return softmax_attention(q, k, v, mask=mask, scale=scale)


@float32_sums(name="ssmax:efficient")
def sdpa(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, bias: bool, s: Tensor, b: Tensor | None = None
) -> Tensor:
    """The factor folded into q, then SDPA with scale 1. q, k, v: [B, H, T, D]. Half inputs run
    in float32 (see the module docstring: the gradient of s)."""
    q = q * row_scale(q, k, causal, s, b if bias else None)  # (B, H, T, D), row i of head h scaled
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0)


def _per_head(shape, params) -> tuple[int, ...]:
    return (shape.heads,)


MECHANISM = Mechanism(
    name="ssmax",
    family="softmax",
    description="Scalable-Softmax: softmax(s log(n) QK^T/sqrt(d))V, s learned per head",
    sources=(sources.NAKANISHI_2025,),
    aliases=("scalable-softmax",),
    params=(Param("bias", False, "the paper's variant (s log n + b) with a learned b per head"),),
    extra_inputs=(
        ExtraInput(
            "s",
            "learned scale per head [H]; a layer starts it at 1/log(max_len)",
            _per_head,
            init_std=S_TEST_STD,
            init=initial_scale,
        ),
        ExtraInput(
            "b",
            "learned bias per head [H] (bias=True; 0 at init)",
            _per_head,
            init_std=S_TEST_STD,
            init=zero_bias,
            when=lambda params: params["bias"],
        ),
    ),
    paths=(
        PathSpec("reference", "reference", reference, memory="O(n^2)"),
        PathSpec(
            "efficient",
            "efficient",
            sdpa,
            memory="O(n) (SDPA flash kernel)",
            note="per-(head, row) factor folded into q, SDPA with scale=1; half inputs in float32",
        ),
    ),
    decode=cache_forms(ssmax_scale, in_float32=True),
    notes="s receives gradient in every layer; trained bidirectionally at one length L, log n is "
    "the constant log L and s acts as a learned temperature until evaluated at other lengths.",
)
