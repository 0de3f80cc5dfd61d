"""Softmax attention with a trained position encoding other than rotary (:class:`PositionMixer`):
ALiBi's or T5's bias added to the scores, or xPos's scaled rotation of q and k
(:mod:`.position_encodings` has each formula and its source). The score scale is the variant's:
1/sqrt(d) for ``softmax`` (Attention-O), log_b(n_i)/sqrt(d) for ``softmax-logn`` (Attention-E,
n_i the keys query i attends to: n bidirectional, i + 1 causal). The bias is not scaled.

Parameter names are those of :class:`attnbench.layers.AttentionMixer` (``wq, wk, wv, wo``), plus
T5's shared table (``relative_bias.table``). The dense path spells the probabilities out (for the
entropy probe and the tests); the other path is SDPA with the bias as a float mask (scale folded
into q). Both build the [H, n, n] bias: these are evaluation models at n <= a few thousand, not
efficient paths.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.model.position_encodings import (
    T5Bias,
    alibi_bias,
    alibi_slopes,
    xpos_rotate,
)
from attnbench.variants.dense import causal_mask, keys_seen
from attnbench.variants.logn_softmax import logn_factor

#: The mechanisms whose scores a position bias can be added to, and how each scales them.
SCORED = ("softmax", "softmax-logn")

#: Called with the attention probabilities [B, H, T, T] of one forward pass (entropy probes).
ProbsHook = Callable[[Tensor], None]


class PositionMixer(nn.Module):
    """Softmax attention (O or E) with ALiBi, T5's bias or xPos; x [B, T, C] -> [B, T, C].

    ``mechanism``: ``softmax`` or ``softmax-logn`` (``params``: its base, clip, min_n, as the
    mechanism resolves them).
    ``position``: ``alibi``, ``t5`` or ``xpos``; ``t5``: the shared :class:`T5Bias`."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        *,
        mechanism: str,
        params: Mapping[str, Any],
        position: str,
        causal: bool,
        rope_base: float = 10000.0,
        t5: T5Bias | None = None,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        if mechanism not in SCORED:
            raise AttnbenchError(
                f"model.position = {position} adds to the scores of softmax attention; "
                f"{mechanism} has none; accepted with it: rope or nope"
            )
        if position == "t5" and t5 is None:
            raise AttnbenchError("PositionMixer(position='t5') needs the shared T5Bias (t5=...)")
        self.heads, self.head_dim = heads, head_dim or d_model // heads
        inner = heads * self.head_dim  # d_model unless head_dim says otherwise
        self.mechanism, self.params = mechanism, dict(params)
        self.position, self.causal, self.rope_base = position, causal, rope_base
        self.wq = nn.Linear(d_model, inner, bias=False)
        self.wk = nn.Linear(d_model, inner, bias=False)
        self.wv = nn.Linear(d_model, inner, bias=False)
        self.wo = nn.Linear(inner, d_model, bias=False)
        if position == "alibi":
            self.register_buffer("slopes", torch.tensor(alibi_slopes(heads)), persistent=False)
        self.relative_bias = t5 if position == "t5" else None
        self.probs_hook: ProbsHook | None = None
        #: Always take the dense path (tests compare it with the SDPA one).
        self.force_dense = False

    def row_scale(self, T: int, device: torch.device) -> Tensor:
        """The score scale of each query row [T, 1], float64: 1/sqrt(d), times log_b(n_i) for
        ``softmax-logn``."""
        scale = torch.full((T, 1), 1.0 / math.sqrt(self.head_dim), dtype=torch.float64,
                           device=device)  # fmt: skip
        if self.mechanism == "softmax-logn":
            p = self.params  # resolved by the mechanism: base a number, clip, min_n
            n = keys_seen(T, T, self.causal, device)  # (T, 1)
            scale = scale * logn_factor(n, base=float(p["base"]), clip=bool(p["clip"]),
                                        min_n=int(p["min_n"]))  # fmt: skip
        return scale

    def bias(self, T: int, device: torch.device, dtype: torch.dtype) -> Tensor | None:
        """The additive bias [H, T, T] of ALiBi or T5 (None for xPos), with -inf above the
        diagonal when causal (None only for a bidirectional xPos, which is refused earlier)."""
        if self.position == "alibi":
            bias = alibi_bias(self.slopes.to(device, dtype), T)  # (H, T, T)
        elif self.position == "t5":
            bias = self.relative_bias(T).to(dtype)  # (H, T, T)
        else:
            bias = torch.zeros(1, T, T, device=device, dtype=dtype)
        if self.causal:
            bias = bias.masked_fill(~causal_mask(T, T, device), float("-inf"))
        return bias

    def rotated(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q and k with xPos applied (unchanged for the biases)."""
        if self.position != "xpos":
            return q, k
        return xpos_rotate(q, self.rope_base, False), xpos_rotate(k, self.rope_base, True)

    def dense(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Scores, scale, bias and softmax spelled out; the probabilities go to ``probs_hook``.
        q, k, v: [B, H, T, D]."""
        T = q.shape[-2]
        q, k = self.rotated(q, k)
        scale = self.row_scale(T, q.device).to(q.dtype)  # (T, 1)
        s = (q @ k.transpose(-2, -1)) * scale + self.bias(T, q.device, q.dtype)  # (B, H, T, T)
        probs = torch.softmax(s, dim=-1)  # (B, H, T, T)
        if self.probs_hook is not None:
            self.probs_hook(probs)
        return probs @ v  # (B, H, T, D)

    def fused(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The same through SDPA: the row scale folded into q, the bias as a float mask."""
        T = q.shape[-2]
        q, k = self.rotated(q, k)
        q = q * self.row_scale(T, q.device).to(q.dtype)  # (B, H, T, D), row i scaled
        bias = self.bias(T, q.device, q.dtype)  # (H, T, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)

    def forward(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        H, D = self.heads, self.head_dim
        q = self.wq(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        v = self.wv(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        if self.probs_hook is not None or self.force_dense:
            o = self.dense(q, k, v)  # (B, H, T, D)
        else:
            o = self.fused(q, k, v)  # (B, H, T, D)
        return self.wo(o.transpose(1, 2).reshape(B, T, H * D))
