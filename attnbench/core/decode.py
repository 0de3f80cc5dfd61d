"""Decoding: new queries against a KV cache or a recurrent state, the inference shape.

A mechanism's decode forms are :class:`DecodePath` records on it (``Mechanism.decode``), each a
pair of functions::

    state = prefill(q, k, v, *, capacity, <the parameters and extra inputs it declares>)
    o, state = step(state, q, k, v, *, <the parameters and extra inputs it declares>)

``prefill`` takes the first n tokens (n may be 0), q, k, v ``[B, H, n, D]`` (k, v with the
mechanism's K/V heads), and returns the state after them: a KV cache with room for
``capacity`` tokens, or a recurrent state whose size does not depend on n. ``step`` takes the
next Tq tokens (positions n .. n + Tq - 1) and returns their outputs ``[B, H, Tq, Dv]`` and the
state after them. Extra inputs that are activations (``role="input"``, one row per token) are
split like q; learned parameters are passed whole (:func:`split_tokens`).

The contract, tested for every decode form of the registry (``tests/mechanisms/test_decode.py``):
``o`` equals rows n .. n + Tq - 1 of the mechanism's causal output over all n + Tq tokens (its
dense reference), whether the tokens come in one step or in several, and whether the state came
from ``prefill`` or from steps.

A step leaves the state it was given fit for the same step again (the benchmark times
``step(state, ...)`` on one state, call after call): a KV cache writes the new keys into the
slots after its length, the same slots on every call; a recurrent step returns new tensors.

Counts per call (``shape.seq_len`` = n, the cache; ``shape.query_len`` = Tq): ``traffic(shape,
params, itemsize)`` -> (bytes of cache or state read, bytes written), the work that makes
decoding memory-bound (the new q, k, v and the output, O(Tq d), are not counted); ``flops(shape,
params)``, None for the pairs the new rows attend (:func:`decode_flops`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor

from attnbench.core.capabilities import Requirement
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Mechanism, PathSpec, Shape, declared_keywords

DECODE = "decode"

#: traffic(shape, params, itemsize) -> (bytes read, bytes written) per call.
Traffic = Callable[[Shape, Mapping[str, Any], int], tuple[int, int]]


def _called_through_prefill_and_step(*args: Any, **kwargs: Any) -> Tensor:
    raise AttnbenchError(
        "a decode form is not a path: call its prefill and step (attnbench.core.decode)"
    )


@dataclass(frozen=True)
class DecodePath(PathSpec):
    """One decode form of a mechanism (see the module docstring). A :class:`PathSpec` of kind
    ``decode``, so that the capability checks, the speed sweep's rows and ``requires`` work as
    for any path; it is not in ``Mechanism.paths`` and is never called as one."""

    kind: str = DECODE  # type: ignore[assignment]
    fn: Callable[..., Tensor] = _called_through_prefill_and_step
    memory: str = ""
    backward: bool = False
    prefill: Callable[..., Any] | None = None
    step: Callable[..., tuple[Tensor, Any]] | None = None
    traffic: Traffic | None = None
    flops: Callable[[Shape, Mapping[str, Any]], int] | None = None

    def __post_init__(self) -> None:
        if self.prefill is None or self.step is None or self.traffic is None:
            raise TypeError(f"decode form {self.name}: prefill, step and traffic are required")

    def start(self, q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Any:
        """``prefill`` with the keywords it declares."""
        return self.prefill(q, k, v, **_declared(self.prefill, kwargs))

    def advance(self, state: Any, q: Tensor, k: Tensor, v: Tensor, **kwargs: Any):
        """``step`` with the keywords it declares: (outputs, the state after them)."""
        return self.step(state, q, k, v, **_declared(self.step, kwargs))


def _declared(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    accepted = declared_keywords(fn)
    return dict(kwargs) if accepted is None else {k: v for k, v in kwargs.items() if k in accepted}


def no_decode_form(reason: str) -> DecodePath:
    """The placeholder a speed suite runs for a mechanism without a decode form: never
    available, ``reason`` its row's reason."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AttnbenchError(reason)

    return DecodePath(
        DECODE,
        requires=(Requirement("decode-form", lambda device, backward: reason),),
        prefill=refuse,
        step=refuse,
        traffic=lambda shape, params, itemsize: (0, 0),
    )


# --------------------------------------------------------------------------------------------
# States
# --------------------------------------------------------------------------------------------


@dataclass
class DecodeState:
    """What a decode form carries between steps; ``length``: the tokens consumed so far."""

    length: int

    def tensors(self) -> list[Tensor]:
        """Every tensor the state holds (in tuples and nested states too)."""
        out: list[Tensor] = []
        for f in fields(self):
            value = getattr(self, f.name)
            for x in value if isinstance(value, tuple) else (value,):
                if isinstance(x, Tensor):
                    out.append(x)
                elif isinstance(x, DecodeState):
                    out.extend(x.tensors())
        return out

    def nbytes(self) -> int:
        """The memory the state holds (a KV cache: its whole capacity)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())


@dataclass
class KVCache(DecodeState):
    """Keys and values of every token so far, in buffers with room for more: k ``[B, Hkv, C,
    D]``, v ``[B, Hkv, C, Dv]`` (C the capacity), the first ``length`` positions filled."""

    k: Tensor
    v: Tensor
    extra: tuple[Tensor, ...] = field(default=())  # more per-token tensors kept alike

    @classmethod
    def prefill(cls, k: Tensor, v: Tensor, capacity: int, *extra: Tensor) -> KVCache:
        n = k.shape[-2]
        buffers = [_buffer(x, max(capacity, n)) for x in (k, v, *extra)]
        return cls(n, buffers[0], buffers[1], tuple(buffers[2:]))

    @property
    def capacity(self) -> int:
        return self.k.shape[-2]

    def append(self, k: Tensor, v: Tensor, *extra: Tensor) -> KVCache:
        """The cache with ``k``, ``v`` (``[B, Hkv, T, .]``) written after ``length``: in place
        when they fit (the slots after ``length`` are overwritten: a repeated step writes the
        same ones), else into buffers twice as large."""
        n, t = self.length, k.shape[-2]
        olds = (self.k, self.v, *self.extra)
        if n + t > self.capacity:
            olds = tuple(_buffer(x[:, :, :n], max(2 * self.capacity, n + t)) for x in olds)
        for buf, new in zip(olds, (k, v, *extra), strict=True):
            buf[:, :, n : n + t].copy_(new)
        return KVCache(n + t, olds[0], olds[1], tuple(olds[2:]))

    def keys(self) -> Tensor:
        return self.k[:, :, : self.length]

    def values(self) -> Tensor:
        return self.v[:, :, : self.length]


def _buffer(x: Tensor, capacity: int) -> Tensor:
    """``x`` ``[B, H, n, D]`` copied to the front of a new ``[B, H, capacity, D]`` buffer."""
    b, h, n, d = x.shape
    buf = x.new_zeros(b, h, capacity, d)
    buf[:, :, :n].copy_(x)
    return buf


# --------------------------------------------------------------------------------------------
# Helpers of the decode forms
# --------------------------------------------------------------------------------------------


def positions(start: int, count: int, device: torch.device | str) -> Tensor:
    """The absolute positions start .. start + count - 1 (int64)."""
    return torch.arange(start, start + count, device=device)


def new_rows_mask(start: int, count: int, total: int, device: torch.device | str) -> Tensor:
    """Boolean ``[count, total]``: the new query at position start + a sees keys j <= start + a
    (causal, aligned to the bottom right of the square)."""
    j = torch.arange(total, device=device)
    return j[None, :] <= positions(start, count, device)[:, None]


def cache_traffic(shape: Shape, params: Mapping[str, Any], itemsize: int) -> tuple[int, int]:
    """A whole-cache read: every key and value of the n + Tq tokens read, the Tq new written."""
    per_token = shape.batch * shape.hkv * (shape.head_dim + shape.dv) * itemsize
    tq = shape.query_len or 0
    return per_token * (shape.seq_len + tq), per_token * tq


def decode_flops(mech: Mechanism, path: PathSpec, shape: Shape, params: Mapping[str, Any]) -> int:
    """FLOPs of one decode call: the path's own count, else what the mechanism's count adds for
    the Tq new rows (exact for counts of attended pairs: the pairs of rows n .. n + Tq - 1)."""
    if getattr(path, "flops", None) is not None and isinstance(path, DecodePath):
        return int(path.flops(shape, params))
    n, tq = shape.seq_len, shape.query_len or 0
    whole = replace(shape, seq_len=n + tq, query_len=None)
    before = replace(shape, query_len=None)
    return mech.forward_flops(whole, True, params) - (
        mech.forward_flops(before, True, params) if n else 0
    )


def split_tokens(
    mech: Mechanism, params: Mapping[str, Any], inputs: Mapping[str, Tensor], n: int
) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """``make_inputs``' tensors over n + Tq tokens as (the first n tokens, the next Tq, the
    learned parameters): q, k, v and the extra inputs of role ``input`` are cut along the
    sequence (dim 2); the other extra inputs are passed whole."""
    per_token = {"q", "k", "v"} | {e.name for e in mech.extras_for(params) if e.role == "input"}
    prefix, new, shared = {}, {}, {}
    for name, t in inputs.items():
        if name in per_token:
            prefix[name], new[name] = t[:, :, :n], t[:, :, n:]
        else:
            shared[name] = t
    return prefix, new, shared


def decode_outputs(
    mech: Mechanism,
    path: DecodePath,
    inputs: Mapping[str, Tensor],
    params: Mapping[str, Any],
    n: int,
    steps: list[int],
) -> tuple[Tensor, Any]:
    """Prefill the first n tokens of ``inputs``, then feed the rest in steps of ``steps``
    tokens; the outputs of every fed token ``[B, H, sum(steps), Dv]`` and the last state."""
    total = inputs["q"].shape[2]
    if n + sum(steps) != total:
        raise ValueError(f"n={n} and steps {steps} do not add up to {total} tokens")
    prefix, rest, shared = split_tokens(mech, params, inputs, n)
    kwargs = {**params, **shared}
    state = path.start(prefix["q"], prefix["k"], prefix["v"], capacity=total,
                       **{**kwargs, **_extras(prefix)})  # fmt: skip
    outs, at = [], 0
    for size in steps:
        piece = {name: t[:, :, at : at + size] for name, t in rest.items()}
        o, state = path.advance(state, piece["q"], piece["k"], piece["v"],
                                **{**kwargs, **_extras(piece)})  # fmt: skip
        outs.append(o)
        at += size
    return torch.cat(outs, dim=2), state


def _extras(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: v for k, v in tensors.items() if k not in ("q", "k", "v")}
