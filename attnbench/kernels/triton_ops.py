"""The Triton-backed operators, as plain functions and path factories, without importing Triton.

This module checks a call (device, dtype, head dims) and raises a one-line AttnbenchError when a
kernel cannot take it; only then does it import the kernel module (:mod:`triton_gau`,
:mod:`triton_retention`, :mod:`triton_linear`), so ``import attnbench`` and ``attnbench list``
work without Triton.

Operators (all tensors ``[B, H, T, D]``; v ``[B, H, T, Dv]``; output ``[B, H, T, Dv]``):

* :func:`relu2_attention` / :func:`gau_relu2`: relu^2 attention (GAU; FLASH's local part with
  ``chunk``), forward and backward.
* :func:`retention_chunked` / :func:`linear_attention_chunked`: causal decayed linear attention
  o_t = sum_{s<=t} gamma^(t-s) (q_t . k_s) v_s, chunkwise, forward and backward.
* :func:`linear_attention_global`: bidirectional linear attention scale * phi(q_t) S /
  (phi(q_t) . z + eps), S = sum_t phi(k_t)^T v_t, z = sum_t phi(k_t) (FLASH's bidirectional
  global part: identity, no normaliser, 1/T), forward and backward.

On a CPU these run only under Triton's interpreter (``TRITON_INTERPRET=1`` set before the kernel
module is first imported), which is what the CPU tests do; the registry paths require CUDA.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from attnbench.core.capabilities import CUDA, TRITON
from attnbench.core.errors import AttnbenchError
from attnbench.core.precision import refuse_overflow
from attnbench.core.spec import PathSpec

#: dtypes the Triton kernels take (tl.dot has no float64 tensor-core path).
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Largest q/k head dim a kernel tile holds (GAU's s = 128 fits); v dims beyond it are split.
MAX_HEAD_DIM = 128
#: What a Triton path needs from the machine.
REQUIRES = (CUDA, TRITON)


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_call(
    kernel: str, q: Tensor, k: Tensor, v: Tensor, *, max_v: int | None, same_heads: bool = True
) -> None:
    """Raise AttnbenchError (one line) when the ``kernel`` cannot take this call (``same_heads``:
    as many K/V heads as query heads; the decode kernels share K/V heads by groups)."""
    if q.device.type != "cuda" and not interpreting():
        raise AttnbenchError(
            f"{kernel}: the Triton kernel needs CUDA tensors (got {q.device.type}); "
            "on a CPU it runs only under TRITON_INTERPRET=1"
        )
    if q.dtype not in DTYPES or not (q.dtype == k.dtype == v.dtype):
        ok = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise AttnbenchError(f"{kernel}: the Triton kernel does not take {q.dtype}; accepted: {ok}")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise AttnbenchError(
            f"{kernel}: head dim {q.shape[-1]} is beyond the Triton kernel's limit; "
            f"accepted: 1..{MAX_HEAD_DIM}"
        )
    if max_v is not None and v.shape[-1] > max_v:
        raise AttnbenchError(
            f"{kernel}: value dim {v.shape[-1]} is beyond the Triton kernel's limit; "
            f"accepted: 1..{max_v}"
        )
    if same_heads and k.shape[1] != q.shape[1]:
        raise AttnbenchError(
            f"{kernel}: the Triton kernel needs as many K/V heads as query heads "
            f"(q {q.shape[1]}, k {k.shape[1]})"
        )


def _last_dim_contiguous(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


# --------------------------------------------------------------------------------------------
# relu^2 attention (GAU, FLASH's quadratic part)
# --------------------------------------------------------------------------------------------


class _Relu2Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, row_rel, pre, post, causal, chunk, blocks):
        from attnbench.kernels import triton_gau

        o = triton_gau.forward(q, k, v, row_rel, pre, post, causal, chunk, *blocks)
        ctx.save_for_backward(q, k, v, row_rel)
        ctx.args = (pre, post, causal, chunk, blocks)
        return o

    @staticmethod
    def backward(ctx, do):
        from attnbench.kernels import triton_gau

        q, k, v, row_rel = ctx.saved_tensors
        pre, post, causal, chunk, blocks = ctx.args
        dq, dk, dv = triton_gau.backward(q, k, v, do, row_rel, pre, post, causal, chunk, *blocks)
        return dq, dk, dv, None, None, None, None, None, None


def relu2_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    row_scale: Tensor,
    *,
    causal: bool,
    chunk: int = 0,
    blocks: tuple[int | None, int | None] = (None, None),
) -> Tensor:
    """o_i = row_scale_i * sum_j mask_ij relu(q_i . k_j)^2 v_j with the Triton kernels.

    q, k ``[B, H, T, D]`` (D <= 128), v ``[B, H, T, Dv]`` (Dv <= 256 in one kernel call; a wider
    v is split into slices of 256, autograd sums their dq, dk) -> ``[B, H, T, Dv]``.
    ``row_scale``: ``[T]`` positive factors. mask: j <= i when ``causal``; i // chunk == j // chunk
    when ``chunk`` > 0. ``blocks``: tile sizes (query, key), None for the kernels' own per-kernel
    tiles (tests use small ones).
    """
    T = q.shape[-2]
    if row_scale.shape != (T,):
        raise AttnbenchError(f"row_scale has shape {tuple(row_scale.shape)}; needs ({T},)")
    row_rel, r_max = _relative(row_scale.detach().to("cpu", torch.float64))  # (a device sync)
    return _relu2(q, k, v, row_rel.to(q.device), r_max, causal, chunk, blocks)


def _relative(row_scale: Tensor) -> tuple[Tensor, float]:
    """A CPU float64 row scale as (row_scale / r_max in float32, r_max), r_max = max |scale|."""
    r_max = float(row_scale.abs().max()) if row_scale.numel() else 1.0
    r_max = r_max or 1.0
    return (row_scale / r_max).to(torch.float32).contiguous(), r_max  # (T,), |row_rel| <= 1


#: Widest v slice one relu^2 kernel call takes (the kernels' MAX_VALUE_DIM, kept here so this
#: module need not import triton): one call computes each score tile once for the whole slice, so
#: GAU's e = 256 is one call; a wider v is split into slices of this and the slices' dq, dk summed.
MAX_VALUE_DIM = 256


def _relu2(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    row_rel: Tensor,
    r_max: float,
    causal: bool,
    chunk: int,
    blocks: tuple[int | None, int | None],
) -> Tensor:
    check_call("relu2 attention", q, k, v, max_v=None)
    if chunk < 0:
        raise AttnbenchError(f"relu2 attention: invalid chunk={chunk}; accepted: 0 (none) or >= 1")
    D = q.shape[-1]
    pre, post = 1.0 / D, r_max * D  # relu^2 tile * pre in the input dtype, * post in fp32
    q, k = _last_dim_contiguous(q), _last_dim_contiguous(k)
    outs = []
    for i in range(0, v.shape[-1], MAX_VALUE_DIM):  # slices of v, each one kernel call
        v_slice = _last_dim_contiguous(v[..., i : i + MAX_VALUE_DIM])
        args = (row_rel, pre, post, causal, chunk, blocks)
        outs.append(_Relu2Attention.apply(q, k, v_slice, *args))  # (B, H, T, <= 256)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


#: GAU normalisations: "ns" = 1/(n_i s) (Su 2022's choice), "n2" = 1/n_i^2 (the paper's code).
GAU_NORMS = ("ns", "n2")


def keys_per_row(t: int, causal: bool, chunk: int = 0, device: Any = "cpu") -> Tensor:
    """n_i, the number of keys row i sees, as float64 ``[T]``: T (bidirectional), i + 1 (causal);
    with ``chunk`` > 0, counted inside row i's chunk only."""
    i = torch.arange(t, device=device, dtype=torch.float64)
    if chunk > 0:
        start = torch.div(i, chunk, rounding_mode="floor") * chunk
        if causal:
            return i - start + 1
        return torch.clamp(t - start, max=chunk)
    return i + 1 if causal else torch.full_like(i, float(t))


def gau_row_scale(
    t: int, head_dim: int, causal: bool, norm: str, chunk: int = 0, device: Any = "cpu"
) -> Tensor:
    """GAU's per-row factor, float64 ``[T]``: 1/(n_i s) for ``ns``, 1/n_i^2 for ``n2``."""
    n = keys_per_row(t, causal, chunk, device)
    if norm == "ns":
        return 1.0 / (n * head_dim)
    if norm == "n2":
        return 1.0 / (n * n)
    raise AttnbenchError(f"invalid GAU norm={norm!r}; accepted: {', '.join(GAU_NORMS)}")


def gau_relu2(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    norm: str = "ns",
    chunk: int = 0,
    blocks: tuple[int | None, int | None] = (None, None),
) -> Tensor:
    """GAU attention A V with A = relu^2(q k^T) / (n_i s) (``norm="ns"``) or / n_i^2 (``"n2"``),
    n_i = keys row i sees (T, or i + 1 when causal; counted within the chunk when ``chunk`` > 0),
    s = D. q, k ``[B, H, T, D]``, v ``[B, H, T, Dv]`` -> ``[B, H, T, Dv]``. Su 2022.
    """
    if norm not in GAU_NORMS:
        raise AttnbenchError(f"invalid GAU norm={norm!r}; accepted: {', '.join(GAU_NORMS)}")
    row_rel, r_max = _gau_scales(q.shape[-2], q.shape[-1], causal, norm, chunk, str(q.device))
    return _relu2(q, k, v, row_rel, r_max, causal, chunk, blocks)


@functools.lru_cache(maxsize=64)
def _gau_scales(
    t: int, head_dim: int, causal: bool, norm: str, chunk: int, device: str
) -> tuple[Tensor, float]:
    """GAU's row scale for one shape, made once on the CPU and kept on ``device`` (no per-call
    host-device traffic or sync)."""
    row_rel, r_max = _relative(gau_row_scale(t, head_dim, causal, norm, chunk))
    return row_rel.to(device), r_max


# --------------------------------------------------------------------------------------------
# Chunked causal linear attention / retention
# --------------------------------------------------------------------------------------------


def _log2_gamma(gamma: float | Sequence[float] | Tensor, heads: int, device: Any) -> Tensor:
    """log2(gamma) per head, float32 ``[H]`` on ``device``; numbers are cached per device."""
    if isinstance(gamma, Tensor):
        return _log2_gamma_of(gamma.detach().to("cpu", torch.float64), heads).to(device)
    values = (float(gamma),) if isinstance(gamma, (int, float)) else tuple(map(float, gamma))
    return _log2_gamma_cached(values, heads, str(device))


@functools.lru_cache(maxsize=64)
def _log2_gamma_cached(values: tuple[float, ...], heads: int, device: str) -> Tensor:
    return _log2_gamma_of(torch.tensor(values, dtype=torch.float64), heads).to(device)


def _log2_gamma_of(g: Tensor, heads: int) -> Tensor:
    g = g.flatten()
    if g.numel() == 1:
        g = g.expand(heads)
    if g.numel() != heads:
        raise AttnbenchError(
            f"gamma has {g.numel()} values; accepted: one, or one per head ({heads})"
        )
    if not bool(((g > 0) & (g <= 1)).all()):
        raise AttnbenchError(f"invalid gamma {g.tolist()}; accepted: 0 < gamma <= 1")
    return torch.log2(g).to(torch.float32).contiguous()  # (H,)


class _Retention(torch.autograd.Function):
    """Chunk-parallel forward and backward (triton_retention): forward = a state pass and an
    output kernel; backward = a reversed state pass (dh) and two kernels parallel over chunks
    (dv; dq and dk). ``log2g`` None: gamma = 1 without decay arithmetic; ``chunk`` None:
    retention, else FLASH's global part over whole chunks of ``chunk``.

    The forward's states h ([B*H, T / block, D, Dv] float32) are kept for the backward instead
    of recomputed (FLA recomputes them): it saves one of the backward's two sequential state
    passes, and the peak memory of forward + backward is the same either way, since the
    backward holds h and dh together while dq, dk, dv are computed; what grows is only the
    memory kept between forward and backward, O(T D Dv / block)."""

    @staticmethod
    def forward(ctx, q, k, v, log2g, block, chunk):
        from attnbench.kernels import triton_retention

        o, h = triton_retention.forward(q, k, v, log2g, block=block, chunk=chunk)
        ctx.save_for_backward(q, k, v, log2g, h)
        ctx.opts = {"block": block, "chunk": chunk}
        return o

    @staticmethod
    def backward(ctx, do):
        from attnbench.kernels import triton_retention

        q, k, v, log2g, h = ctx.saved_tensors
        do = _last_dim_contiguous(do)
        dq, dk, dv = triton_retention.backward(q, k, v, do, h, log2g, **ctx.opts)
        return dq, dk, dv, None, None, None


def retention_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: float | Sequence[float] | Tensor,
    *,
    block: int | None = None,
) -> Tensor:
    """Causal o_t = sum_{s<=t} gamma_h^(t-s) (q_t . k_s) v_s, chunkwise (RetNet's chunkwise form,
    Sun et al. 2023; gamma = 1 is unnormalised causal linear attention). q, k ``[B, H, T, D]``,
    v ``[B, H, T, Dv]`` (D, Dv <= 128) -> ``[B, H, T, Dv]``. ``gamma``: one value or one per
    head, in (0, 1]. ``block``: chunk length, the kernels' tile (a power of two >= 16; default
    64; tests use 16).
    """
    check_call("retention", q, k, v, max_v=MAX_HEAD_DIM)
    _check_block("retention", block)
    log2g = _log2_gamma(gamma, q.shape[1], q.device)
    q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))
    return _Retention.apply(q, k, v, log2g, block, None)


def _check_block(kernel: str, block: int | None) -> None:
    if block is not None and (block < 16 or block & (block - 1)):
        raise AttnbenchError(
            f"{kernel}: invalid chunk length {block}; accepted: a power of two >= 16"
        )


def linear_attention_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    normalize: bool = True,
    gamma: float | Sequence[float] | Tensor = 1.0,
    eps: float = 0.0,
    block: int | None = None,
) -> Tensor:
    """Causal linear attention on already feature-mapped q, k (phi applied by the caller):
    o_t = sum_{s<=t} (q_t . k_s) v_s / (sum_{s<=t} q_t . k_s + eps) when ``normalize``, else the
    numerator alone. The denominator is the same kernel with v = ones ``[B, H, T, 1]``.
    q, k ``[B, H, T, D]``, v ``[B, H, T, Dv]`` -> ``[B, H, T, Dv]``.
    """
    num = retention_chunked(q, k, v, gamma, block=block)
    if not normalize:
        return num
    ones = torch.ones(v.shape[:-1] + (1,), dtype=v.dtype, device=v.device)
    den = retention_chunked(q, k, ones, gamma, block=block)  # (B, H, T, 1)
    return num / (den + eps)


def flash_global_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    chunk: int,
    row_scale: Tensor | None = None,
) -> Tensor:
    """FLASH's causal global (linear) part (Su 2022): for t in chunk g = floor(t / c),
    o_t = row_scale_t * q_t . sum_{s < g c} k_s^T v_s, the sum over whole earlier chunks only
    (exclusive cumulative sum). ``row_scale`` default: 1 / (g c), the count of tokens summed (Su
    2022's correction; chunk 0 sums nothing and gives 0). q, k ``[B, H, T, D]`` (already the
    Q_lin, K_lin affine maps), v ``[B, H, T, Dv]`` (D, Dv <= 128) -> ``[B, H, T, Dv]``.
    ``chunk`` c: a power of two >= 16 (FLASH uses 256); the kernels walk tiles of min(c, 64)
    positions and keep states only at multiples of c.
    """
    check_call("flash global", q, k, v, max_v=MAX_HEAD_DIM)
    _check_block("flash global", chunk)
    T = q.shape[-2]
    if row_scale is None:
        summed = torch.div(torch.arange(T, device=q.device), chunk, rounding_mode="floor") * chunk
        row_scale = 1.0 / summed.clamp(min=1).to(torch.float32)  # (T,)
    q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))
    o = _Retention.apply(q, k, v, None, None, chunk)  # (B, H, T, Dv), gamma = 1
    return o * row_scale.to(device=o.device, dtype=o.dtype)[:, None]


# --------------------------------------------------------------------------------------------
# Bidirectional (global) linear attention: linear:triton bidirectional, FLASH's global part
# --------------------------------------------------------------------------------------------

#: Feature maps the global linear kernels apply in registers (the names of
#: attnbench.variants.linear.FEATURE_MAPS).
LINEAR_FEATURE_MAPS = ("elu+1", "relu", "identity")


class _LinearGlobal(torch.autograd.Function):
    """Saves q, k, v and the float32 state [S, z] ([B*H, D, Dv (+1)]: O(d^2) a head), not the
    output: the backward recomputes phi and reads S, z (see triton_linear)."""

    @staticmethod
    def forward(ctx, q, k, v, feature_map, normalize, eps, scale, block, splits):
        from attnbench.kernels import triton_linear

        ctx.args = (feature_map, normalize, eps, scale, block, splits)
        o, state = triton_linear.forward(q, k, v, *ctx.args)
        ctx.save_for_backward(q, k, v, state)
        return o

    @staticmethod
    def backward(ctx, do):
        from attnbench.kernels import triton_linear

        q, k, v, state = ctx.saved_tensors
        dq, dk, dv = triton_linear.backward(q, k, v, state, do, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None


def linear_attention_global(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str = "identity",
    normalize: bool = False,
    eps: float = 0.0,
    scale: float = 1.0,
    block: int | None = None,
    splits: int | None = None,
) -> Tensor:
    """Bidirectional linear attention with the fused Triton kernels (Katharopoulos et al. 2020;
    FLASH's bidirectional global part, Hua et al. 2022, is identity, no normaliser, 1/T):

        S = sum_t phi(k_t)^T v_t,  z = sum_t phi(k_t)  (float32)
        o_t = scale * phi(q_t) S / (phi(q_t) . z + eps)   (``normalize``; else scale * phi(q_t) S)

    phi (``feature_map``: "elu+1", "relu", "identity") applied in float32 and rounded to the
    input dtype, as ``phi(x.float()).to(dtype)``. q, k ``[B, H, T, D]`` (D <= 128), v
    ``[B, H, T, Dv]`` (any Dv: split into slices of 128, each a kernel call whose dq, dk
    autograd sums; the normaliser does not depend on v, so a slice is the same formula) ->
    ``[B, H, T, Dv]`` in q's dtype. A float16 output past 65504 comes back as inf: callers
    refuse it (:func:`attnbench.core.precision.refuse_overflow`). ``block``: positions a tile
    (a power of two >= 16, default 64); ``splits``: programs per (b, h) along T (default:
    enough to fill the GPU); tests set both small. Deterministic (no atomics).
    """
    check_call("linear attention", q, k, v, max_v=None)
    if feature_map not in LINEAR_FEATURE_MAPS:
        ok = ", ".join(LINEAR_FEATURE_MAPS)
        raise AttnbenchError(f"invalid feature_map={feature_map!r}; accepted: {ok}")
    if not (math.isfinite(eps) and math.isfinite(scale)):
        raise AttnbenchError(f"linear attention: eps={eps}, scale={scale}; accepted: finite")
    _check_block("linear attention", block)
    if splits is not None and splits < 1:
        raise AttnbenchError(f"linear attention: invalid splits={splits}; accepted: >= 1")
    q, k = _last_dim_contiguous(q), _last_dim_contiguous(k)
    args = (feature_map, bool(normalize), float(eps), float(scale), block, splits)
    outs = []
    for i in range(0, v.shape[-1], MAX_HEAD_DIM):  # slices of v, each one kernel call
        v_slice = _last_dim_contiguous(v[..., i : i + MAX_HEAD_DIM])
        outs.append(_LinearGlobal.apply(q, k, v_slice, *args))  # (B, H, T, <=128)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


# --------------------------------------------------------------------------------------------
# PathSpec factories: the one-line wiring into a mechanism's ``paths``
# --------------------------------------------------------------------------------------------


#: ``refuse(params)``: why these parameters are beyond the kernel (None when they are not).
Refuse = Callable[[dict[str, Any]], str | None]


def fused_path(fn: Callable[..., Tensor], memory: str, note: str, name: str = "triton") -> PathSpec:
    """A fused PathSpec (needs CUDA and Triton) around a path function."""
    return PathSpec(name, "fused", fn, memory=memory, requires=REQUIRES, note=note)


def _refused(kernel: str, refuse: Refuse | None, params: dict[str, Any]) -> None:
    reason = refuse(params) if refuse is not None else None
    if reason:
        raise AttnbenchError(f"the Triton {kernel} kernel cannot run this call: {reason}")


def gau_path(
    norm: Callable[[dict[str, Any]], str] = lambda params: params.get("norm", "ns"),
    chunk: Callable[[dict[str, Any]], int] = lambda params: 0,
    refuse: Refuse | None = None,
) -> PathSpec:
    """The Triton GAU path; ``norm(params)`` gives "ns" or "n2", ``chunk(params)`` 0 or c;
    ``refuse(params)`` names parameter values the kernel does not compute."""

    def fn(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, **params: Any) -> Tensor:
        _refused("relu^2", refuse, params)
        o = gau_relu2(q, k, v, causal=causal, norm=norm(params), chunk=chunk(params))
        return refuse_overflow(o, (q, k, v), "relu^2 Triton kernel")

    fn.__name__ = fn.__qualname__ = "gau_triton"
    return fused_path(
        fn, memory="O(n) (scores recomputed in the backward)", note="Triton relu^2 kernels"
    )


def retnet_gammas(heads: int) -> list[float]:
    """RetNet's multi-scale decays, gamma_h = 1 - 2^(-5 - h) (Sun et al. 2023)."""
    return [1.0 - math.pow(2.0, -5.0 - h) for h in range(heads)]
