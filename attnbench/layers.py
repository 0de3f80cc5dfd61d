"""Mechanisms as token-mixing layers: x ``[B, T, C]`` -> y ``[B, T, C]``.

:func:`make_layer` is the one entry point. A mechanism that is a whole layer by nature (GAU,
RetNet's multi-scale retention) or that must compute its own extra inputs declares a ``layer``
factory in its record; every other one gets the generic :class:`AttentionMixer`: q, k, v
projections, optional rotary embedding on q and k, the mechanism's operator, output projection.

A layer factory takes ``(mechanism, d_model, heads, *, causal, path, params, rope, max_len)``
and returns an ``nn.Module`` whose ``forward(x)`` maps ``[B, T, C]`` to ``[B, T, C]``. A layer
that can apply its rotary embedding at explicit positions (the randomized positions of training,
Ruoss et al. 2023) also takes ``forward(x, positions=None)``, None meaning 0..T-1, and says so
through :func:`takes_positions`; :class:`AttentionMixer` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from attnbench import registry
from attnbench.core.building_blocks import DeviceCheck, Rotary
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Mechanism, PathSpec, Shape

__all__ = ["AttentionMixer", "Rotary", "make_layer", "takes_positions"]


class AttentionMixer(nn.Module):
    """The generic layer: x [B, T, C] -> q, k, v -> (rotary) -> mechanism -> output projection.

    ``head_dim`` defaults to d_model / heads. K/V get as many heads as the mechanism's shape says
    (fewer for MQA/GQA). Learned extra inputs whose shape does not depend on T become parameters.
    """

    def __init__(
        self,
        mechanism: str | Mechanism,
        d_model: int,
        heads: int,
        *,
        causal: bool = False,
        path: str | None = None,
        params: Mapping[str, Any] | None = None,
        rope: Rotary | None = None,
        max_len: int = 512,
        head_dim: int | None = None,
    ):
        super().__init__()
        self.mech = registry.get(mechanism)
        self.path: PathSpec = self.mech.require(path, device=None, causal=causal)
        if head_dim is None:
            if d_model % heads:
                raise AttnbenchError(f"d_model={d_model} is not divisible by heads={heads}")
            head_dim = d_model // heads
        self.params = self.mech.resolve(params)
        self.causal, self.heads, self.head_dim = causal, heads, head_dim
        shape = self.mech.shape_for(Shape(1, heads, max_len, head_dim), self.params)
        self.kv_heads, self.value_dim = shape.hkv, shape.dv
        if heads % self.kv_heads:  # as the call's check (attnbench.api), before any kernel
            raise AttnbenchError(
                f"{self.mech.name}: kv_heads={self.kv_heads} does not divide heads={heads}; "
                "accepted: a divisor of the query heads"
            )
        self.wq = nn.Linear(d_model, heads * head_dim, bias=False)
        self.wk = nn.Linear(d_model, self.kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(d_model, self.kv_heads * self.value_dim, bias=False)
        self.wo = nn.Linear(heads * self.value_dim, d_model, bias=False)
        self.rope = rope
        self.extras = nn.ParameterDict()
        for spec in self.mech.extras_for(self.params):
            dims = tuple(spec.shape(shape, self.params))
            other = tuple(
                spec.shape(
                    Shape(1, heads, max_len + 1, head_dim, shape.kv_heads, shape.value_dim),
                    self.params,
                )
            )
            if spec.role != "parameter" or dims != other:
                raise AttnbenchError(
                    f"{self.mech.name} needs its own layer factory: extra input {spec.name!r} "
                    "is not a fixed-size learned parameter"
                )
            start = spec.init(dims, max_len) if spec.init else torch.randn(dims) * spec.init_std
            self.extras[spec.name] = nn.Parameter(start)
        self.device_check = DeviceCheck(self.mech, self.path)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x [B, T, C] -> [B, T, C]; ``positions`` [B, T] or [T]: the rotary positions of q and k
        (None: 0..T-1)."""
        B, T, _ = x.shape
        self.device_check(x)
        q = self.wq(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.wv(x).view(B, T, self.kv_heads, self.value_dim).transpose(1, 2)  # (B, Hkv, T, Dv)
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        elif positions is not None:
            raise AttnbenchError(
                f"{self.mech.name} layer: positions given, but no rotary embedding"
            )
        o = self.path(q, k, v, causal=self.causal, **self.params, **dict(self.extras))
        return self.wo(o.transpose(1, 2).reshape(B, T, self.heads * self.value_dim))


def make_layer(
    mechanism: str | Mechanism,
    d_model: int,
    heads: int,
    *,
    causal: bool = False,
    path: str | None = None,
    params: Mapping[str, Any] | None = None,
    rope: Rotary | None = None,
    max_len: int = 512,
    head_dim: int | None = None,
) -> nn.Module:
    """A token-mixing layer for ``mechanism``: x ``[B, T, C]`` -> ``[B, T, C]``; ``head_dim``
    (None: d_model / heads) is for the generic :class:`AttentionMixer` only: a mechanism with its
    own layer factory sizes its heads itself."""
    mech = registry.get(mechanism)
    if mech.layer is not None:
        if head_dim is not None:
            raise AttnbenchError(
                f"{mech.name} builds its own layer, whose head size follows d_model and heads; "
                f"head_dim = {head_dim} is accepted only by the generic attention layer"
            )
        return mech.layer(
            mech, d_model, heads, causal=causal, path=path, params=params, rope=rope,
            max_len=max_len,
        )  # fmt: skip
    return AttentionMixer(
        mech, d_model, heads, causal=causal, path=path, params=params, rope=rope,
        max_len=max_len, head_dim=head_dim,
    )  # fmt: skip


def takes_positions(layer: nn.Module) -> bool:
    """Whether ``layer`` applies a rotary embedding at explicit positions: it has one (its
    ``rope``) and its ``forward`` takes ``positions``. A layer without rotary embedding, or whose
    factory does not pass positions on, cannot train with randomized positions."""
    if getattr(layer, "rope", None) is None:
        return False
    return "positions" in inspect.signature(layer.forward).parameters
