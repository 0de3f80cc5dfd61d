"""Decoding retention from its recurrent state (Sun et al. 2023, "Retentive Network"): RetNet's
recurrent form S_n = gamma S_{n-1} + K_n^T V_n, o_n = Q_n S_n / sqrt(d), one ``[D, Dv]`` state
per head whatever n is; ``rownorm`` carries a ones column beside V (the score row sums) and
divides at each new row's absolute position, so both normalisations decode exactly.

* ``recurrent``: ours, in plain torch. ``prefill`` builds S_n in one product, K^T (V scaled by
  gamma^(n - 1 - m) per key m); a step of Tq tokens is the chunkwise form on one chunk (the
  block's decayed triangle plus Q gamma^(a + 1) S_n) and returns S_{n+Tq} = gamma^Tq S_n +
  K^T (V gamma^(Tq - 1 - j)) as a new tensor, float32 for half inputs.
* ``triton-recurrent`` (CUDA): the same state (the same prefill), stepped by one Triton kernel
  (:func:`attnbench.kernels.decode_ops.recurrent_step`): the state read once and written once
  per call, the decay, 1/sqrt(d), rownorm's factors and the cast in registers.
* ``fla-recurrent`` (CUDA): FLA's ``fused_recurrent_retention`` stepping from the final state
  the same kernel left after the prompt (FLA's own prefill); normalize=none only, as FLA.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnbench.core.capabilities import FLA_CORE
from attnbench.core.decode import DecodePath, DecodeState
from attnbench.core.errors import AttnbenchError
from attnbench.core.precision import HALF
from attnbench.core.spec import Shape
from attnbench.kernels import decode_ops
from attnbench.kernels.triton_ops import REQUIRES
from attnbench.libraries import fla
from attnbench.variants.retention.decay import log_gammas, with_ones


@dataclass
class RetentionState(DecodeState):
    """S_n, ``[B, H, D, Dv']`` (Dv + 1 with ``rownorm``)."""

    s: Tensor


def _work(x: Tensor) -> Tensor:
    return x.float() if x.dtype in HALF else x


def _decays(heads: int, exponents: Tensor, dtype: torch.dtype) -> Tensor:
    """gamma_h^e for every head and exponent: ``[H, len(e)]`` (float64, then ``dtype``)."""
    return torch.exp(log_gammas(heads, exponents.device)[:, None] * exponents[None, :]).to(dtype)


def prefill(q: Tensor, k: Tensor, v: Tensor, *, normalize: str) -> RetentionState:
    """S_n = sum_m gamma^(n - 1 - m) K_m^T V_m, in one product."""
    kk, vv = _work(k), _work(v)
    vv = with_ones(vv) if normalize == "rownorm" else vv
    n, h = k.shape[2], k.shape[1]
    age = torch.arange(n - 1, -1, -1, dtype=torch.float64, device=k.device)  # n - 1 - m
    weighted = vv * _decays(h, age, vv.dtype)[:, :, None]  # (B, H, n, Dv')
    return RetentionState(n, kk.transpose(-2, -1) @ weighted)  # (B, H, D, Dv')


def _finish_at(o: Tensor, normalize: str, heads: int, start: int) -> Tensor:
    """``rownorm`` at absolute positions start ..: decay rows / sqrt(their sum), scores / max(|row
    sum|, 1) (as :func:`attnbench.variants.retention.decay.finish` for a whole sequence)."""
    if normalize == "none":
        return o
    log_g = log_gammas(heads, o.device)
    count = torch.arange(start + 1, start + 1 + o.shape[-2], dtype=torch.float64, device=o.device)
    row_sum = torch.expm1(count[None, :] * log_g[:, None]) / torch.expm1(log_g)[:, None]
    r = row_sum.rsqrt().to(o.dtype)[None, :, :, None]  # (1, H, Tq, 1)
    num, den = o[..., :-1] * r, o[..., -1:] * r
    return num / den.abs().clamp(min=1.0)


@functools.lru_cache(maxsize=64)
def step_decays(
    heads: int, tq: int, device: torch.device, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The decays of a step of Tq tokens, made once per shape (a decoder keeps them): inside
    the block gamma^(a - j) ``[H, Tq, Tq]``; from the state to row a, gamma^(a + 1) ``[H, Tq,
    1]``; the state's carry gamma^Tq ``[H, 1, 1]``; key j to the block's end ``[H, Tq, 1]``."""
    a = torch.arange(tq, dtype=torch.float64, device=device)
    gap = a[:, None] - a[None, :]  # (Tq, Tq)
    log_g = log_gammas(heads, device)[:, None, None]
    local = torch.where(gap >= 0, torch.exp(log_g * gap.clamp(min=0)), 0.0).to(dtype)
    across = _decays(heads, a + 1, dtype)[:, :, None]
    carry = _decays(heads, a[-1:] + 1, dtype)[:, :, None]
    to_end = _decays(heads, tq - 1 - a, dtype)[:, :, None]
    return local, across, carry, to_end


def step(
    state: RetentionState, q: Tensor, k: Tensor, v: Tensor, *, normalize: str
) -> tuple[Tensor, RetentionState]:
    """Tq new tokens: the decayed triangle inside the block, Q gamma^(a + 1) S_n across."""
    qs, kk, vv = _work(q) / math.sqrt(q.shape[-1]), _work(k), _work(v)
    vv = with_ones(vv) if normalize == "rownorm" else vv
    h, tq = q.shape[1], q.shape[2]
    local, across, carry, to_end = step_decays(h, tq, q.device, qs.dtype)
    inner = ((qs @ kk.transpose(-2, -1)) * local) @ vv  # (B, H, Tq, Dv')
    o = inner + (qs * across) @ state.s  # (B, H, Tq, Dv'): inside the block + from the state
    s = state.s * carry + kk.transpose(-2, -1) @ (vv * to_end)  # (B, H, D, Dv')
    o = _finish_at(o, normalize, h, state.length)
    return o.to(q.dtype), RetentionState(state.length + tq, s)


@functools.lru_cache(maxsize=16)
def _ln_gammas(heads: int, device: torch.device) -> Tensor:
    """ln(gamma_h) as float32 ``[H]`` on ``device``, made once (the kernel's decays)."""
    return log_gammas(heads, "cpu").to(device, torch.float32)


def triton_step(
    state: RetentionState, q: Tensor, k: Tensor, v: Tensor, *, normalize: str
) -> tuple[Tensor, RetentionState]:
    """Tq new tokens through the Triton recurrent kernel: per token S <- gamma S + k^T [v, 1],
    o = q S / sqrt(d), rownorm at the token's absolute position; the state read and written
    once."""
    o, s = decode_ops.recurrent_step(
        state.s, q, k, v, finish=normalize, ln_gamma=_ln_gammas(q.shape[1], q.device),
        scale=1.0 / math.sqrt(q.shape[-1]), start=state.length,
    )  # fmt: skip
    return o, RetentionState(state.length + q.shape[2], s)


def state_traffic(shape: Shape, params: Mapping[str, Any], itemsize: int) -> tuple[int, int]:
    """The state read and a new one written: B H D Dv' numbers each, float32 for half inputs."""
    width = shape.dv + (1 if params["normalize"] == "rownorm" else 0)
    size = shape.batch * shape.heads * shape.head_dim * width * max(itemsize, 4)
    return size, size


def flops(shape: Shape, params: Mapping[str, Any]) -> int:
    """Per new token and head: Q S and the state update (2 D Dv' each); inside the block Q K^T
    and its product with V over the Tq x Tq square (decays not counted, as in the paths)."""
    tq, d = shape.query_len or 0, shape.head_dim
    dv = shape.dv + (1 if params["normalize"] == "rownorm" else 0)
    return shape.batch * shape.heads * (2 * tq * d * dv * 2 + 2 * tq * tq * (d + dv))


RECURRENT = DecodePath(
    "recurrent",
    prefill=prefill,
    step=step,
    traffic=state_traffic,
    flops=flops,
    memory="O(d^2) state per head, whatever n",
    note="S_n = gamma S_{n-1} + K^T V; a step: one chunk of the chunkwise form; fp32 state",
)


TRITON_RECURRENT = DecodePath(
    "triton-recurrent",
    prefill=prefill,
    step=triton_step,
    traffic=state_traffic,
    flops=flops,
    memory="O(d^2) state per head, whatever n",
    requires=REQUIRES,
    note="Triton: the fp32 state read and written once a call; decay and rownorm fused",
)


# --------------------------------------------------------------------------------------------
# FLA's fused recurrent kernel (CUDA)
# --------------------------------------------------------------------------------------------


@dataclass
class FlaState(DecodeState):
    s: Tensor | None


def _bthd(x: Tensor) -> Tensor:
    return x.transpose(1, 2)


def _fla_only_none(normalize: str) -> None:
    if normalize != "none":
        raise AttnbenchError(
            f"retention:fla-recurrent decodes normalize=none only (FLA has no {normalize!r}); "
            "use the recurrent decode form"
        )


def _fla_run(q: Tensor, k: Tensor, v: Tensor, initial: Tensor | None) -> tuple[Tensor, Tensor]:
    kernel = fla.kernel("retention-recurrent")
    o, final = kernel(_bthd(q), _bthd(k), _bthd(v), scale=q.shape[-1] ** -0.5,
                      initial_state=initial, output_final_state=True)  # fmt: skip
    return _bthd(o), final


def fla_prefill(q: Tensor, k: Tensor, v: Tensor, *, normalize: str) -> FlaState:
    """FLA's own prefill: its fused recurrent kernel over the n tokens, the final state kept."""
    _fla_only_none(normalize)
    if k.shape[2] == 0:
        return FlaState(0, None)
    return FlaState(k.shape[2], _fla_run(q, k, v, None)[1])


def fla_step(
    state: FlaState, q: Tensor, k: Tensor, v: Tensor, *, normalize: str
) -> tuple[Tensor, FlaState]:
    _fla_only_none(normalize)
    o, final = _fla_run(q, k, v, state.s)
    return o, FlaState(state.length + q.shape[2], final)


FLA_RECURRENT = DecodePath(
    "fla-recurrent",
    prefill=fla_prefill,
    step=fla_step,
    traffic=state_traffic,
    flops=flops,
    memory="O(d^2) state per head, whatever n",
    requires=(*REQUIRES, FLA_CORE),
    note="FLA's fused_recurrent_retention from its own prefill's final state; normalize=none",
)

DECODE = (RECURRENT, TRITON_RECURRENT, FLA_RECURRENT)
