"""Triton kernels for causal linear attention with the feature map and the normaliser inside the
chunk kernels (Katharopoulos et al. 2020, "Transformers are RNNs"), forward and backward.

MUST EQUAL (the dense formula; tests/kernels/interpreted_linear_causal.py writes it out):

    o_t = sum_{s<=t} (a_t . b_s) v_s / (sum_{s<=t} a_t . b_s + eps)      (NORM)
    o_t = sum_{s<=t} (a_t . b_s) v_s                                     (not NORM)

with a = phi(q), b = phi(k), phi identity, relu or elu + 1 (as e^min(x, 0) + max(x, 0)),
applied in registers in float32 to the loaded x and rounded to the input dtype: the operands
are exactly ``phi(x.float()).to(dtype)``, as :func:`attnbench.variants.linear.triton` feeds
the retention kernel. No T x T tensor, and no pass over a T x D tensor outside the kernels:
where that path runs phi on q and k, a float32 cumulative sum of phi(k) and a division (about
ten elementwise passes and dtype copies around the chunk kernel), these kernels read q, k, v once
a pass and write o once.

The scheme is :mod:`attnbench.kernels.triton_retention`'s (FLA's chunk kernels: Yang et al.
2024, "Gated Linear Attention Transformers with Hardware-Efficient Training") with gamma = 1,
the normaliser carried beside the state. Tiles of BT positions; tile i starts at t0 = i BT.

Forward:
(a) ``_states`` (sequential over tiles; a program per (D tile, Dv tile, b*h)): the states
    before each tile, h_i = sum_{s < t0} b_s^T v_s ``[D, Dv]`` and z_i = sum_{s < t0} b_s
    ``[D]`` (float32; z kept by every Dv tile, stored by the first).
(b) ``_out`` (parallel over tiles): with A_ts = a_t . b_s (s <= t inside the tile),
    N_t = a_t h_i + sum_s A_ts v_s, den_t = a_t . z_i + sum_s A_ts + eps (float32, from the
    float32 A before it is rounded for the A v dot), o_t = N_t / den_t; r_t = 1 / den_t stored
    ``[B*H, T]`` for the backward.

Backward, with g = do, delta_t = g_t . o_t (``_delta``, one pass over do and o, as
flash-attention's backward starts), and dS_ts = g_t . v_s - delta_t for s <= t in the tile
(NORM; else g_t . v_s). From o_t = N_t r_t: dN_t = g_t r_t and d den_t = -delta_t r_t, so

    da_t = r_t (g_t h_i^T - delta_t z_i + sum_{s<=t} dS_ts b_s)                 (dq = da phi'(q))
    db_s = v_s dh_i^T + dz_i + sum_{t>=s} r_t dS_ts a_t                         (dk = db phi'(k))
    dv_s = b_s dh_i + sum_{t>=s} A_ts r_t g_t
    dh_i = sum_{t >= t0 + BT} a_t^T r_t g_t,  dz_i = -sum_{t >= t0 + BT} delta_t r_t a_t

(c) ``_states`` reversed on (q, do) with r, delta: dh and dz; (d) ``_dv`` and ``_dqk``, parallel
over tiles. Unnormalised: r = 1, no delta, no z.

Precision. Dots between inputs (a b^T, g v^T, and the masked tiles times v, g, b or a) run on
16-bit operands with float32 accumulation; dots with a float32 state run on float32 operands
("tf32" for 16-bit inputs, IEEE for float32 ones), as in triton_retention. r_t ~ 1 / (T d) is
below float16's smallest normal (6e-5) once T d passes ~16k, so it never enters a 16-bit
operand as is: in da it multiplies the float32 result row; in db, dv and dh the rows r_t g_t
or r_t dS_ts are taken relative to the tile's largest r (a power of two, multiplied back onto
the float32 result), as triton_linear does. The masked score tile a b^T enters its 16-bit dot
scaled by a power of two into [2^14, 2^15) (its entries pass float16's 65504 once the features
are large; the retention kernel's cast gives inf there). den, delta, r and the output's division
are float32. delta reads o in the input dtype (flash-attention's choice): its rounding, 2^-11
of |o| in float16, reaches da and db amplified by |mean v| / std v, where the dS terms cancel.

Imported lazily (this module imports triton); call it through
:func:`attnbench.kernels.linear_causal_ops.linear_attention_causal`. Tensors: q, k ``[B, H, T,
D]``, v ``[B, H, T, Dv]`` (D, Dv <= 128), last dim contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from attnbench.kernels.triton_linear import FEATURE_MAPS, _phi, _pow2, _times_dphi
from attnbench.kernels.triton_retention import (
    _DQK_CONFIG,
    _STATES_CONFIG,
    _TILE_CONFIG,
    MAX_TILE,
    _launch,
    _state_tiles,
    _warps,
)

#: Positions a tile when none is given (the retention kernels' tile).
TILE = 64

# Launch options: the retention kernels' (_STATES_CONFIG, _TILE_CONFIG, _DQK_CONFIG), checked for
# these kernels by compiling them for sm_90 without a GPU (Triton 3.9: triton.compile of an
# ASTSource for GPUTarget("cuda", 90, 32) with TRITON_DUMP_PTXAS_LOG=1, ptxas -v's report; D = Dv
# = 128, BT = 64, elu + 1, normalised). bf16 and fp16, nothing spilled: the state passes (4 warps,
# 3 stages) 144-145 registers at 64 x 32 state tiles (37 KB shared), 112-208 at 64 x 64 (reversed:
# r, delta and the row scaling; 50-57 KB), 70-112 at 32 x 32; _out 165-167 registers at BD = 128
# with 8 warps (96 KB shared), 142 at 64 with 4; _dv 115-126 and 91; _dqk on 64-wide D slices,
# 8 warps, 144-146 (24 KB); _delta 48. float32 (IEEE dots on the CUDA cores) spills at these
# tiles, as the retention kernels' float32 output kernel does (15.6 KB a thread at BD = 128):
# _out and _dv 18-24 KB, _dqk 14.5 KB, the reversed state pass 0.3-8 KB; the suites run bf16.


@triton.jit
def _load_phi(base, offs_t, stride_t, offs_d, T, D, FMAP: tl.constexpr):
    """(x, phi(x)) for the [len(offs_t), len(offs_d)] tile at base: x as loaded, phi(x) in
    float32 rounded to x's dtype, both zero outside [0, T) x [0, D)."""
    mask = (offs_t[:, None] < T) & (offs_d[None, :] < D)
    x = tl.load(base + offs_t[:, None] * stride_t + offs_d[None, :], mask=mask, other=0.0)
    return x, tl.where(mask, _phi(x.to(tl.float32), FMAP), 0.0).to(x.dtype)


@triton.jit
def _row_scaled(y, r, HALF: tl.constexpr):
    """(y r_t as a dot operand, p): 16-bit inputs: y r / p in y's dtype with p = the largest r
    rounded to a power of two (no row falls into 16-bit subnormals), the dot's result to be
    multiplied by p; float32: y r and 1."""
    if HALF:
        inv, p = _pow2(tl.max(r, 0), -1)
        out = (y.to(tl.float32) * (r * inv)[:, None]).to(y.dtype)
    else:
        p = 1.0
        out = y * r[:, None]
    return out, p


@triton.jit
def _scores_operand(scores, dtype, HALF: tl.constexpr):
    """(the masked score tile as a 16-bit dot operand, p): scaled by a power of two so that its
    largest |entry| lies in [2^14, 2^15), below float16's 65504 (a . b passes it once the
    features are large: q, k ~ 200 at d = 16 give 6e5), the dot's result to be multiplied by p;
    float32: the tile and 1."""
    if HALF:
        inv, p = _pow2(tl.max(tl.max(tl.abs(scores), 1), 0), 14)
        out = (scores * inv).to(dtype)
    else:
        p = 1.0
        out = scores
    return out, p


@triton.jit
def _states(
    X, Y, R, DELTA, S, Z,
    sxb, sxh, sxt, syb, syh, syt,
    H, T, D, DV,
    REVERSE: tl.constexpr, FMAP: tl.constexpr, NORM: tl.constexpr, HALF: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Forward (x, y = k, v): S[i] = sum_{s < i BT} phi(k_s)^T v_s, Z[i] = sum_{s < i BT}
    phi(k_s). Reversed (x, y = q, do): S[i] = sum_{t >= (i+1) BT} phi(q_t)^T r_t do_t,
    Z[i] = -sum_{t >= (i+1) BT} delta_t r_t phi(q_t) (r = 1, no Z, when not NORM)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    n_v = tl.cdiv(DV, BV)
    pid_k, pid_v = pid // n_v, pid % n_v
    b, h = bh // H, bh % H
    n_tiles = tl.cdiv(T, BT)
    offs_c = tl.arange(0, BT)
    offs_k = pid_k * BK + tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    x_base = X + b.to(tl.int64) * sxb + h.to(tl.int64) * sxh
    y_base = Y + b.to(tl.int64) * syb + h.to(tl.int64) * syh
    s_ptrs = S + bh.to(tl.int64) * n_tiles * D * DV + offs_k[:, None] * DV + offs_v[None, :]
    s_mask = (offs_k[:, None] < D) & (offs_v[None, :] < DV)
    z_ptrs = Z + bh.to(tl.int64) * n_tiles * D + offs_k
    z_mask = (offs_k < D) & (offs_k * 0 + pid_v == 0)  # z: the first Dv tile stores it
    state = tl.zeros([BK, BV], dtype=tl.float32)
    zsum = tl.zeros([BK], dtype=tl.float32)
    if REVERSE:  # noqa: SIM108 (the slot after the last tile, or before the first: empty)
        first = n_tiles - 1
    else:
        first = 0
    tl.store(s_ptrs + first * D * DV, state, mask=s_mask)
    if NORM:
        tl.store(z_ptrs + first * D, zsum, mask=z_mask)
    for step in range(0, n_tiles - 1):
        if REVERSE:  # noqa: SIM108 (a constexpr branch, resolved when compiling)
            i = n_tiles - 1 - step
        else:
            i = step
        offs_t = i * BT + offs_c
        _, f = _load_phi(x_base, offs_t, sxt, offs_k, T, D, FMAP)  # (BT, BK)
        y = tl.load(y_base + offs_t[:, None] * syt + offs_v[None, :],
                    mask=(offs_t[:, None] < T) & (offs_v[None, :] < DV), other=0.0)  # fmt: skip
        if REVERSE and NORM:
            r = tl.load(R + bh * T + offs_t, mask=offs_t < T, other=0.0)  # (BT,) 1 / den
            delta = tl.load(DELTA + bh * T + offs_t, mask=offs_t < T, other=0.0)
            zsum -= tl.sum(f.to(tl.float32) * (delta * r)[:, None], 0)
            yr, p = _row_scaled(y, r, HALF)
            state += tl.dot(tl.trans(f), yr, input_precision=PRECISION) * p
        else:
            if NORM:
                zsum += tl.sum(f.to(tl.float32), 0)
            state = tl.dot(tl.trans(f), y, state, input_precision=PRECISION)  # (BK, BV)
        if REVERSE:  # noqa: SIM108
            slot = i - 1
        else:
            slot = i + 1
        tl.store(s_ptrs + slot * D * DV, state, mask=s_mask)
        if NORM:
            tl.store(z_ptrs + slot * D, zsum, mask=z_mask)


@triton.jit
def _out(
    Q, K, V, S, Z, O, R,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    H, T, D, DV, eps,
    FMAP: tl.constexpr, NORM: tl.constexpr, HALF: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """o for one tile and Dv tile: (a h_i + masked(a b^T) v) / (a . z_i + row sums + eps);
    r = 1 / den stored by the first Dv tile."""
    pid_v = tl.program_id(0)
    i_t = tl.program_id(1)
    bh = tl.program_id(2)
    b, h = bh // H, bh % H
    n_tiles = tl.cdiv(T, BT)
    offs_c = tl.arange(0, BT)
    offs_t = i_t * BT + offs_c
    offs_d = tl.arange(0, BD)
    offs_v = pid_v * BV + tl.arange(0, BV)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    t_ok = offs_t < T
    _, a = _load_phi(Q + b64 * sqb + h64 * sqh, offs_t, sqt, offs_d, T, D, FMAP)  # (BT, BD)
    _, f = _load_phi(K + b64 * skb + h64 * skh, offs_t, skt, offs_d, T, D, FMAP)  # (BT, BD)
    s_off = (bh.to(tl.int64) * n_tiles + i_t) * D * DV
    s = tl.load(S + s_off + offs_d[:, None] * DV + offs_v[None, :],
                mask=(offs_d[:, None] < D) & (offs_v[None, :] < DV), other=0.0)  # fmt: skip
    o = tl.dot(a.to(tl.float32), s, input_precision=PRECISION)  # (BT, BV): earlier tiles
    scores = tl.dot(a, tl.trans(f), input_precision=PRECISION)  # (BT, BT): a_t . b_s
    scores = tl.where(offs_c[:, None] >= offs_c[None, :], scores, 0.0)
    v = tl.load(V + b64 * svb + h64 * svh + offs_t[:, None] * svt + offs_v[None, :],
                mask=t_ok[:, None] & (offs_v[None, :] < DV), other=0.0)  # fmt: skip
    scaled, p = _scores_operand(scores, v.dtype, HALF)
    o += tl.dot(scaled, v, input_precision=PRECISION) * p  # inside the tile
    if NORM:
        z = tl.load(Z + (bh.to(tl.int64) * n_tiles + i_t) * D + offs_d, mask=offs_d < D, other=0.0)
        den = tl.sum(a.to(tl.float32) * z[None, :], 1) + tl.sum(scores, 1) + eps  # (BT,)
        r = 1.0 / tl.where(t_ok, den, 1.0)  # padding rows: no 0 / 0 (not stored)
        o = o * r[:, None]
        tl.store(R + bh * T + offs_t, r, mask=t_ok & (offs_c * 0 + pid_v == 0))
    tl.store(O + b64 * sob + h64 * soh + offs_t[:, None] * sot + offs_v[None, :],
             o.to(O.dtype.element_ty), mask=t_ok[:, None] & (offs_v[None, :] < DV))  # fmt: skip


@triton.jit
def _delta(
    O, DO, DELTA,
    sob, soh, sot, sdb, sdh, sdt,
    H, T, DV,
    BT: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """delta_t = do_t . o_t (float32) for one tile of rows."""
    i_t = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_t = i_t * BT + tl.arange(0, BT)
    t_ok = offs_t < T
    o_base = O + b.to(tl.int64) * sob + h.to(tl.int64) * soh
    do_base = DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh
    acc = tl.zeros([BT], dtype=tl.float32)
    for v0 in range(0, DV, BV):
        offs_v = v0 + tl.arange(0, BV)
        mask = t_ok[:, None] & (offs_v[None, :] < DV)
        o = tl.load(o_base + offs_t[:, None] * sot + offs_v[None, :], mask=mask, other=0.0)
        g = tl.load(do_base + offs_t[:, None] * sdt + offs_v[None, :], mask=mask, other=0.0)
        acc += tl.sum(o.to(tl.float32) * g.to(tl.float32), 1)
    tl.store(DELTA + bh * T + offs_t, acc, mask=t_ok)


@triton.jit
def _dv(
    Q, K, DO, DS, R, DV_,
    sqb, sqh, sqt, skb, skh, skt, sdob, sdoh, sdot, sdvb, sdvh, sdvt,
    H, T, D, DV,
    FMAP: tl.constexpr, NORM: tl.constexpr, HALF: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dv for one tile and Dv tile: b dh_i (later tiles) + masked(b a^T) (r do) (this one)."""
    pid_v = tl.program_id(0)
    i_t = tl.program_id(1)
    bh = tl.program_id(2)
    b, h = bh // H, bh % H
    n_tiles = tl.cdiv(T, BT)
    offs_c = tl.arange(0, BT)
    offs_t = i_t * BT + offs_c
    offs_d = tl.arange(0, BD)
    offs_v = pid_v * BV + tl.arange(0, BV)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    v_mask = (offs_t[:, None] < T) & (offs_v[None, :] < DV)
    _, f = _load_phi(K + b64 * skb + h64 * skh, offs_t, skt, offs_d, T, D, FMAP)  # (BT, BD)
    s_off = (bh.to(tl.int64) * n_tiles + i_t) * D * DV
    dh = tl.load(DS + s_off + offs_d[:, None] * DV + offs_v[None, :],
                 mask=(offs_d[:, None] < D) & (offs_v[None, :] < DV), other=0.0)  # fmt: skip
    dv = tl.dot(f.to(tl.float32), dh, input_precision=PRECISION)  # (BT, BV): later tiles
    _, a = _load_phi(Q + b64 * sqb + h64 * sqh, offs_t, sqt, offs_d, T, D, FMAP)  # (BT, BD)
    scores_t = tl.dot(f, tl.trans(a), input_precision=PRECISION)  # (BT, BT): [s, t]
    scores_t = tl.where(offs_c[None, :] >= offs_c[:, None], scores_t, 0.0)
    g = tl.load(DO + b64 * sdob + h64 * sdoh + offs_t[:, None] * sdot + offs_v[None, :],
                mask=v_mask, other=0.0)  # fmt: skip
    scaled, p = _scores_operand(scores_t, g.dtype, HALF)
    if NORM:
        r = tl.load(R + bh * T + offs_t, mask=offs_t < T, other=0.0)  # (BT,)
        gr, pr = _row_scaled(g, r, HALF)
        dv += tl.dot(scaled, gr, input_precision=PRECISION) * (p * pr)
    else:
        dv += tl.dot(scaled, g, input_precision=PRECISION) * p
    tl.store(DV_ + b64 * sdvb + h64 * sdvh + offs_t[:, None] * sdvt + offs_v[None, :],
             dv.to(DV_.dtype.element_ty), mask=v_mask)  # fmt: skip


@triton.jit
def _dq_part(
    dq, S, do_base, v_base, sdot, svt, s_off, offs_t, offs_d, t_ok, D, DV,
    BT: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """(dq + do h^T, do v^T) over the Dv columns in BV-wide steps: the state's part of dq (one
    D slice) and the tile's g_t . v_s."""
    dsc = tl.zeros([BT, BT], dtype=tl.float32)  # [t, s] = do_t . v_s
    for v0 in range(0, DV, BV):
        offs_v = v0 + tl.arange(0, BV)
        mask = t_ok[:, None] & (offs_v[None, :] < DV)
        g = tl.load(do_base + offs_t[:, None] * sdot + offs_v[None, :], mask=mask, other=0.0)
        hs = tl.load(S + s_off + offs_d[:, None] * DV + offs_v[None, :],
                     mask=(offs_d[:, None] < D) & (offs_v[None, :] < DV), other=0.0)  # fmt: skip
        dq += tl.dot(g.to(tl.float32), tl.trans(hs), input_precision=PRECISION)  # (BT, BK)
        v = tl.load(v_base + offs_t[:, None] * svt + offs_v[None, :], mask=mask, other=0.0)
        dsc += tl.dot(g, tl.trans(v), input_precision=PRECISION)  # (BT, BT)
    return dq, dsc


@triton.jit
def _dk_state_part(
    V, DS, v_base, svt, s_off, offs_t, offs_d, t_ok, D, DV,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """v dh^T over the Dv columns in BV-wide steps: the later tiles' part of dk (one D slice)."""
    dk = tl.zeros([BT, BK], dtype=tl.float32)
    for v0 in range(0, DV, BV):
        offs_v = v0 + tl.arange(0, BV)
        v = tl.load(v_base + offs_t[:, None] * svt + offs_v[None, :],
                    mask=t_ok[:, None] & (offs_v[None, :] < DV), other=0.0)  # fmt: skip
        dh = tl.load(DS + s_off + offs_d[:, None] * DV + offs_v[None, :],
                     mask=(offs_d[:, None] < D) & (offs_v[None, :] < DV), other=0.0)  # fmt: skip
        dk += tl.dot(v.to(tl.float32), tl.trans(dh), input_precision=PRECISION)  # (BT, BK)
    return dk


@triton.jit
def _dqk(
    Q, K, V, DO, S, DS, Z, DZ, R, DELTA, DQ, DK,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
    sdqb, sdqh, sdqt, sdkb, sdkh, sdkt,
    H, T, D, DV,
    FMAP: tl.constexpr, NORM: tl.constexpr, HALF: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dq, then dk, for one tile and a BK-wide slice of D (see the module docstring): one
    [BT, BK] accumulator live at a time, as triton_retention's _chunk_dqk."""
    pid_d = tl.program_id(0)
    i_t = tl.program_id(1)
    bh = tl.program_id(2)
    b, h = bh // H, bh % H
    n_tiles = tl.cdiv(T, BT)
    offs_c = tl.arange(0, BT)
    offs_t = i_t * BT + offs_c
    offs_d = pid_d * BK + tl.arange(0, BK)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    t_ok = offs_t < T
    slot = bh.to(tl.int64) * n_tiles + i_t
    do_base = DO + b64 * sdob + h64 * sdoh
    v_base = V + b64 * svb + h64 * svh
    dq = tl.zeros([BT, BK], dtype=tl.float32)
    dq, dsc = _dq_part(dq, S, do_base, v_base, sdot, svt, slot * D * DV, offs_t, offs_d,
                       t_ok, D, DV, BT, BV, PRECISION)  # fmt: skip
    if NORM:
        r = tl.load(R + bh * T + offs_t, mask=t_ok, other=0.0)  # (BT,) 1 / den
        delta = tl.load(DELTA + bh * T + offs_t, mask=t_ok, other=0.0)
        z = tl.load(Z + slot * D + offs_d, mask=offs_d < D, other=0.0)  # (BK,)
        dq -= delta[:, None] * z[None, :]
        dsc -= delta[:, None]
    dsc = tl.where(offs_c[:, None] >= offs_c[None, :], dsc, 0.0)  # dS, [t, s]
    kx, f = _load_phi(K + b64 * skb + h64 * skh, offs_t, skt, offs_d, T, D, FMAP)  # (BT, BK)
    dq += tl.dot(dsc.to(f.dtype), f, input_precision=PRECISION)  # inside the tile
    if NORM:
        dq = dq * r[:, None]
    qx, a = _load_phi(Q + b64 * sqb + h64 * sqh, offs_t, sqt, offs_d, T, D, FMAP)  # (BT, BK)
    qk_mask = t_ok[:, None] & (offs_d[None, :] < D)
    dq = _times_dphi(dq, qx.to(tl.float32), FMAP)
    tl.store(DQ + b64 * sdqb + h64 * sdqh + offs_t[:, None] * sdqt + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=qk_mask)  # fmt: skip
    dk = _dk_state_part(V, DS, v_base, svt, slot * D * DV, offs_t, offs_d, t_ok, D, DV,
                        BT, BK, BV, PRECISION)  # fmt: skip
    if NORM:
        dk += tl.load(DZ + slot * D + offs_d, mask=offs_d < D, other=0.0)[None, :]
        dsr, p = _row_scaled(dsc, r, HALF)  # rows t of dS times r_t
        dk += tl.dot(tl.trans(dsr.to(a.dtype)), a, input_precision=PRECISION) * p
    else:
        dk += tl.dot(tl.trans(dsc.to(a.dtype)), a, input_precision=PRECISION)
    dk = _times_dphi(dk, kx.to(tl.float32), FMAP)
    tl.store(DK + b64 * sdkb + h64 * sdkh + offs_t[:, None] * sdkt + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=qk_mask)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------


def _pad(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _strides(x: Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _common(q: Tensor, feature_map: str, normalize: bool, block: int | None) -> dict:
    half = q.dtype in (torch.float16, torch.bfloat16)
    return {
        "FMAP": FEATURE_MAPS[feature_map],
        "NORM": bool(normalize),
        "BT": block or TILE,
        "PRECISION": "tf32" if half else "ieee",
    }


def _state_pass(x, y, r, delta, consts: dict, reverse: bool) -> tuple[Tensor, Tensor]:
    """(S [B*H, NT, D, Dv], Z [B*H, NT, D]) float32: forward on (k, v), reversed on (q, do)."""
    B, H, T, D = x.shape
    DV = y.shape[-1]
    n_tiles = triton.cdiv(T, consts["BT"])
    s = torch.empty((B * H, n_tiles, D, DV), dtype=torch.float32, device=x.device)
    z = torch.empty((B * H, n_tiles, D), dtype=torch.float32, device=x.device)
    if n_tiles == 0:
        return s, z
    bk, bv = _state_tiles(D, DV, B * H, x.device)
    grid = (triton.cdiv(D, bk) * triton.cdiv(DV, bv), B * H)
    half = x.dtype in (torch.float16, torch.bfloat16)
    args = (x, y, s if r is None else r, s if delta is None else delta, s, z,
            *_strides(x), *_strides(y), H, T, D, DV)  # fmt: skip
    full = {**consts, "REVERSE": reverse, "HALF": half, "BK": bk, "BV": bv}
    warps, _, stages = _STATES_CONFIG
    _launch("lin-states", _states, grid, args, full, x, warps, stages)
    return s, z


def forward(
    q: Tensor, k: Tensor, v: Tensor, feature_map: str, normalize: bool, eps: float,
    block: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:  # fmt: skip
    """(o [B, H, T, Dv] in q's dtype, h, z (the states, float32), r = 1 / den [B*H, T] float32
    or None) of the formula in the module docstring."""
    B, H, T, D = q.shape
    DV = v.shape[-1]
    consts = _common(q, feature_map, normalize, block)
    h, z = _state_pass(k, v, None, None, consts, reverse=False)
    o = torch.empty((B, H, T, DV), dtype=q.dtype, device=q.device)
    r = torch.empty((B * H, T), dtype=torch.float32, device=q.device) if normalize else None
    bd, bv = _pad(D), min(MAX_TILE, _pad(DV))
    grid = (triton.cdiv(DV, bv), triton.cdiv(T, consts["BT"]), B * H)
    args = (q, k, v, h, z, o, o if r is None else r,
            *_strides(q), *_strides(k), *_strides(v), *_strides(o),
            H, T, D, DV, float(eps))  # fmt: skip
    half = q.dtype in (torch.float16, torch.bfloat16)
    _launch("lin-out", _out, grid, args, {**consts, "HALF": half, "BD": bd, "BV": bv}, q,
            _warps(_TILE_CONFIG, bd), _TILE_CONFIG[2])  # fmt: skip
    return o, h, z, r


def backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, h: Tensor, z: Tensor,
    r: Tensor | None, feature_map: str, normalize: bool, block: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dv) of :func:`forward` given do [B, H, T, Dv] (last dim contiguous) and what
    the forward kept: _delta, the reversed state pass, then _dv and _dqk."""
    B, H, T, D = q.shape
    DV = v.shape[-1]
    consts = _common(q, feature_map, normalize, block)
    half = q.dtype in (torch.float16, torch.bfloat16)
    bt, n_tiles = consts["BT"], triton.cdiv(T, consts["BT"])
    delta = None
    if normalize:
        delta = torch.empty((B * H, T), dtype=torch.float32, device=q.device)
        _delta[(n_tiles, B * H)](o, do, delta, *_strides(o), *_strides(do), H, T, DV,
                                 BT=bt, BV=min(MAX_TILE, _pad(DV)))  # fmt: skip
    dh, dz = _state_pass(q, do, r, delta, consts, reverse=True)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    bd, bv = _pad(D), min(MAX_TILE, _pad(DV))
    rows = (h if r is None else r, h if delta is None else delta)
    args = (q, k, do, dh, rows[0], dv, *_strides(q), *_strides(k), *_strides(do), *_strides(dv),
            H, T, D, DV)  # fmt: skip
    grid = (triton.cdiv(DV, bv), n_tiles, B * H)
    full = {**consts, "HALF": half, "BD": bd, "BV": bv}
    _launch("lin-dv", _dv, grid, args, full, q, _warps(_TILE_CONFIG, bd), _TILE_CONFIG[2])
    bk = min(MAX_TILE, bd)
    args = (q, k, v, do, h, dh, z, dz, *rows, dq, dk,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
            *_strides(dk), H, T, D, DV)  # fmt: skip
    grid = (triton.cdiv(D, bk), n_tiles, B * H)
    full = {**consts, "HALF": half, "BK": bk, "BV": bv}
    _launch("lin-dqk", _dqk, grid, args, full, q, _warps(_DQK_CONFIG, bk), _DQK_CONFIG[2])
    return dq, dk, dv
