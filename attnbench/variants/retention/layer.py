"""Gated multi-scale retention, RetNet's token mixer (Sun et al. 2023)::

    head_h = Retention(X, gamma_h)                      (per-head decay, see decay.py)
    Y      = GroupNorm_H(Concat(head_1, ..., head_H))   (one group per head)
    MSR(X) = (swish(X W_G) * Y) W_O

x ``[B, T, C]`` -> ``[B, T, C]``; H heads of C / H dims for Q, K and V. The rotary embedding
passed by :func:`attnbench.layers.make_layer` is applied to Q and K (RetNet's xPos-like Theta);
GroupNorm makes the layer invariant to a per-(position, head) scale of the retention output,
which is why the ``none`` and ``rownorm`` normalisations behave alike inside it. Causal only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.building_blocks import DeviceCheck
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Mechanism


class MultiScaleRetention(nn.Module):
    """Q, K, V, gate projections; retention per head; GroupNorm; swish gate; output projection."""

    def __init__(
        self,
        mechanism: Mechanism,
        d_model: int,
        heads: int,
        *,
        causal: bool = True,
        path: str | None = None,
        params: Mapping[str, Any] | None = None,
        rope: nn.Module | None = None,
        max_len: int = 512,
    ):
        super().__init__()
        self.path = mechanism.require(path, device=None, causal=causal)
        self.device_check = DeviceCheck(mechanism, self.path)
        if d_model % heads:
            raise AttnbenchError(f"d_model={d_model} is not divisible by heads={heads}")
        self.mech = mechanism
        self.params = mechanism.resolve(params)
        self.heads, self.head_dim = heads, d_model // heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wg = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)
        self.norm = nn.GroupNorm(heads, d_model)
        self.rope = rope

    def forward(self, x: Tensor) -> Tensor:
        self.device_check(x)
        b, t, c = x.shape
        shape = (b, t, self.heads, self.head_dim)
        q = self.wq(x).view(shape).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(shape).transpose(1, 2)  # (B, H, T, D)
        v = self.wv(x).view(shape).transpose(1, 2)  # (B, H, T, D)
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        o = self.path(q, k, v, causal=True, **self.params)  # (B, H, T, D)
        y = self.norm(o.transpose(1, 2).reshape(b * t, c)).view(b, t, c)  # GroupNorm per head
        return self.wo(F.silu(self.wg(x)) * y)
