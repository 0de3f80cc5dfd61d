"""FLA's kernels on packed batches (Yang and Zhang 2024, github.com/fla-org/flash-linear-attention).

Every FLA kernel attnbench calls takes ``cu_seqlens``, the offsets of sequences packed end to end
in one row (flash-attention's convention; :mod:`attnbench.core.varlen`): its states restart at
each offset, so no token sees another sequence's. These are the ``varlen`` entries of the
``fla-*`` paths, with the conventions of :mod:`attnbench.libraries.fla` (layout [B, T, H, D],
the feature map applied by the caller, FLA's scales and normaliser). CUDA only, as the paths.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError
from attnbench.core.precision import refuse_overflow
from attnbench.libraries.fla import FLOAT16_NORMALISER, _bthd, _causal_only, kernel

#: phi(x, feature_map): linear attention's feature maps, given by the mechanism's module.
FeatureMap = Callable[[Tensor, str], Tensor]


def linear(form: str, phi: FeatureMap) -> Callable[..., Tensor]:
    """The packed entry of ``linear:fla-<form>``."""

    def fn(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, offsets: Tensor, feature_map: str,
           normalize: bool) -> Tensor:  # fmt: skip
        _causal_only("linear attention", causal)
        if normalize and q.dtype == torch.float16:
            raise AttnbenchError(FLOAT16_NORMALISER)
        fq, fk = phi(q.float(), feature_map).to(q.dtype), phi(k.float(), feature_map).to(k.dtype)
        o, _ = kernel(f"linear-{form}")(_bthd(fq), _bthd(fk), _bthd(v), scale=1.0,
                                        normalize=normalize, cu_seqlens=offsets)  # fmt: skip
        return refuse_overflow(_bthd(o), (q, k, v), f"linear:fla-{form} (packed)")

    fn.__name__ = fn.__qualname__ = f"fla_{form}_varlen"
    return fn


def retention(form: str) -> Callable[..., Tensor]:
    """The packed entry of ``retention:fla-<form>`` (normalize=none, as the path)."""

    def fn(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, offsets: Tensor,
           normalize: str) -> Tensor:  # fmt: skip
        _causal_only("retention", causal)
        if normalize != "none":
            raise AttnbenchError(
                f"retention:fla-{form} computes normalize=none only (FLA has no {normalize!r})"
            )
        run = kernel(f"retention-{form}")
        o, _ = run(_bthd(q), _bthd(k), _bthd(v), scale=q.shape[-1] ** -0.5, cu_seqlens=offsets)
        return refuse_overflow(_bthd(o), (q, k, v), f"retention:fla-{form} (packed)")

    fn.__name__ = fn.__qualname__ = f"fla_{form}_varlen"
    return fn


def softmax(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, offsets: Tensor) -> Tensor:
    """The packed entry of ``softmax:fla-parallel``: causal softmax inside each sequence."""
    _causal_only("parallel softmax attention", causal)
    o = kernel("parallel")(_bthd(q), _bthd(k), _bthd(v), scale=q.shape[-1] ** -0.5,
                           cu_seqlens=offsets)  # fmt: skip
    return _bthd(o)


def local(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, offsets: Tensor, window: int) -> Tensor:
    """The packed entry of ``local:fla-parallel``: keys i - window .. i inside each sequence."""
    _causal_only("parallel softmax attention", causal)
    o = kernel("parallel")(_bthd(q), _bthd(k), _bthd(v), scale=q.shape[-1] ** -0.5,
                           window_size=window + 1, cu_seqlens=offsets)  # fmt: skip
    return _bthd(o)
