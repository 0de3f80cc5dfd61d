"""The layers of the GAU family: GAU (FLASH-Quad), FLASH, and MC-TFM's attention (Hua et al. 2022).

Every layer maps x ``[B, T, d]`` to ``[B, T, d]`` and is a token mixer only: the model around it
adds the norm and the residual. ``GAULayer`` and ``FlashLayer`` replace attention + FFN (their
mechanisms say ``whole_block=True``); ``MixedChunkMixer`` is the attention of a normal Transformer.

GAU (Hua et al. 2022, Eq. 1-4)::

    U = swish(x W_u), V = swish(x W_v)      [B, T, e], e = expansion * d
    Z = swish(x W_z)                        [B, T, s]
    Q = Z γ_q + β_q, K = Z γ_k + β_k        per-dimension scale and offset ("scale_offset")
    O = (U ⊙ A V) W_o                       A from the mechanism's operator, one head

FLASH derives four maps from Z (Q, K of the local part, Q_lin, K_lin of the global part). γ is
initialised 1 + N(0, 0.02) and β to 0: Q and K start as (slightly different copies of) Z, so the
scores Q Kᵀ / sqrt(s) are O(1) and A is a working attention from the first step. The paper's code
and lucidrains' FLASH-pytorch draw γ ~ N(0, 0.02), which makes A ~ 1e-11 at initialisation; they
get away with it because their scores also carry a learned relative-position bias, which the
formula of Su 2022 (rotary only) has not: without it, a 4-layer GAU MLM encoder trained here
stayed at the unigram loss (3.33 nats for 3000 steps, gradients ~1e-12, below Adam's eps),
while the same model with γ ~ 1 left that plateau within 150 steps. A rotary embedding, when
given, is applied to every query and key map (to all four in FLASH, as lucidrains does); a
``Rotary`` built for another head width is re-created at width s with the same base and position
scale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.building_blocks import DeviceCheck, Rotary
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Mechanism, PathSpec

#: γ of the scale-and-offset maps starts at 1 + N(0, GAMMA_INIT_STD) (see the module docstring
#: for why not the paper's N(0, 0.02)).
GAMMA_INIT_MEAN = 1.0
GAMMA_INIT_STD = 0.02


class ScaleOffset(nn.Module):
    """``count`` per-dimension affine maps of one input: x ``[..., s]`` -> count x ``[..., s]``."""

    def __init__(self, dim: int, count: int):
        super().__init__()
        self.gamma = nn.Parameter(GAMMA_INIT_MEAN + torch.randn(count, dim) * GAMMA_INIT_STD)
        self.beta = nn.Parameter(torch.zeros(count, dim))

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        out = x.unsqueeze(-2) * self.gamma + self.beta  # (..., count, s)
        return out.unbind(-2)


class _Mixer(nn.Module):
    """What the three layers share: the record, the path, direction checks, rotary at width s."""

    def __init__(
        self,
        mechanism: Mechanism,
        *,
        causal: bool,
        path: str | None,
        params: Mapping[str, Any] | None,
        rope: Rotary | None,
        rope_dim: int,
    ):
        super().__init__()
        self.mech = mechanism
        self.path: PathSpec = mechanism.require(path, device=None, causal=causal)
        self.device_check = DeviceCheck(mechanism, self.path)
        self.params = mechanism.resolve(params)
        self.causal = causal
        self.rope, self.rope_dim = rope, rope_dim
        self._own_rope: Rotary | None = None

    def rotate(self, *xs: Tensor) -> tuple[Tensor, ...]:
        """Rotary on each ``[B, H, T, rope_dim]`` tensor (unchanged when there is no rope)."""
        rope = self.rope
        if rope is None:
            return xs
        if rope.dim != self.rope_dim:
            own = self._own_rope
            if own is None or (own.base, own.position_scale) != (rope.base, rope.position_scale):
                own = Rotary(self.rope_dim, rope.base, rope.position_scale)
                self._own_rope = own
            rope = own
        return tuple(rope(x) for x in xs)


class GAULayer(_Mixer):
    """Gated attention unit, one head: x ``[B, T, d]`` -> ``[B, T, d]``. ``heads`` is ignored
    (GAU is single-head by design); ``params`` are the ``gau`` mechanism's (s, expansion,
    scoring, norm, ...)."""

    def __init__(
        self,
        mechanism: Mechanism,
        d_model: int,
        heads: int = 1,
        *,
        causal: bool = False,
        path: str | None = None,
        params: Mapping[str, Any] | None = None,
        rope: Rotary | None = None,
        max_len: int = 512,
        maps: int = 2,
    ):
        s = mechanism.resolve(params)["s"]
        super().__init__(mechanism, causal=causal, path=path, params=params, rope=rope, rope_dim=s)
        self.s, self.e = s, self.params["expansion"] * d_model
        self.hidden = nn.Linear(d_model, 2 * self.e + s)  # W_u, W_v, W_z in one matmul
        self.maps = ScaleOffset(s, maps)
        self.wo = nn.Linear(self.e, d_model)

    def _uvz(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        u, v, z = F.silu(self.hidden(x)).split((self.e, self.e, self.s), dim=-1)
        return u, v, z  # (B, T, e), (B, T, e), (B, T, s)

    def _attend(self, v: Tensor, *qk: Tensor, **extra: Tensor) -> Tensor:
        o = self.path(*qk, v.unsqueeze(1), causal=self.causal, **self.params, **extra)
        return o.squeeze(1)  # (B, T, e)

    def forward(self, x: Tensor) -> Tensor:
        self.device_check(x)
        u, v, z = self._uvz(x)
        q, k = self.rotate(*(t.unsqueeze(1) for t in self.maps(z)))  # (B, 1, T, s) each
        return self.wo(u * self._attend(v, q, k))  # (B, T, d)


class FlashLayer(GAULayer):
    """FLASH, one head: GAU whose attention is mixed chunk attention; four maps of Z."""

    def __init__(self, mechanism: Mechanism, d_model: int, heads: int = 1, **kwargs):
        super().__init__(mechanism, d_model, heads, maps=4, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        self.device_check(x)
        u, v, z = self._uvz(x)
        q, k, q_lin, k_lin = self.rotate(*(t.unsqueeze(1) for t in self.maps(z)))  # (B,1,T,s)
        return self.wo(u * self._attend(v, q, k, q_lin=q_lin, k_lin=k_lin))  # (B, T, d)


class MixedChunkMixer(_Mixer):
    """MC-TFM's attention: multi-head q, k, v, q_lin, k_lin projections, mixed chunk softmax
    attention, output projection. x ``[B, T, d]`` -> ``[B, T, d]``; head dim d / heads."""

    def __init__(
        self,
        mechanism: Mechanism,
        d_model: int,
        heads: int,
        *,
        causal: bool = False,
        path: str | None = None,
        params: Mapping[str, Any] | None = None,
        rope: Rotary | None = None,
        max_len: int = 512,
    ):
        if d_model % heads:
            raise AttnbenchError(f"d_model={d_model} is not divisible by heads={heads}")
        hd = d_model // heads
        super().__init__(mechanism, causal=causal, path=path, params=params, rope=rope, rope_dim=hd)
        self.heads, self.head_dim = heads, hd
        self.qkv = nn.Linear(d_model, 5 * d_model, bias=False)  # q, k, v, q_lin, k_lin
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        self.device_check(x)
        B, T, d = x.shape
        parts = self.qkv(x).view(B, T, 5, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v, q_lin, k_lin = parts.unbind(0)  # (B, H, T, hd) each
        q, k, q_lin, k_lin = self.rotate(q, k, q_lin, k_lin)
        o = self.path(
            q, k, v, causal=self.causal, q_lin=q_lin, k_lin=k_lin, **self.params
        )  # (B, H, T, hd)
        return self.wo(o.transpose(1, 2).reshape(B, T, d))
