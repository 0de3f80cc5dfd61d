"""Validation and dispatch: the front door for calling any registered mechanism.

All tensors use SDPA's layout: q ``[B, H, T, D]``, k ``[B, Hkv, T, D]``, v ``[B, Hkv, T, Dv]``,
output ``[B, H, T, Dv]``. Hkv differs from H only for mechanisms that share K/V (MQA, GQA).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnbench import registry
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Mechanism, PathSpec, Shape


def parse_impl(text: str) -> tuple[Mechanism, str | None]:
    """``NAME`` or ``NAME:PATH`` -> (mechanism, path name or None). Validates both names."""
    mech, path = registry.resolve(text)
    return mech, (path.name if path else None)


def check_tensors(mech: Mechanism, q: Tensor, k: Tensor, v: Tensor) -> None:
    """The checks every call gets; raises AttnbenchError with what is accepted."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise AttnbenchError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise AttnbenchError(
                f"{name} has shape {tuple(t.shape)}; accepted: rank 4, [batch, heads, seq_len, dim]"
            )
    if q.shape[-1] != k.shape[-1]:
        raise AttnbenchError(
            f"q and k head dims differ ({q.shape[-1]} vs {k.shape[-1]}); they must be equal"
        )
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise AttnbenchError(
            f"batch sizes differ (q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}); "
            "they must be equal"
        )
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise AttnbenchError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in heads and seq_len"
        )
    if q.shape[2] != k.shape[2]:
        raise AttnbenchError(
            f"{mech.name} is self-attention: q has {q.shape[2]} positions, k has {k.shape[2]}; "
            "they must be equal"
        )
    hq, hkv = q.shape[1], k.shape[1]
    if mech.shares_kv:
        if hq % hkv:
            raise AttnbenchError(
                f"{mech.name}: kv_heads={hkv} does not divide heads={hq}; "
                "accepted: a divisor of the query heads"
            )
    elif hkv != hq:
        raise AttnbenchError(
            f"{mech.name} needs as many K/V heads as query heads (q {hq}, k {hkv}); "
            "use mqa or gqa to share K/V"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise AttnbenchError(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")


def _where(t: Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} on {t.device}"


def split_kwargs(mech: Mechanism, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate parameter values from extra input tensors; unknown names are an error."""
    extra_names = {e.name for e in mech.extra_inputs}
    params, extras = {}, {}
    for key, value in kwargs.items():
        if key in extra_names:
            extras[key] = value
        elif key in mech.param_names:
            params[key] = value
        else:
            accepted = mech.param_names + sorted(extra_names)
            raise AttnbenchError(
                f"{mech.name} takes no argument {key!r}; accepted: {', '.join(accepted) or 'none'}"
            )
    return params, extras


def prepare(
    mechanism: str | Mechanism,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    path: str | None = None,
    **kwargs: Any,
) -> tuple[PathSpec, dict[str, Any]]:
    """Validate one call and choose its path; returns (path, keyword arguments for the path)."""
    mech = registry.get(mechanism)
    mech.require(path, device=None, causal=causal)  # the direction first: the clearest mistake
    params, extras = split_kwargs(mech, kwargs)
    params = mech.resolve(params)
    check_tensors(mech, q, k, v)
    if mech.check_inputs is not None:
        problem = mech.check_inputs(q, k, v, params)
        if problem:
            raise AttnbenchError(f"{mech.name}: {problem}")
    shape = _shape_of(q, k, v)
    for spec in mech.extras_for(params):
        if spec.name not in extras:
            raise AttnbenchError(f"{mech.name} needs the extra input {spec.name!r} ({spec.doc})")
        want = tuple(spec.shape(shape, params))
        got = tuple(extras[spec.name].shape)
        if got != want:
            raise AttnbenchError(
                f"{mech.name}: {spec.name} has shape {got} but this call needs {want} ({spec.doc})"
            )
        tensor = extras[spec.name]
        if tensor.dtype != q.dtype or tensor.device != q.device:
            # One rule for every extra input: the dtype and device of q, k, v (a float32 w with
            # float16 q would otherwise fail deep inside a path, or turn its output float32).
            raise AttnbenchError(
                f"{mech.name}: {spec.name} is {_where(tensor)} but q, k, v are {_where(q)}; "
                f"pass {spec.name}.to(q) (the extra inputs take q's dtype and device)"
            )
    backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *extras.values()))
    chosen = mech.require(path, device=q.device, dtype=q.dtype, causal=causal, backward=backward)
    return chosen, {"causal": causal, **params, **extras}


def attention(
    mechanism: str | Mechanism,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    path: str | None = None,
    **kwargs: Any,
) -> Tensor:
    """Run a registered mechanism: q ``[B, H, T, D]``, k ``[B, Hkv, T, D]``, v ``[B, Hkv, T, Dv]``
    -> ``[B, H, T, Dv]``.

    ``path`` names one of the mechanism's paths (``reference``, ``efficient``, ``fused``...);
    None takes its default (the first efficient path). A path that cannot run here raises an
    AttnbenchError saying why, never a silent fallback. ``kwargs`` are the mechanism's parameters
    (defaults otherwise) and its extra inputs.
    """
    chosen, call = prepare(mechanism, q, k, v, causal=causal, path=path, **kwargs)
    return chosen(q, k, v, **call)


def _shape_of(q: Tensor, k: Tensor, v: Tensor) -> Shape:
    B, H, T, D = q.shape
    return Shape(B, H, T, D, kv_heads=k.shape[1], value_dim=v.shape[-1])
