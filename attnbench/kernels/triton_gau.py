"""Triton kernels for relu^2 attention (GAU, Hua et al. 2022, "Transformer Quality in Linear
Time"), forward and backward.

MUST EQUAL (the dense formula, written out in tests/helpers/dense_refs.py):

    o_i = row_scale_i * sum_j mask_ij * relu(q_i . k_j)^2 * v_j

with mask_ij = [j < T] and [j <= i] when causal, and [i // chunk == j // chunk] when chunked
(FLASH's local quadratic part). ``row_scale`` is any per-row factor; GAU's 1/(n_i s) and 1/n_i^2
are computed by :func:`attnbench.kernels.triton_ops.gau_relu2`.

There is no softmax, so tiles are independent: no running max, no log-sum-exp. The forward keeps
one query tile and streams key tiles; the backward recomputes scores (never stores the n x n map)
in two kernels, one owning a key tile (dk, dv) and one owning a query tile (dq), so nothing needs
atomics. One kernel call takes the whole value dimension (up to 256; the caller splits wider v),
so each score tile q k^T and its relu^2 is computed once per pass, not once per slice of v.

Masks. Causal and chunked calls skip tiles that cannot be visible, and the streamed tiles are cut
in ranges (``_key_split``, ``_query_split``): tiles that every row of the program's stationary
tile sees whole take the unmasked step (no index mask, no row bounds on the loads; a loop of
their own), and only the diagonal tiles, the tiles at a chunk border and the ragged tail past T
take the masked step (a second loop). A bidirectional unchunked call masks only its ragged tail
(nothing when T is a multiple of the tile). Padding rows load as zeros, and relu(0)^2 = 0, so a
padded row adds nothing on either path.

Tiles (``_config``): per kernel and dtype, the largest that compile for an H100 without register
spills, and pipeline stages within a shared-memory budget. 16-bit inputs: 128-row query tiles and
64-row key tiles in the forward and dq; the dk/dv kernel keeps 128 keys and streams 64 queries
while D + Dv <= 192 (FLA's Hopper backward), fewer as D + Dv grows (64 keys x 32 queries for
GAU's 128 + 256); 8 warps. fp32 keeps smaller tiles. A config that the GPU refuses (too little
shared memory) is retried with fewer stages, then smaller tiles, and the one that compiled is
remembered per config (as :mod:`triton_retention` does).

Precision: the tile of relu^2 scores is multiplied by ``pre`` (1/D) before it is cast to the
input dtype for the tensor-core matmul, so fp16 stays in range for |q.k| up to 255 * sqrt(D); the
per-row scale is applied in fp32 as ``row_rel * post`` (row_rel <= 1), keeping small GAU factors
like 1/(n s) out of fp16's subnormals. Accumulation is fp32; fp32 inputs use IEEE matmuls (no
TF32), so they match a plain fp32 reference.

Imported lazily (this module imports triton); call it through :mod:`attnbench.kernels.triton_ops`.
Tensors: q ``[B, H, T, D]``, k ``[B, H, T, D]``, v ``[B, H, T, Dv]``, last dim contiguous.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

try:
    from triton.runtime.errors import OutOfResources
except ImportError:  # older layouts kept it here
    from triton.runtime import OutOfResources  # type: ignore[no-redef]


# --------------------------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def _load_tile(
    base, rows, row_stride, cols, n_rows, n_cols, ROW_MASK: tl.constexpr, COL_MASK: tl.constexpr
):
    """base[rows, cols] as a (len(rows), len(cols)) tile, zeros outside [0, n_rows) x [0, n_cols)
    where asked: an interior tile loads without the row predicate (``ROW_MASK`` False)."""
    ptrs = base + rows[:, None] * row_stride + cols[None, :]
    if ROW_MASK and COL_MASK:
        x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
    elif ROW_MASK:
        x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    elif COL_MASK:
        x = tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


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
def _key_split(
    start_m,
    T,
    chunk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_CHUNK: tl.constexpr,
):
    """Keys for the queries start_m .. start_m + BLOCK_M - 1, as (lo, mid, hi): [lo, hi) holds
    every key they can see; the key tiles lo, lo + BLOCK_N, .. below mid lie in [0, T) and are
    seen whole by every one of those queries (no mask); the tiles from mid up to hi are masked."""
    lo = 0
    hi = T
    if CAUSAL:
        hi = tl.minimum(hi, start_m + BLOCK_M)
    if HAS_CHUNK:
        lo = (start_m // chunk) * chunk
        hi = tl.minimum(hi, ((start_m + BLOCK_M - 1) // chunk + 1) * chunk)
    seen = hi  # keys in [lo, seen) are seen by every query of the tile
    if CAUSAL:
        seen = tl.minimum(seen, start_m + 1)
    mid = lo + (seen - lo) // BLOCK_N * BLOCK_N
    if HAS_CHUNK:  # a query tile across a chunk border sees no key tile whole: all masked
        one = ((start_m // chunk) == ((start_m + BLOCK_M - 1) // chunk)).to(tl.int32)
        mid = lo + (mid - lo) * one
    return lo, mid, hi


@triton.jit
def _query_split(
    start_n,
    T,
    chunk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_CHUNK: tl.constexpr,
):
    """Queries for the keys start_n .. start_n + BLOCK_N - 1, as (lo, head, mid, hi): [lo, hi)
    holds every query that can see one of them; the query tiles from head (step BLOCK_M) below
    mid lie in [0, T) and see every key of the tile (no mask); [lo, head) (the causal diagonal)
    and [mid, hi) (the tail) are masked."""
    lo = 0
    hi = T
    if CAUSAL:
        lo = start_n
    if HAS_CHUNK:
        lo = tl.maximum(lo, (start_n // chunk) * chunk)
        hi = tl.minimum(hi, ((start_n + BLOCK_N - 1) // chunk + 1) * chunk)
    head = lo
    if CAUSAL:
        # lo = start_n; a query tile from s sees the whole key tile iff s >= start_n + BLOCK_N - 1
        DIAGONAL: tl.constexpr = (BLOCK_N + BLOCK_M - 2) // BLOCK_M * BLOCK_M
        head = tl.minimum(hi, lo + DIAGONAL)
    mid = head + (hi - head) // BLOCK_M * BLOCK_M
    if HAS_CHUNK:  # a key tile across a chunk border is seen whole by no query: all masked
        one = ((start_n // chunk) == ((start_n + BLOCK_N - 1) // chunk)).to(tl.int32)
        head = hi - (hi - head) * one
        mid = hi - (hi - mid) * one
    return lo, head, mid, hi


# --------------------------------------------------------------------------------------------
# Forward: o_i = row_i * post * sum_j mask_ij relu(q_i . k_j)^2 * pre * v_j
# --------------------------------------------------------------------------------------------


@triton.jit
def _key_tile_scores(
    q, k_base, v_base, skt, svt, offs_m, start_n, T, D, DV, chunk,
    CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr, MASKED: tl.constexpr,
    MASK_D: tl.constexpr, MASK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """(k, v, relu(q k^T) [masked]) of the key tile at start_n, for a query tile's step."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _load_tile(k_base, offs_n, skt, tl.arange(0, BD), T, D, MASKED, MASK_D)  # (BLOCK_N, BD)
    v = _load_tile(v_base, offs_n, svt, tl.arange(0, BDV), T, DV, MASKED, MASK_DV)  # (BLOCK_N, BDV)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
    r = tl.maximum(s, 0.0)
    if MASKED:
        r = tl.where(_keep(offs_m[:, None], offs_n[None, :], T, chunk, CAUSAL, HAS_CHUNK), r, 0.0)
    return k, v, r


@triton.jit
def _fwd_step(
    acc, q, k_base, v_base, skt, svt, offs_m, start_n, T, D, DV, chunk, pre,
    CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr, MASKED: tl.constexpr,
    MASK_D: tl.constexpr, MASK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """acc += (relu(q k^T)^2 * pre [masked]) v for the key tile at start_n."""
    k, v, r = _key_tile_scores(
        q, k_base, v_base, skt, svt, offs_m, start_n, T, D, DV, chunk,
        CAUSAL, HAS_CHUNK, MASKED, MASK_D, MASK_DV, BLOCK_N, BD, BDV, PRECISION,
    )  # fmt: skip
    p = r * r * pre
    return acc + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)  # (BLOCK_M, BDV)


@triton.jit
def _fwd(
    Q, K, V, O, ROW_REL, pre, post,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    H, T, D, DV, chunk,
    CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr, MASK_D: tl.constexpr, MASK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One query tile: o for its rows, key tiles streamed (interior unmasked, then masked)."""
    pid = tl.program_id(0)
    if CAUSAL:  # the longest rows (most keys) are started first: a shorter tail of the grid
        pid = tl.num_programs(0) - 1 - pid
    start_m = pid * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    k_base = K + b * skb + h * skh
    v_base = V + b * svb + h * svh
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BDV)
    q = _load_tile(Q + b * sqb + h * sqh, offs_m, sqt, tl.arange(0, BD), T, D, True, MASK_D)
    acc = tl.zeros([BLOCK_M, BDV], dtype=tl.float32)
    lo, mid, hi = _key_split(start_m, T, chunk, BLOCK_M, BLOCK_N, CAUSAL, HAS_CHUNK)
    for start_n in range(lo, mid, BLOCK_N):
        acc = _fwd_step(
            acc, q, k_base, v_base, skt, svt, offs_m, start_n, T, D, DV, chunk, pre,
            CAUSAL, HAS_CHUNK, False, MASK_D, MASK_DV, BLOCK_N, BD, BDV, PRECISION,
        )  # fmt: skip
    for start_n in range(mid, hi, BLOCK_N):
        acc = _fwd_step(
            acc, q, k_base, v_base, skt, svt, offs_m, start_n, T, D, DV, chunk, pre,
            CAUSAL, HAS_CHUNK, True, MASK_D, MASK_DV, BLOCK_N, BD, BDV, PRECISION,
        )  # fmt: skip
    row = tl.load(ROW_REL + offs_m, mask=offs_m < T, other=0.0) * post  # (BLOCK_M,) fp32
    o = acc * row[:, None]
    tl.store(
        O + b * sob + h * soh + offs_m[:, None] * sot + offs_dv[None, :],
        o.to(O.dtype.element_ty),
        mask=(offs_m[:, None] < T) & (offs_dv[None, :] < DV),
    )


# --------------------------------------------------------------------------------------------
# Backward. With w_ij = mask_ij relu(s_ij)^2 row_i pre and s = q k^T (post applied at the end):
# dv_j = sum_i w_ij do_i; dp_ij = do_i . v_j; ds_ij = 2 relu(s_ij) dp_ij row_i pre mask_ij;
# dk_j = sum_i ds_ij q_i; dq_i = sum_j ds_ij k_j.
# --------------------------------------------------------------------------------------------


@triton.jit
def _dkdv_step(
    dk, dv, k, v, q_base, do_base, ROW_REL, sqt, sdt, offs_n, start_m, T, D, DV, chunk, pre,
    CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr, MASKED: tl.constexpr,
    MASK_D: tl.constexpr, MASK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dv += w^T do and dk += ds^T q for the query tile at start_m (scores once, whole Dv)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _load_tile(q_base, offs_m, sqt, tl.arange(0, BD), T, D, MASKED, MASK_D)  # (BLOCK_M, BD)
    do = _load_tile(do_base, offs_m, sdt, tl.arange(0, BDV), T, DV, MASKED, MASK_DV)
    if MASKED:
        row = tl.load(ROW_REL + offs_m, mask=offs_m < T, other=0.0) * pre  # (BLOCK_M,) fp32
    else:
        row = tl.load(ROW_REL + offs_m) * pre
    s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M) = s^T
    r_t = tl.maximum(s_t, 0.0)
    if MASKED:  # one mask for both w and ds: each is a multiple of relu(s)
        keep = _keep(offs_m[None, :], offs_n[:, None], T, chunk, CAUSAL, HAS_CHUNK)
        r_t = tl.where(keep, r_t, 0.0)
    w_t = r_t * r_t * row[None, :]  # relu^2 * row scale, transposed
    dv += tl.dot(w_t.to(do.dtype), do, input_precision=PRECISION)  # (BLOCK_N, BDV)
    dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
    ds_t = 2.0 * r_t * dp_t * row[None, :]
    dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)  # (BLOCK_N, BD)
    return dk, dv


@triton.jit
def _bwd_dkdv(
    Q, K, V, DO, DK, DV_OUT, ROW_REL, pre, post,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
    s_dkb, s_dkh, s_dkt, s_dvb, s_dvh, s_dvt,
    H, T, D, DV, chunk,
    CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr, MASK_D: tl.constexpr, MASK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """dv_j = sum_i w_ij do_i and dk_j = sum_i ds_ij q_i for one key tile; query tiles streamed
    (the interior unmasked; the causal diagonal and the tail masked)."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    q_base = Q + b * sqb + h * sqh
    do_base = DO + b * sdb + h * sdh
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    k = _load_tile(K + b * skb + h * skh, offs_n, skt, offs_d, T, D, True, MASK_D)  # (BLOCK_N, BD)
    v = _load_tile(V + b * svb + h * svh, offs_n, svt, offs_dv, T, DV, True, MASK_DV)
    dk = tl.zeros([BLOCK_N, BD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BDV], dtype=tl.float32)
    lo, head, mid, hi = _query_split(start_n, T, chunk, BLOCK_M, BLOCK_N, CAUSAL, HAS_CHUNK)
    for start_m in range(head, mid, BLOCK_M):
        dk, dv = _dkdv_step(
            dk, dv, k, v, q_base, do_base, ROW_REL, sqt, sdt, offs_n, start_m, T, D, DV, chunk,
            pre, CAUSAL, HAS_CHUNK, False, MASK_D, MASK_DV, BLOCK_M, BD, BDV, PRECISION,
        )  # fmt: skip
    # The masked tiles, [lo, head) then [mid, hi), in one loop: a third loop costs registers
    # (its own copies of the hoisted addresses), and the dk/dv kernel is the one short of them.
    n_head = (head - lo + BLOCK_M - 1) // BLOCK_M
    n_masked = n_head + (hi - mid + BLOCK_M - 1) // BLOCK_M
    for i in range(0, n_masked):
        start_m = tl.where(i < n_head, lo + i * BLOCK_M, mid + (i - n_head) * BLOCK_M)
        dk, dv = _dkdv_step(
            dk, dv, k, v, q_base, do_base, ROW_REL, sqt, sdt, offs_n, start_m, T, D, DV, chunk,
            pre, CAUSAL, HAS_CHUNK, True, MASK_D, MASK_DV, BLOCK_M, BD, BDV, PRECISION,
        )  # fmt: skip
    kmask = (offs_n[:, None] < T) & (offs_d[None, :] < D)
    vmask = (offs_n[:, None] < T) & (offs_dv[None, :] < DV)
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
def _dq_step(
    dq, q, do, row, k_base, v_base, skt, svt, offs_m, start_n, T, D, DV, chunk,
    CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr, MASKED: tl.constexpr,
    MASK_D: tl.constexpr, MASK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dq += ds k for the key tile at start_n (scores once, whole Dv)."""
    k, v, r = _key_tile_scores(
        q, k_base, v_base, skt, svt, offs_m, start_n, T, D, DV, chunk,
        CAUSAL, HAS_CHUNK, MASKED, MASK_D, MASK_DV, BLOCK_N, BD, BDV, PRECISION,
    )  # fmt: skip
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
    ds = 2.0 * r * dp * row[:, None]
    return dq + tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)  # (BLOCK_M, BD)


@triton.jit
def _bwd_dq(
    Q, K, V, DO, DQ, ROW_REL, pre, post,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
    s_dqb, s_dqh, s_dqt,
    H, T, D, DV, chunk,
    CAUSAL: tl.constexpr, HAS_CHUNK: tl.constexpr, MASK_D: tl.constexpr, MASK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """dq_i = sum_j ds_ij k_j for one query tile; key tiles streamed (interior, then masked)."""
    pid = tl.program_id(0)
    if CAUSAL:  # the longest rows first, as in the forward
        pid = tl.num_programs(0) - 1 - pid
    start_m = pid * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    k_base = K + b * skb + h * skh
    v_base = V + b * svb + h * svh
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BD)
    q = _load_tile(Q + b * sqb + h * sqh, offs_m, sqt, offs_d, T, D, True, MASK_D)  # (BLOCK_M, BD)
    do = _load_tile(DO + b * sdb + h * sdh, offs_m, sdt, tl.arange(0, BDV), T, DV, True, MASK_DV)
    row = tl.load(ROW_REL + offs_m, mask=offs_m < T, other=0.0) * pre  # (BLOCK_M,) fp32
    dq = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
    lo, mid, hi = _key_split(start_m, T, chunk, BLOCK_M, BLOCK_N, CAUSAL, HAS_CHUNK)
    for start_n in range(lo, mid, BLOCK_N):
        dq = _dq_step(
            dq, q, do, row, k_base, v_base, skt, svt, offs_m, start_n, T, D, DV, chunk,
            CAUSAL, HAS_CHUNK, False, MASK_D, MASK_DV, BLOCK_N, BD, BDV, PRECISION,
        )  # fmt: skip
    for start_n in range(mid, hi, BLOCK_N):
        dq = _dq_step(
            dq, q, do, row, k_base, v_base, skt, svt, offs_m, start_n, T, D, DV, chunk,
            CAUSAL, HAS_CHUNK, True, MASK_D, MASK_DV, BLOCK_N, BD, BDV, PRECISION,
        )  # fmt: skip
    tl.store(
        DQ + b * s_dqb + h * s_dqh + offs_m[:, None] * s_dqt + offs_d[None, :],
        (dq * post).to(DQ.dtype.element_ty),
        mask=(offs_m[:, None] < T) & (offs_d[None, :] < D),
    )


# --------------------------------------------------------------------------------------------
# Tiles and launch options
# --------------------------------------------------------------------------------------------

#: Widest v one kernel call takes (BDV <= this); triton_ops splits wider v into slices.
MAX_VALUE_DIM = 256
#: Kernels: the forward, the key-tile backward (dk, dv), the query-tile backward (dq).
KERNELS = ("fwd", "dkdv", "dq")
#: Shared memory one program's pipelined loads may take (bytes): an H100 gives a block 227 KiB;
#: ~27 KiB are left to Triton's own buffers (layout conversions). Smaller GPUs refuse the biggest
#: configs at compile time and fall back (see ``_launch``).
SMEM_BUDGET = 200 * 1024
#: Triton's default pipeline depth: a tile computed while the next two load.
MAX_STAGES = 3


@dataclass(frozen=True)
class Tiles:
    """One launch config: query tile rows, key tile rows, warps, pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def _pad(d: int) -> int:
    """Tile width for a head dim: a power of two >= 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(d))


def _strides(t: Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _smem(
    kernel: str, stationary: int, streamed: int, bd: int, bdv: int, elem: int, stages: int
) -> int:
    """Bytes of shared memory for the loads: the stationary tile (fwd: q; dkdv: k, v; dq: q, do)
    once, the streamed tiles (fwd, dq: k, v; dkdv: q, do) once per stage."""
    held = bd if kernel == "fwd" else bd + bdv
    return elem * (stationary * held + stages * streamed * (bd + bdv))


def _tiles(kernel: str, half: bool, width: int, ragged: bool) -> tuple[int, int]:
    """(stationary rows, streamed rows) for one kernel, 16-bit or fp32 inputs, ``width`` = the
    padded D + Dv, ``ragged`` = D or Dv below its padded width. The largest power-of-two tiles
    that compile for sm_90 without a register spill (read off ptxas's report: Triton 3.9,
    8 warps, causal and chunked, 2-3 stages), as stationary x streamed:

    =====  ==========  ===========================================================
    half   fwd, dq     128 x 64 at every width (fwd 253 registers, dq 217 at 384)
    half   dkdv        128 x 64 to width 192; 128 x 32 at 256 (235 registers);
                       64 x 32 at 320 and 384 (243); 128 x 64 at 256 and 64 x 64 at
                       384 spill (the dk and dv accumulators alone are 128 and 96
                       registers a thread there)
    fp32   fwd         64 x 32 to width 128, else 32 x 32
    fp32   dq          64 x 32 to 128; 32 x 32 to 256; 32 x 16 at 384
    fp32   dkdv        32 x 32 to 128, else 32 x 16
    =====  ==========  ===========================================================

    fp32 tiles are smaller: IEEE dots run on the CUDA cores with both operands in registers.
    A ragged head dim puts a column mask on every load and store, which spilled at these sizes
    (8 to 96 bytes at D = 20, Dv = 160 and D = 128, Dv = 200): the streamed tile is halved, or
    the stationary one once the streamed one is at 16. (The 16-bit dk/dv tile at a ragged width
    of 384, e.g. D = 96, Dv = 192, still spills 8 to 56 bytes at 64 x 16; a 32-key tile would
    leave the Hopper tensor-core instructions for the older ones, Triton needing 64 rows a
    warpgroup.) Triton 3.9 with ptxas 13.4 (sm_90a, D = 128, Dv = 256, causal, bf16) compiles
    the 64 x 32 dk/dv tile to 255 registers and a 16-byte spill, and lays its two score dots
    over 8 warps along the 64 rows (``warpsPerCTA = [8, 1]``, both warpgroups computing them);
    128 x 16 lays every dot over 128 rows at 255 registers and an 8-byte spill: the candidate
    to time against it on a GPU (64 x 32 at 4 warps spills 436 bytes, 128 x 32 48, 64 x 64 364).
    """
    if half:
        if kernel in ("fwd", "dq"):
            stationary, streamed = 128, 64
        else:
            stationary, streamed = (128 if width <= 256 else 64), (64 if width <= 192 else 32)
    elif kernel == "fwd":
        stationary, streamed = (64 if width <= 128 else 32), 32
    elif kernel == "dq":
        stationary, streamed = (64 if width <= 128 else 32), (32 if width <= 256 else 16)
    else:
        stationary, streamed = 32, (32 if width <= 128 else 16)
    if ragged and streamed > 16:
        streamed //= 2
    elif ragged:
        stationary = max(16, stationary // 2)
    return stationary, streamed


@functools.lru_cache(maxsize=256)  # once per shape: a call pays no Python for it
def _config(
    dtype: torch.dtype, d: int, dv: int, kernel: str, blocks: tuple[int | None, ...] = (None, None)
) -> tuple[Tiles, ...]:
    """Launch configs for one kernel, best first; the rest are the fallbacks for a GPU that
    refuses one (fewer stages, then smaller tiles). ``blocks`` = (query tile, key tile) forces
    those sizes (tests use 16).

    The stationary tile (fwd, dq: the query tile; dkdv: the key tile) holds the fp32
    accumulators (fwd: o, rows x Dv; dkdv: dk and dv, rows x (D + Dv); dq: dq, rows x D); each
    streamed tile makes one (fwd: s) or two (s, dp) fp32 score tiles of stationary x streamed.
    Sizes: ``_tiles``. For 16-bit inputs: 128 query rows x 64 keys in the forward and dq; the
    dk/dv kernel keeps 128 keys and streams 64 queries (FLA's Hopper backward) while
    D + Dv <= 192, 128 x 32 to 256 (D = Dv = 128), and 64 x 32 for GAU's 128 + 256, whose
    128-key tile would need 192 accumulator registers a thread (the cap is 255). The whole v in
    one tile throughout. 8 warps (two warpgroups; FLA's Hopper choice too): at 4 the same tiles
    spill. A cost of the 64-key tile: Triton lays a score tile that feeds another dot out over
    the 8 warps along its rows only, so 64 rows are computed by both warpgroups (the q k^T and
    v do^T dots of that kernel done twice); the 128-key tile that avoids it spills.

    Stages: the most, up to ``MAX_STAGES``, whose loads fit ``SMEM_BUDGET`` (``_smem``): GAU's
    16-bit shapes get 3 (fwd, 176 KiB), 3 (dkdv, 120 KiB) and 2 (dq, whose stationary q and do
    take 96 KiB: 192 KiB).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r}; accepted: {', '.join(KERNELS)}")
    bd, bdv = _pad(d), _pad(dv)
    half = dtype in (torch.float16, torch.bfloat16)
    elem = 2 if half else 4
    warps = 8
    stationary, streamed = _tiles(kernel, half, bd + bdv, (d, dv) != (bd, bdv))
    pairs = [(stationary, streamed)]
    while pairs[-1] != (16, 16):  # fallbacks: halve the larger of the two
        st, sm = pairs[-1]
        pairs.append((max(st // 2, 16), sm) if st >= sm else (st, max(sm // 2, 16)))
    user_m, user_n = blocks
    out: list[Tiles] = []
    for st, sm in pairs:
        bm, bn = (st, sm) if kernel in ("fwd", "dq") else (sm, st)  # (queries, keys)
        bm, bn = user_m or bm, user_n or bn
        stat, stream = (bm, bn) if kernel in ("fwd", "dq") else (bn, bm)
        for stages in range(MAX_STAGES, 0, -1):
            fits = _smem(kernel, stat, stream, bd, bdv, elem, stages) <= SMEM_BUDGET
            tiles = Tiles(bm, bn, warps, stages)
            if (fits or stages == 1) and tiles not in out:
                out.append(tiles)
    return tuple(out)


#: The index into ``_config``'s list that compiled, per (kernel, dtype, dims, flags, device).
_CHOSEN: dict[tuple, int] = {}


def _launch(
    kernel: Any,
    key: tuple,
    candidates: Sequence[Tiles],
    grid: Callable[[Tiles], tuple[int, int]],
    args: Sequence[Any],
    constexprs: dict[str, Any],
) -> Tiles:
    """Launch ``kernel`` on ``grid(tiles)`` with the first config the GPU accepts, starting from
    the one remembered for ``key``. A config the GPU refuses (Triton's OutOfResources, raised
    when it compiles, before anything runs: shared memory) is skipped for the next one."""
    refused: OutOfResources | None = None
    for index in range(_CHOSEN.get(key, 0), len(candidates)):
        tiles = candidates[index]
        try:
            kernel[grid(tiles)](
                *args,
                BLOCK_M=tiles.block_m,
                BLOCK_N=tiles.block_n,
                num_warps=tiles.num_warps,
                num_stages=tiles.num_stages,
                **constexprs,
            )
        except OutOfResources as e:
            refused = refused or e
            continue
        _CHOSEN[key] = index
        return tiles
    assert refused is not None, "no launch config"
    raise refused


def _flags(q: Tensor, d: int, dv: int, causal: bool, chunk: int) -> dict[str, Any]:
    bd, bdv = _pad(d), _pad(dv)
    return {
        "CAUSAL": causal,
        "HAS_CHUNK": chunk > 0,
        "MASK_D": d != bd,
        "MASK_DV": dv != bdv,
        "BD": bd,
        "BDV": bdv,
        "PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
    }


def _key(kernel: str, q: Tensor, d: int, dv: int, flags: dict, blocks: tuple) -> tuple:
    return (kernel, q.dtype, d, dv, flags["CAUSAL"], flags["HAS_CHUNK"], blocks, str(q.device))


def _check_value_dim(dv: int) -> None:
    if dv > MAX_VALUE_DIM:
        raise ValueError(f"value dim {dv} > {MAX_VALUE_DIM}: split v first (triton_ops does)")


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
    """o [B, H, T, Dv] = row_rel * post * sum_j mask * relu(q k^T)^2 * pre * v (see the module);
    Dv <= ``MAX_VALUE_DIM``, one kernel call."""
    B, H, T, D = q.shape
    DV = v.shape[-1]
    _check_value_dim(DV)
    o = torch.empty((B, H, T, DV), dtype=q.dtype, device=q.device)
    blocks = (block_m, block_n)
    flags = _flags(q, D, DV, causal, chunk)
    _launch(
        _fwd,
        _key("fwd", q, D, DV, flags, blocks),
        _config(q.dtype, D, DV, "fwd", blocks),
        lambda tiles: (triton.cdiv(T, tiles.block_m), B * H),
        (q, k, v, o, row_rel, pre, post, *_strides(q), *_strides(k), *_strides(v), *_strides(o),
         H, T, D, DV, max(chunk, 1)),
        flags,
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
    """(dq, dk, dv) of :func:`forward` for the output gradient ``do`` [B, H, T, Dv]: the key-tile
    kernel (dk, dv) and the query-tile kernel (dq), each over the whole Dv."""
    B, H, T, D = q.shape
    DV = v.shape[-1]
    _check_value_dim(DV)
    do = do.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    blocks = (block_m, block_n)
    flags = _flags(q, D, DV, causal, chunk)
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(do))
    _launch(
        _bwd_dkdv,
        _key("dkdv", q, D, DV, flags, blocks),
        _config(q.dtype, D, DV, "dkdv", blocks),
        lambda tiles: (triton.cdiv(T, tiles.block_n), B * H),
        (q, k, v, do, dk, dv, row_rel, pre, post, *strides, *_strides(dk), *_strides(dv),
         H, T, D, DV, max(chunk, 1)),
        flags,
    )  # fmt: skip
    _launch(
        _bwd_dq,
        _key("dq", q, D, DV, flags, blocks),
        _config(q.dtype, D, DV, "dq", blocks),
        lambda tiles: (triton.cdiv(T, tiles.block_m), B * H),
        (q, k, v, do, dq, row_rel, pre, post, *strides, *_strides(dq),
         H, T, D, DV, max(chunk, 1)),
        flags,
    )  # fmt: skip
    return dq, dk, dv
