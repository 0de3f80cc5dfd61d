"""AFT as a token-mixing layer: x ``[B, T, C]`` -> ``[B, T, C]``.

Q, K, V are linear maps of x to H heads of D = C / H features, an AFT path mixes them, and an
output projection maps back (labml's layout; the paper's ``Y = f(X)`` followed by the usual
output map). The layer owns the mechanism's learned bias, initialised as the paper and labml do
(aft-full / aft-local: w = 0, so a fresh layer is AFT-simple; aft-conv: gamma = beta = 0).

Lengths other than the one the bias was built for (``max_len``): a layer built for max_len uses
``w[:T, :T]`` (the top-left block) when T <= max_len; when T > max_len, every pair (t, t') with t
or t' >= max_len gets bias 0, i.e. AFT-simple behaviour for the positions the layer never had a
bias for, while pairs inside the first max_len positions keep their learned bias. aft-conv's
kernel does not depend on T and aft-simple has no bias, so they take any length unchanged.

AFT has no query-key dot product for a rotary embedding to act on, so a ``rope`` passed to the
factory is not applied (position information comes from the bias); ``layer.rope`` is None.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from attnbench.core.building_blocks import DeviceCheck
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Mechanism

#: (params, heads, max_len) -> the learned bias tensors at initialisation.
Init = Callable[[Mapping[str, Any], int, int], dict[str, Tensor]]
#: (bias tensors, T, max_len, params) -> the extra inputs for a call at length T.
AtLength = Callable[[dict[str, Tensor], int, int, Mapping[str, Any]], dict[str, Tensor]]


class AFTLayer(nn.Module):
    """Q, K, V projections, an AFT mechanism with its learned bias, output projection."""

    def __init__(
        self,
        mechanism: Mechanism,
        d_model: int,
        heads: int,
        *,
        init: Init,
        at_length: AtLength,
        causal: bool = False,
        path: str | None = None,
        params: Mapping[str, Any] | None = None,
        max_len: int = 512,
    ):
        super().__init__()
        mech = mechanism
        self.path = mech.require(path, device=None, causal=causal)
        self.device_check = DeviceCheck(mech, self.path)
        if d_model % heads:
            raise AttnbenchError(f"d_model={d_model} is not divisible by heads={heads}")
        if max_len < 1:
            raise AttnbenchError(f"max_len={max_len}; accepted: an integer >= 1")
        self.mech, self.causal, self.max_len = mech, causal, max_len
        self.heads, self.head_dim = heads, d_model // heads
        self.params = mech.resolve(params)
        self.rope = None  # AFT has no q.k product to rotate
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)
        self.bias = nn.ParameterDict(
            {name: nn.Parameter(t) for name, t in init(self.params, heads, max_len).items()}
        )
        self._at_length = at_length

    def extras(self, t: int) -> dict[str, Tensor]:
        """The bias tensors for a sequence of length t (see the module docstring)."""
        return self._at_length(dict(self.bias), t, self.max_len, self.params)

    def forward(self, x: Tensor) -> Tensor:
        self.device_check(x)
        b, t, _ = x.shape
        shape = (b, t, self.heads, self.head_dim)
        q = self.wq(x).view(shape).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(shape).transpose(1, 2)  # (B, H, T, D)
        v = self.wv(x).view(shape).transpose(1, 2)  # (B, H, T, D)
        o = self.path(q, k, v, causal=self.causal, **self.params, **self.extras(t))
        return self.wo(o.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


def aft_layer(init: Init, at_length: AtLength) -> Callable[..., nn.Module]:
    """A ``Mechanism.layer`` factory for one AFT mechanism."""

    def factory(
        mechanism: Mechanism,
        d_model: int,
        heads: int,
        *,
        causal: bool = False,
        path: str | None = None,
        params: Mapping[str, Any] | None = None,
        rope: Any = None,
        max_len: int = 512,
    ) -> nn.Module:
        return AFTLayer(
            mechanism,
            d_model,
            heads,
            init=init,
            at_length=at_length,
            causal=causal,
            path=path,
            params=params,
            max_len=max_len,
        )

    return factory


def no_bias(params: Mapping[str, Any], heads: int, max_len: int) -> dict[str, Tensor]:
    return {}


def same_at_every_length(
    bias: dict[str, Tensor], t: int, max_len: int, params: Mapping[str, Any]
) -> dict[str, Tensor]:
    return bias
