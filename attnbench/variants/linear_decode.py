"""Decoding linear attention from its recurrent state (Katharopoulos et al. 2020, "Transformers
are RNNs"): the state after n tokens is S_n = sum_t phi(K_t)^T [V_t, 1] (``[D, Dv + 1]`` per
head: the last column is the normaliser's sum of phi(K)), whatever n is, so a step reads and
writes O(d^2) bytes where softmax reads the whole cache.

* ``recurrent``: ours, in plain torch. ``prefill`` sums the n tokens' phi(K)^T [V, 1] in one
  product; a step of Tq tokens is exact causal attention inside the block (a Tq x Tq triangle)
  plus phi(Q) S_n, and returns S_{n+Tq} = S_n + phi(K)^T [V, 1] as a new tensor. The state is
  float32 for half inputs, as every path of the mechanism sums in float32.
* ``triton-recurrent`` (CUDA): the same state (the same prefill), stepped by one Triton kernel
  (:func:`attnbench.kernels.decode_ops.recurrent_step`): the state read once and written once
  per call, phi, the normaliser, eps and the cast in registers, every head in one launch.
* ``fla-recurrent`` (CUDA): FLA's ``fused_recurrent_linear_attn`` stepping from the final
  state the same kernel left after the prompt (FLA's own prefill), with FLA's conventions
  (scale 1, the normaliser's 1e-10: :mod:`attnbench.libraries.fla`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnbench.core.capabilities import FLA_CORE
from attnbench.core.decode import DecodePath, DecodeState
from attnbench.core.errors import AttnbenchError
from attnbench.core.precision import HALF, refuse_overflow, to_dtype
from attnbench.core.spec import Shape
from attnbench.kernels import decode_ops
from attnbench.kernels.triton_ops import REQUIRES
from attnbench.libraries import fla


@dataclass
class LinearState(DecodeState):
    """S = sum phi(K)^T [V, 1] over the tokens so far, ``[B, H, D, Dv']``."""

    s: Tensor


#: phi(x, feature_map): the mechanism's feature maps (:func:`attnbench.variants.linear.phi`),
#: given by :func:`decode_forms` (the mechanism's module imports this one).
FeatureMap = Callable[[Tensor, str], Tensor]


def _values(v: Tensor, normalize: bool) -> Tensor:
    return torch.cat((v, torch.ones_like(v[..., :1])), dim=-1) if normalize else v


def _work(x: Tensor) -> Tensor:
    return x.float() if x.dtype in HALF else x


def prefill_with(phi: FeatureMap):
    def prefill(
        q: Tensor, k: Tensor, v: Tensor, *, feature_map: str, normalize: bool
    ) -> LinearState:
        """The state after the first n tokens: phi(K)^T [V, 1] in one product."""
        fk, vv = phi(_work(k), feature_map), _values(_work(v), normalize)
        return LinearState(k.shape[2], fk.transpose(-2, -1) @ vv)  # (B, H, D, Dv')

    return prefill


def step_with(phi: FeatureMap):
    def step(
        state: LinearState,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        feature_map: str,
        normalize: bool,
        eps: float,
    ) -> tuple[Tensor, LinearState]:
        """Tq new tokens: inside the block densely (causal), phi(Q) S for the tokens before."""
        fq, fk = phi(_work(q), feature_map), phi(_work(k), feature_map)
        vv = _values(_work(v), normalize)
        inner = (fq @ fk.transpose(-2, -1)).tril_()  # (B, H, Tq, Tq)
        o = inner @ vv + fq @ state.s  # (B, H, Tq, Dv')
        new = LinearState(state.length + q.shape[2], state.s + fk.transpose(-2, -1) @ vv)
        if normalize:
            o = o[..., :-1] / (o[..., -1:] + eps)
        return to_dtype(o, q.dtype, "linear:recurrent (decode)"), new

    return step


def triton_step(
    state: LinearState,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str,
    normalize: bool,
    eps: float,
) -> tuple[Tensor, LinearState]:
    """Tq new tokens through the Triton recurrent kernel: per token S += phi(k)^T [v, 1],
    o = phi(q) S, / (phi(q) . z + eps); the state read and written once."""
    o, s = decode_ops.recurrent_step(
        state.s, q, k, v, feature_map=feature_map,
        finish="normalize" if normalize else "none", eps=eps,
    )  # fmt: skip
    o = refuse_overflow(o, (q, k, v), "linear:triton-recurrent (decode)")
    return o, LinearState(state.length + q.shape[2], s)


def state_traffic(shape: Shape, params: Mapping[str, Any], itemsize: int) -> tuple[int, int]:
    """The state read and a new one written: B H D (Dv + 1) numbers each, float32 for half."""
    width = shape.dv + (1 if params["normalize"] else 0)
    size = shape.batch * shape.heads * shape.head_dim * width * max(itemsize, 4)
    return size, size


def flops(shape: Shape, params: Mapping[str, Any]) -> int:
    """Per new token and head: phi(q) S (2 D Dv'), S += phi(k)^T [v, 1] (2 D Dv'); inside the
    block, phi(Q) phi(K)^T and its product with [V, 1] over the Tq x Tq square."""
    tq, d = shape.query_len or 0, shape.head_dim
    dv = shape.dv + (1 if params["normalize"] else 0)
    per_head = 2 * tq * d * dv * 2 + 2 * tq * tq * (d + dv)
    return shape.batch * shape.heads * per_head


# --------------------------------------------------------------------------------------------
# FLA's fused recurrent kernel (CUDA)
# --------------------------------------------------------------------------------------------


@dataclass
class FlaState(DecodeState):
    """FLA's final state: [B, H, D, Dv] (and, normalised, the running phi(K) sum [B, 1, H, D])."""

    s: Tensor | None
    z: Tensor | None = None


def _bthd(x: Tensor) -> Tensor:
    return x.transpose(1, 2)


def _fla_inputs(phi: FeatureMap, q: Tensor, k: Tensor, feature_map: str) -> tuple[Tensor, Tensor]:
    """phi applied in float32 and cast back, as the ``fla-*`` paths do."""
    return phi(q.float(), feature_map).to(q.dtype), phi(k.float(), feature_map).to(k.dtype)


def _fla_state(final: Any, length: int, normalize: bool) -> FlaState:
    if normalize and isinstance(final, tuple):
        return FlaState(length, final[0], final[1])
    return FlaState(length, final)


def fla_prefill_with(phi: FeatureMap):
    def fla_prefill(
        q: Tensor, k: Tensor, v: Tensor, *, feature_map: str, normalize: bool
    ) -> FlaState:
        """FLA's own prefill: its fused recurrent kernel over the n tokens, keeping the final
        state (float16 with the normaliser refused, as the ``fla-*`` paths refuse it)."""
        if normalize and q.dtype == torch.float16:
            raise AttnbenchError(fla.FLOAT16_NORMALISER)
        if k.shape[2] == 0:
            return FlaState(0, None)
        fq, fk = _fla_inputs(phi, q, k, feature_map)
        kernel = fla.kernel("linear-recurrent")
        _, final = kernel(_bthd(fq), _bthd(fk), _bthd(v), scale=1.0, normalize=normalize,
                          output_final_state=True)  # fmt: skip
        return _fla_state(final, k.shape[2], normalize)

    return fla_prefill


def fla_step_with(phi: FeatureMap):
    def fla_step(
        state: FlaState, q: Tensor, k: Tensor, v: Tensor, *, feature_map: str, normalize: bool
    ) -> tuple[Tensor, FlaState]:
        """FLA's fused recurrent kernel from the state: scale 1, its normaliser (+1e-10)."""
        fq, fk = _fla_inputs(phi, q, k, feature_map)
        initial = state.s if not normalize or state.s is None else (state.s, state.z)
        kernel = fla.kernel("linear-recurrent")
        o, final = kernel(_bthd(fq), _bthd(fk), _bthd(v), scale=1.0, normalize=normalize,
                          initial_state=initial, output_final_state=True)  # fmt: skip
        return _bthd(o), _fla_state(final, state.length + q.shape[2], normalize)

    return fla_step


def decode_forms(phi: FeatureMap) -> tuple[DecodePath, ...]:
    """``recurrent``, ``triton-recurrent`` and ``fla-recurrent``, with the mechanism's feature
    maps ``phi``."""
    return (
        DecodePath(
            "recurrent",
            prefill=prefill_with(phi),
            step=step_with(phi),
            traffic=state_traffic,
            flops=flops,
            memory="O(d^2) state per head, whatever n",
            note="S = sum phi(K)^T [V, 1]; a step: the block's triangle + phi(Q) S; fp32 state",
        ),
        DecodePath(
            "triton-recurrent",
            prefill=prefill_with(phi),
            step=triton_step,
            traffic=state_traffic,
            flops=flops,
            memory="O(d^2) state per head, whatever n",
            requires=REQUIRES,
            note="Triton: the fp32 state read and written once a call, phi and normaliser fused",
        ),
        DecodePath(
            "fla-recurrent",
            prefill=fla_prefill_with(phi),
            step=fla_step_with(phi),
            traffic=state_traffic,
            flops=flops,
            memory="O(d^2) state per head, whatever n",
            requires=(*REQUIRES, FLA_CORE),
            note="FLA's fused_recurrent_linear_attn from its own prefill's final state (fla-core)",
        ),
    )
