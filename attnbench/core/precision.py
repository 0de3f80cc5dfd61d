"""Half-precision inputs, float32 sums: for paths whose running states must not be rounded to
bfloat16 or float16 at every step.

A recurrent or chunkwise path keeps sums over the whole prefix (RetNet's decayed state, linear
attention's sum of phi(K)^T V and its normaliser sum of phi(K)). Kept in the input's half dtype,
each step's addition rounds the state to 8 (bfloat16) or 11 (float16) bits, and the error grows
with T; float16's normaliser also passes 65504 near T = 1000 at head dim 64. Measured against a
float64 oracle at T = 1000, 8 heads of 64: retention's recurrent form was 67 % of the output scale
off in bfloat16 and 13 % in float16, linear attention 3.9 % in float16. The paths below run in
float32 for half inputs (the state, the decays, the normaliser) and return the input's dtype, as
fused kernels do (their products accumulate in float32).

Casting the float32 result back can overflow where the formula's value is beyond float16's range
(65504): an unnormalised sum such as GAU's relu² attention or linear attention without its
normaliser. :func:`to_dtype` then raises an :class:`AttnbenchError` rather than return inf, and
:func:`refuse_overflow` does the same for a half path that computed its output in its own dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError

HALF = (torch.float16, torch.bfloat16)


def float32_sums(
    fn: Callable[..., Tensor] | None = None, *, name: str | None = None
) -> Callable[..., Tensor]:
    """Wrap a path ``fn(q, k, v, **kw)``: half tensors go in as float32, the output comes back in
    q's dtype (gradients flow through both casts; an output beyond the dtype's range is refused
    in one line naming ``name``, the ``mechanism:path`` a user asked for). Other dtypes pass
    unchanged. ``@float32_sums`` or ``@float32_sums(name="retention:chunkwise")``."""
    if fn is None:
        return functools.partial(float32_sums, name=name)
    name = name or _name(fn)

    @functools.wraps(fn)
    def wrapped(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        if q.dtype not in HALF:
            return fn(q, k, v, **kwargs)
        up = {
            key: x.float() if isinstance(x, Tensor) and x.dtype in HALF else x
            for key, x in kwargs.items()
        }
        out = fn(q.float(), k.float(), v.float(), **up)
        return to_dtype(out, q.dtype, name)

    return wrapped


def _name(fn: Callable[..., Tensor]) -> str:
    """``module:function`` of a path function, e.g. ``linear:chunkwise``."""
    return f"{fn.__module__.rsplit('.', 1)[-1]}:{fn.__name__}"


def _overflow(what: str, dtype: torch.dtype, largest: float) -> AttnbenchError:
    name = str(dtype).removeprefix("torch.")
    return AttnbenchError(
        f"{what}: the output ({largest:.3g} in magnitude) is beyond {name}'s range (largest "
        f"finite {torch.finfo(dtype).max:.6g}); run it in bfloat16 or float32, or scale the inputs"
    )


def to_dtype(out: Tensor, dtype: torch.dtype, what: str) -> Tensor:
    """``out`` (computed in a wider dtype) cast to ``dtype``; an :class:`AttnbenchError` naming
    ``what`` where a finite value of ``out`` does not fit float16 (never a silent inf). Only
    float16 is checked: bfloat16 shares float32's exponent range."""
    low = out.to(dtype)
    if dtype != torch.float16 or out.dtype == torch.float16:
        return low  # bfloat16 has float32's exponent range: nothing finite overflows
    if not torch.isinf(low).any():  # one reduction (and, on a GPU, a sync) per call
        return low
    lost = torch.isinf(low) & torch.isfinite(out)
    if lost.any():
        raise _overflow(what, dtype, out.detach()[lost].abs().max().item())
    return low


def refuse_overflow(out: Tensor, inputs: tuple[Tensor, ...], what: str) -> Tensor:
    """``out`` unchanged, unless it is float16 and holds NaN/inf although every input is finite:
    then an intermediate or the result itself passed 65504, and an :class:`AttnbenchError` says
    so. (bfloat16 and float32 share float32's range; other dtypes pass unchecked.)"""
    if out.dtype != torch.float16 or torch.isfinite(out).all():
        return out
    if not all(torch.isfinite(x).all() for x in inputs):
        return out  # NaN or inf came in: it goes out where the formula puts it
    raise AttnbenchError(
        f"{what}: the output or an intermediate sum is beyond float16's range (largest finite "
        "65504); run it in bfloat16 or float32, or scale the inputs"
    )
