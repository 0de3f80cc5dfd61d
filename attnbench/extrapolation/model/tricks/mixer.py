"""Dense softmax attention with a row of evaluation-time tricks (:class:`TrickMixer`): the trained
O model's weights load into it as they are, and each trick of the row changes how attention is
computed through its hooks (:mod:`.base`), composed here in a fixed order: the rotary embedding,
the scores' relative positions, then the row factors (window, log n scale, temperature).

The dense path spells everything out (and feeds the entropy probe); the same computation through
SDPA, with the row scale folded into q and the window as a boolean mask, evaluates the rest of the
windows faster. A row with a trick that remaps the relative positions is dense only.

Under the causal objective (``causal``) every query also sees only itself and earlier keys: the
window is one-sided, and the keys a query sees (the log n scale's n_i) are i + 1, or at most
local_window + 1 inside a window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.building_blocks import Rotary
from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.model.positions import rotate
from attnbench.extrapolation.model.tricks.base import At, Tricks, yarn_temperature

#: Called with the attention probabilities [B, H, T, T] of one forward pass (entropy probes).
ProbsHook = Callable[[Tensor], None]


class TrickMixer(nn.Module):
    """Dense softmax attention with evaluation-time tricks; x [B, T, C] -> [B, T, C].

    Parameter names match AttentionMixer's for the ``softmax`` mechanism, so a trained O model's
    weights load into it as they are. q, k, v: [B, H, T, D]. ``layer`` (this block's index) and
    ``layers`` (how many blocks) are needed by a trick that treats layers apart (``hwfa``).
    ``causal``: queries see no later key (a model trained with the causal objective).
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        tricks: Tricks,
        *,
        rope_base: float = 10000.0,
        layer: int | None = None,
        layers: int | None = None,
        causal: bool = False,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        needing = [t.name for t in tricks.tricks if t.needs_layers]
        if needing and (layer is None or layers is None or not 0 <= layer < layers):
            raise AttnbenchError(
                f"the {needing[0]} row needs each mixer's layer index and the layer count; got "
                f"layer={layer}, layers={layers} (TrickMixer(..., layer=i, layers=n), 0 <= i < n)"
            )
        self.heads, self.head_dim = heads, head_dim or d_model // heads
        inner = heads * self.head_dim  # d_model unless head_dim says otherwise
        self.tricks, self.rope_base = tricks, rope_base
        self.layer, self.layers, self.causal = layer, layers, causal
        self.wq = nn.Linear(d_model, inner, bias=False)
        self.wk = nn.Linear(d_model, inner, bias=False)
        self.wv = nn.Linear(d_model, inner, bias=False)
        self.wo = nn.Linear(inner, d_model, bias=False)
        self.probs_hook: ProbsHook | None = None
        #: Always take the dense path (tests compare it with the SDPA one).
        self.force_dense = False

    def at(self, n: int) -> At:
        """Where the hooks are applied: this row, length n, this mixer's layer."""
        return At(self.tricks, n, self.head_dim, self.rope_base, self.layer, self.layers)

    def _any(self, hook: str, n: int) -> bool:
        """Whether a trick of the row answers yes to ``hook`` (a per-layer question) here."""
        at = self.at(n)
        return any(
            getattr(t, hook) is not None and getattr(t, hook)(at) for t in self.tricks.tricks
        )

    @property
    def windowed(self) -> bool:
        """Whether queries see only keys within +-local_window here."""
        return self._any("windowed", self.tricks.train_len)

    @property
    def log_scaled(self) -> bool:
        """Whether scores are scaled by max(1, log n / log L)^p here."""
        return self._any("log_scaled", self.tricks.train_len)

    @property
    def dense_only(self) -> bool:
        """A trick that remaps the relative positions needs several score matrices: no SDPA."""
        return any(t.dense_only for t in self.tricks.tricks)

    def rotary(self, n: int) -> Rotary:
        """The rotary embedding used at length n, as the row's tricks set it."""
        at, settings = self.at(n), {"base": self.rope_base}
        for t in self.tricks.tricks:
            if t.rotary is not None:
                settings.update(t.rotary(at))
        return Rotary(self.head_dim, **settings)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Raw (unscaled) rotary scores [B, H, T, T], with the relative positions remapped when a
        trick of the row does that."""
        T = q.shape[-2]
        rot = self.rotary(T)
        pos = torch.arange(T, device=q.device)
        ang = rot.angles(pos).to(q.device)  # (T, D/2)
        s = rotate(q, ang) @ rotate(k, ang).transpose(-2, -1)  # (B, H, T, T)
        at = self.at(T)
        for t in self.tricks.tricks:
            if t.remap is not None:
                s = t.remap(at, q, k, rot, s)
        return s

    def row_factors(self, T: int, device: torch.device) -> tuple[Tensor, Tensor | None]:
        """The per-row score scale [T, 1] (float64) and the visibility mask [T, T] (or None)."""
        D, row = self.head_dim, self.tricks
        pos = torch.arange(T, device=device)
        visible = None
        n_keys = torch.full((T, 1), float(T), dtype=torch.float64, device=device)
        if self._any("windowed", T):
            visible = (pos[:, None] - pos[None, :]).abs() <= row.local_window  # (T, T)
        if self.causal:
            later = pos[None, :] > pos[:, None]  # (T, T): key j after query i
            visible = ~later if visible is None else visible & ~later
        if visible is not None:
            n_keys = visible.sum(-1, keepdim=True).to(torch.float64)  # (T, 1)
        factor = torch.full_like(n_keys, 1.0 / math.sqrt(D))  # (T, 1)
        if self._any("log_scaled", T):
            factor = factor * (n_keys.log() / math.log(row.train_len)).clamp(min=1.0) ** (
                row.logn_power
            )
        if any(t.temperature for t in row.tricks):
            factor = factor * yarn_temperature(T / row.train_len)
        return factor, visible

    def dense(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Scores, scale, mask and softmax spelled out; the probabilities go to ``probs_hook``.
        q, k, v: [B, H, T, D] (unrotated)."""
        factor, visible = self.row_factors(q.shape[-2], q.device)
        s = self.scores(q, k) * factor.to(q.dtype)  # (B, H, T, T), row i scaled
        if visible is not None:
            s = s.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(s, dim=-1)  # (B, H, T, T)
        if self.probs_hook is not None:
            self.probs_hook(probs)
        return probs @ v  # (B, H, T, D)

    def fused(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The same through SDPA (row scale folded into q, mask as attn_mask): every row but
        those that remap the relative positions. q, k, v: [B, H, T, D] (unrotated)."""
        T = q.shape[-2]
        factor, visible = self.row_factors(T, q.device)
        ang = self.rotary(T).angles(torch.arange(T)).to(q.device)  # (T, D/2)
        q = rotate(q, ang) * factor.to(q.dtype)  # (B, H, T, D), row i scaled
        k = rotate(k, ang)  # (B, H, T, D)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=1.0)

    def forward(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        H, D = self.heads, self.head_dim
        q = self.wq(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        v = self.wv(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        if self.probs_hook is not None or self.dense_only or self.force_dense:
            o = self.dense(q, k, v)  # (B, H, T, D)
        else:
            o = self.fused(q, k, v)  # (B, H, T, D)
        return self.wo(o.transpose(1, 2).reshape(B, T, H * D))


def trick_mixers(tricks: Tricks) -> Callable[[Any, int], TrickMixer]:
    """The mixer factory of an encoder whose every block runs the row ``tricks``: (model config,
    block index) -> a :class:`TrickMixer` (what the O weights load into)."""

    def build(cfg: Any, index: int) -> TrickMixer:
        return TrickMixer(cfg.d_model, cfg.heads, tricks, rope_base=cfg.rope_base, layer=index,
                          layers=cfg.layers, causal=getattr(cfg, "causal", False),
                          head_dim=getattr(cfg, "head_dim", None))  # fmt: skip

    return build
