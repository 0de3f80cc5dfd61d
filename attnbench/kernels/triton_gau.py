"""Triton kernels for relu^2 attention (GAU, Hua et al. 2022, "Transformer Quality in Linear
Time"), forward and backward.

MUST EQUAL (the dense formula, written out in tests/kernels/test_triton_interpret.py):

    o_i = row_scale_i * sum_j mask_ij * relu(q_i . k_j)^2 * v_j

with mask_ij = [j < T] and [j <= i] when causal, and [i // chunk == j // chunk] when chunked
(FLASH's local quadratic part). ``row_scale`` is any per-row factor; GAU's 1/(n_i s) and 1/n_i^2
are computed by :func:`attnbench.kernels.triton_ops.gau_relu2`.

There is no softmax, so tiles are independent: no running max, no log-sum-exp. The forward keeps
one query tile and streams key tiles; the backward recomputes scores (never stores the n x n map)
in two kernels, one owning a key tile (dk, dv) and one owning a query tile (dq), so nothing needs
atomics. Causal and chunked calls skip key tiles that cannot be visible.

Precision: the tile of relu^2 scores is multiplied by ``pre`` (1/D) before it is cast to the
input dtype for the tensor-core matmul, so fp16 stays in range for |q.k| up to 255 * sqrt(D); the
per-row scale is applied in fp32 as ``row_rel * post`` (row_rel <= 1), keeping small GAU factors
like 1/(n s) out of fp16's subnormals. Accumulation is fp32; fp32 inputs use IEEE matmuls (no
TF32), so they match a plain fp32 reference.

Imported lazily (this module imports triton); call it through :mod:`attnbench.kernels.triton_ops`.
Tensors: q ``[B, H, T, D]``, k ``[B, H, T, D]``, v ``[B, H, T, Dv]``, last dim contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _keep(i, j, T, chunk, CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr):
    """mask_ij for broadcastable query indices i and key indices j."""
    keep = (i < T) & (j < T)
    if CAUSAL:
        keep = keep & (j <= i)
    if HAS_CHUNK:
        keep = keep & ((i // chunk) == (j // chunk))
    return keep


@triton.jit
def _key_range(
    start_m, T, chunk, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr
):
    """Keys [lo, hi) that queries start_m .. start_m + BLOCK_M - 1 can see."""
    lo = 0
    hi = T
    if CAUSAL:
        hi = tl.minimum(hi, start_m + BLOCK_M)
    if HAS_CHUNK:
        lo = (start_m // chunk) * chunk
        hi = tl.minimum(hi, ((start_m + BLOCK_M - 1) // chunk + 1) * chunk)
    return lo, hi


@triton.jit
def _query_range(
    start_n, T, chunk, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr
):
    """Queries [lo, hi) that can see keys start_n .. start_n + BLOCK_N - 1."""
    lo = 0
    hi = T
    if CAUSAL:
        lo = start_n
    if HAS_CHUNK:
        lo = tl.maximum(lo, (start_n // chunk) * chunk)
        hi = tl.minimum(hi, ((start_n + BLOCK_N - 1) // chunk + 1) * chunk)
    return lo, hi


@triton.jit
def _fwd(
    Q, K, V, O, ROW_REL, pre, post,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    H, T, D, DV, chunk,
    CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :],
        mask=(offs_m[:, None] < T) & (offs_d[None, :] < D),
        other=0.0,
    )  # (BLOCK_M, BD)
    acc = tl.zeros([BLOCK_M, BDV], dtype=tl.float32)
    lo, hi = _key_range(start_m, T, chunk, BLOCK_M, CAUSAL, HAS_CHUNK)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(
            K + b * skb + h * skh + offs_n[:, None] * skt + offs_d[None, :],
            mask=(offs_n[:, None] < T) & (offs_d[None, :] < D),
            other=0.0,
        )  # (BLOCK_N, BD)
        v = tl.load(
            V + b * svb + h * svh + offs_n[:, None] * svt + offs_dv[None, :],
            mask=(offs_n[:, None] < T) & (offs_dv[None, :] < DV),
            other=0.0,
        )  # (BLOCK_N, BDV)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        r = tl.maximum(s, 0.0)
        keep = _keep(offs_m[:, None], offs_n[None, :], T, chunk, CAUSAL, HAS_CHUNK)
        p = tl.where(keep, r * r * pre, 0.0)
        acc += tl.dot(p.to(v.dtype), v, input_precision=PRECISION)  # (BLOCK_M, BDV)
    row = tl.load(ROW_REL + offs_m, mask=offs_m < T, other=0.0) * post
    o = acc * row[:, None]
    tl.store(
        O + b * sob + h * soh + offs_m[:, None] * sot + offs_dv[None, :],
        o.to(O.dtype.element_ty),
        mask=(offs_m[:, None] < T) & (offs_dv[None, :] < DV),
    )


@triton.jit
def _bwd_dkdv(
    Q, K, V, DO, DK, DV_OUT, ROW_REL, pre, post,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
    s_dkb, s_dkh, s_dkt, s_dvb, s_dvh, s_dvt,
    H, T, D, DV, chunk,
    CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """dv_j = sum_i w_ij do_i and dk_j = sum_i ds_ij q_i for one key tile."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    kmask = (offs_n[:, None] < T) & (offs_d[None, :] < D)
    vmask = (offs_n[:, None] < T) & (offs_dv[None, :] < DV)
    k_ptrs = K + b * skb + h * skh + offs_n[:, None] * skt + offs_d[None, :]
    v_ptrs = V + b * svb + h * svh + offs_n[:, None] * svt + offs_dv[None, :]
    k = tl.load(k_ptrs, mask=kmask, other=0.0)  # (BLOCK_N, BD)
    v = tl.load(v_ptrs, mask=vmask, other=0.0)  # (BLOCK_N, BDV)
    dk = tl.zeros([BLOCK_N, BD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BDV], dtype=tl.float32)
    lo, hi = _query_range(start_n, T, chunk, BLOCK_N, CAUSAL, HAS_CHUNK)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = tl.load(
            Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :],
            mask=(offs_m[:, None] < T) & (offs_d[None, :] < D),
            other=0.0,
        )  # (BLOCK_M, BD)
        do = tl.load(
            DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_dv[None, :],
            mask=(offs_m[:, None] < T) & (offs_dv[None, :] < DV),
            other=0.0,
        )  # (BLOCK_M, BDV)
        row = tl.load(ROW_REL + offs_m, mask=offs_m < T, other=0.0) * pre  # (BLOCK_M,)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M) = s^T
        r_t = tl.maximum(s_t, 0.0)
        keep = _keep(offs_m[None, :], offs_n[:, None], T, chunk, CAUSAL, HAS_CHUNK)
        w_t = tl.where(keep, r_t * r_t * row[None, :], 0.0)  # relu^2 * row scale, transposed
        dv += tl.dot(w_t.to(do.dtype), do, input_precision=PRECISION)  # (BLOCK_N, BDV)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
        ds_t = tl.where(keep, 2.0 * r_t * dp_t * row[None, :], 0.0)
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)  # (BLOCK_N, BD)
    tl.store(
        DK + b * s_dkb + h * s_dkh + offs_n[:, None] * s_dkt + offs_d[None, :],
        (dk * post).to(DK.dtype.element_ty),
        mask=kmask,
    )
    tl.store(
        DV_OUT + b * s_dvb + h * s_dvh + offs_n[:, None] * s_dvt + offs_dv[None, :],
        (dv * post).to(DV_OUT.dtype.element_ty),
        mask=vmask,
    )


@triton.jit
def _bwd_dq(
    Q, K, V, DO, DQ, ROW_REL, pre, post,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
    s_dqb, s_dqh, s_dqt,
    H, T, D, DV, chunk,
    CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """dq_i = sum_j ds_ij k_j for one query tile."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    qmask = (offs_m[:, None] < T) & (offs_d[None, :] < D)
    q_ptrs = Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :]
    q = tl.load(q_ptrs, mask=qmask, other=0.0)  # (BLOCK_M, BD)
    do = tl.load(
        DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_dv[None, :],
        mask=(offs_m[:, None] < T) & (offs_dv[None, :] < DV),
        other=0.0,
    )  # (BLOCK_M, BDV)
    row = tl.load(ROW_REL + offs_m, mask=offs_m < T, other=0.0) * pre  # (BLOCK_M,)
    dq = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
    lo, hi = _key_range(start_m, T, chunk, BLOCK_M, CAUSAL, HAS_CHUNK)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(
            K + b * skb + h * skh + offs_n[:, None] * skt + offs_d[None, :],
            mask=(offs_n[:, None] < T) & (offs_d[None, :] < D),
            other=0.0,
        )  # (BLOCK_N, BD)
        v = tl.load(
            V + b * svb + h * svh + offs_n[:, None] * svt + offs_dv[None, :],
            mask=(offs_n[:, None] < T) & (offs_dv[None, :] < DV),
            other=0.0,
        )  # (BLOCK_N, BDV)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        r = tl.maximum(s, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        keep = _keep(offs_m[:, None], offs_n[None, :], T, chunk, CAUSAL, HAS_CHUNK)
        ds = tl.where(keep, 2.0 * r * dp * row[:, None], 0.0)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)  # (BLOCK_M, BD)
    tl.store(
        DQ + b * s_dqb + h * s_dqh + offs_m[:, None] * s_dqt + offs_d[None, :],
        (dq * post).to(DQ.dtype.element_ty),
        mask=qmask,
    )


def _pad(d: int) -> int:
    """Tile width for a head dim: a power of two >= 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(d))


def _strides(t: Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _config(
    q: Tensor, v: Tensor, block_m: int | None, block_n: int | None, *, forward: bool
) -> tuple[int, int, int, int, dict]:
    """Tile sizes and launch options. Untuned starting points (FlashAttention-2's Triton
    tutorial's shapes); half-precision forwards take 128-query tiles, everything else 64 x 64
    (32 keys for 128-wide heads) so fp32 tiles fit in shared memory."""
    BD, BDV = _pad(q.shape[-1]), _pad(v.shape[-1])
    wide = max(BD, BDV) > 64
    half = q.dtype in (torch.float16, torch.bfloat16)
    BM = block_m or (128 if forward and half and wide else 64)
    BN = block_n or (32 if wide and not (forward and half) else 64)
    warps = 8 if wide else 4
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    return BD, BDV, BM, BN, {"num_warps": warps, "PRECISION": precision}


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    row_rel: Tensor,
    pre: float,
    post: float,
    causal: bool,
    chunk: int,
    block_m: int | None = None,
    block_n: int | None = None,
) -> Tensor:
    """o [B, H, T, Dv] = row_rel * post * sum_j mask * relu(q k^T)^2 * pre * v (see the module)."""
    B, H, T, D = q.shape
    DV = v.shape[-1]
    o = torch.empty((B, H, T, DV), dtype=q.dtype, device=q.device)
    BD, BDV, BM, BN, opts = _config(q, v, block_m, block_n, forward=True)
    grid = (triton.cdiv(T, BM), B * H)
    _fwd[grid](
        q, k, v, o, row_rel, pre, post,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        H, T, D, DV, max(chunk, 1),
        CAUSAL=causal, HAS_CHUNK=chunk > 0, BLOCK_M=BM, BLOCK_N=BN, BD=BD, BDV=BDV, **opts,
    )  # fmt: skip
    return o


def backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    do: Tensor,
    row_rel: Tensor,
    pre: float,
    post: float,
    causal: bool,
    chunk: int,
    block_m: int | None = None,
    block_n: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of :func:`forward` for the output gradient ``do`` [B, H, T, Dv]."""
    B, H, T, D = q.shape
    DV = v.shape[-1]
    do = do.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    BD, BDV, BM, BN, opts = _config(q, v, block_m, block_n, forward=False)
    common = dict(CAUSAL=causal, HAS_CHUNK=chunk > 0, BD=BD, BDV=BDV, **opts)
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(do))
    _bwd_dkdv[(triton.cdiv(T, BN), B * H)](
        q, k, v, do, dk, dv, row_rel, pre, post, *strides, *_strides(dk), *_strides(dv),
        H, T, D, DV, max(chunk, 1), BLOCK_M=BM, BLOCK_N=BN, **common,
    )  # fmt: skip
    _bwd_dq[(triton.cdiv(T, BM), B * H)](
        q, k, v, do, dq, row_rel, pre, post, *strides, *_strides(dq),
        H, T, D, DV, max(chunk, 1), BLOCK_M=BM, BLOCK_N=BN, **common,
    )  # fmt: skip
    return dq, dk, dv
