"""Triton kernels for chunkwise causal decayed linear attention: retention (Sun et al. 2023,
RetNet) and, with gamma = 1, plain causal linear attention (Katharopoulos et al. 2020); and
FLASH's causal global part (Hua et al. 2022, "Transformer Quality in Linear Time").

MUST EQUAL (the dense forms, tests/helpers/dense_refs.py):

    retention:     o_t = sum_{s <= t} gamma_h^(t - s) (q_t . k_s) v_s
    FLASH global:  o_t = sum_{s < c floor(t / c)} (q_t . k_s) v_s        (c = FLASH's chunk)

The scheme of FLA's chunk kernels (Yang et al. 2024, "Gated Linear Attention Transformers with
Hardware-Efficient Training"), written here for a per-head constant decay. The sequence is cut
into tiles of BT positions (tile i holds t0 = i BT ... t0 + BT - 1; j = t - t0 inside it).

Forward, two kernels:

(a) ``_chunk_states``, sequential over tiles, one program per (batch*head, D tile, Dv tile;
    64 wide, 32 when that leaves fewer programs than multiprocessors): the state before tile i,
    h_i = sum_{s < i BT} gamma^(i BT - 1 - s) k_s^T v_s  ([D, Dv]): h_0 = 0,
    h_{i+1} = gamma^BT h_i + sum_j gamma^(BT - 1 - j) k_{t0+j}^T v_{t0+j}.
(b) ``_chunk_out``, parallel over tiles, one program per (Dv tile, tile, batch*head):
    o_{t0+j} = gamma^(j+1) q_{t0+j} h_i + sum_{j' <= j} gamma^(j - j') (q_{t0+j} . k_{t0+j'}) v_..
    (the dense part inside the tile, then everything before it through h_i).

Backward, one pass and two kernels (the mirror image), with dh_i the gradient of h_{i+1}, i.e.
dh_i = sum_{t >= (i+1) BT} gamma^(t - (i+1) BT + 1) q_t^T do_t:

(c) ``_chunk_states`` reversed on (q, do): dh_{NT-1} = 0, dh_{i-1} = gamma^BT dh_i +
    sum_j gamma^(j+1) q_{t0+j}^T do_{t0+j} (t0 = i BT).
(d) parallel over tiles: ``_chunk_dv``, one program per (Dv tile, tile, batch*head),
    dv_s = sum_{t >= s in the tile} gamma^(t-s) (q_t . k_s) do_t + gamma^(BT-1-j) k_s dh_i;
    ``_chunk_dqk``, one program per (64-wide D slice, tile, batch*head), with
    dS_ts = (do_t . v_s) gamma^(t-s) for s <= t: dq = dS k + gamma^(j+1) do h_i^T, then
    dk = dS^T q + gamma^(BT-1-j) v dh_i^T.

Every decay is gamma^(non-negative), measured inside a tile: nothing overflows at any length.
The last tile's decays are those of a full tile; its state is never stored, so that is exact.

FLASH's global part is the same with gamma = 1 (DECAY off: no exp2 at all), no dense part (INTRA
off), and the states stored only at multiples of FLASH's chunk c = STRIDE * BT: the state pass
walks the kernel's own tile (64, not c: no 256-row tile, no shared-memory squeeze) and stores
h only at tiles i with i % STRIDE == 0 (slot i // STRIDE, the sum over s < c floor(t / c)); tile
i of the output reads slot i // STRIDE. Reversed, dh slot g is the sum over t >= (g + 1) c.

States: ``[B*H, NS, D, Dv]`` float32, NS = ceil(T / (STRIDE BT)): O(T D Dv / BT) memory, e.g.
64 MiB at B = 4, H = 8, T = 8192, D = Dv = 64 (q itself is 32 MiB in bf16). float32 because
(1) a state sums a whole prefix of the sequence (gamma = 1: up to T terms; with positive
features it grows like T): 16 bits would keep 8 (bf16) or 11 (float16) significant bits of it,
and float16 overflows at 65504; (2) the dots that read it run on float32 operands (IEEE for
float32 inputs, tf32 for 16-bit ones: 11 significant bits of the state instead of bf16's 8, and
no overflow), so a 16-bit copy would only add a rounding; (3) one buffer dtype for every input
dtype. The forward keeps h for the backward (see triton_ops._Retention for why).

Precision: dots between two inputs (q k^T, do v^T, and the masked scores times v, do, k or q,
the scores rounded to the input dtype as in FLA) run in the input dtype with float32
accumulation; dots with a float32 operand (a state, a decayed row) run in float32, "ieee" for
float32 inputs and "tf32" otherwise.

Launch configurations (chosen, not autotuned; see the ``_*_CONFIG`` constants, whose comments
give the register counts seen compiling for sm_90): the state pass pipelines its loads three
deep (they do not depend on the running state), 4 warps; the per-tile kernels have no loop (or,
``_chunk_dqk``, loops of one or two Dv tiles): one stage; 4 warps for head dims up to 64 and 8 at
128 in ``_chunk_out`` / ``_chunk_dv``, 8 in ``_chunk_dqk``. A refusal for shared memory (a large
user ``block``) is retried once with one stage and remembered per configuration.

Imported lazily (this module imports triton); call it through :mod:`attnbench.kernels.triton_ops`.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

#: The kernels' tile (positions) when none is given: retention's chunk; FLASH's tile, the chunk
#: c itself when smaller (FLASH stores states every c / TILE tiles).
TILE = 64
#: Widest D / Dv tile of the state passes, and the Dv tile of the per-tile kernels.
MAX_TILE = 64
#: A state pass with fewer programs than the GPU's multiprocessors halves its D / Dv tiles (down
#: to this): the pass is sequential over T, so its programs are its only parallelism.
MIN_STATE_TILE = 32


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _decayed_causal(scores, gap, LOG2G, h, DECAY: tl.constexpr):
    """``scores`` [t, s] kept where gap = t - s >= 0, times gamma_h^gap when DECAY; 0 elsewhere
    (the masked, decayed dense part inside a tile)."""
    if DECAY:
        log2g = tl.load(LOG2G + h)
        return tl.where(gap >= 0, scores * tl.exp2(tl.maximum(gap, 0).to(tl.float32) * log2g), 0.0)
    return tl.where(gap >= 0, scores, 0.0)


@triton.jit
def _chunk_states(
    X, Y, S, LOG2G,
    sxb, sxh, sxt, syb, syh, syt,
    H, T, D, DV, NS,
    REVERSE: tl.constexpr, DECAY: tl.constexpr, STRIDE: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """S[bh, n] ([D, Dv] fp32), with x, y = k, v forward or q, do reversed, c = STRIDE BT:
    forward  S[n] = sum_{s < n c} gamma^(n c - 1 - s) x_s^T y_s;
    reversed S[n] = sum_{t >= (n+1) c} gamma^(t - (n+1) c + 1) x_t^T y_t (0 for the last n)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    n_v = tl.cdiv(DV, BV)
    pid_k, pid_v = pid // n_v, pid % n_v
    b, h = bh // H, bh % H
    offs_c = tl.arange(0, BT)  # position inside a tile
    offs_k = pid_k * BK + tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    x_base = X + b.to(tl.int64) * sxb + h.to(tl.int64) * sxh
    y_base = Y + b.to(tl.int64) * syb + h.to(tl.int64) * syh
    s_ptrs = S + bh.to(tl.int64) * NS * D * DV + offs_k[:, None] * DV + offs_v[None, :]
    s_mask = (offs_k[:, None] < D) & (offs_v[None, :] < DV)
    if DECAY:
        log2g = tl.load(LOG2G + h)  # log2(gamma_h), <= 0
        if REVERSE:
            row_dec = tl.exp2((offs_c + 1).to(tl.float32) * log2g)  # gamma^(j + 1)
        else:
            row_dec = tl.exp2((BT - 1 - offs_c).to(tl.float32) * log2g)  # gamma^(BT - 1 - j)
        tile_dec = tl.exp2(BT * log2g)  # gamma^BT
    n_tiles = tl.cdiv(T, BT)
    state = tl.zeros([BK, BV], dtype=tl.float32)
    # The first slot stored holds nothing; a tile whose sum no stored slot needs is not read.
    if REVERSE:
        tl.store(s_ptrs + ((n_tiles - 1) // STRIDE) * D * DV, state, mask=s_mask)
        n_steps = n_tiles - STRIDE
    else:
        tl.store(s_ptrs, state, mask=s_mask)
        n_steps = (tl.cdiv(n_tiles, STRIDE) - 1) * STRIDE
    for step in range(0, n_steps):
        if REVERSE:  # noqa: SIM108 (a constexpr branch, resolved when compiling)
            i = n_tiles - 1 - step
        else:
            i = step
        offs_t = i * BT + offs_c
        x = tl.load(
            x_base + offs_t[:, None] * sxt + offs_k[None, :],
            mask=(offs_t[:, None] < T) & (offs_k[None, :] < D),
            other=0.0,
        )  # (BT, BK)
        y = tl.load(
            y_base + offs_t[:, None] * syt + offs_v[None, :],
            mask=(offs_t[:, None] < T) & (offs_v[None, :] < DV),
            other=0.0,
        )  # (BT, BV)
        if DECAY:
            x_dec = tl.trans(x.to(tl.float32) * row_dec[:, None])  # (BK, BT)
            state = state * tile_dec + tl.dot(
                x_dec, y.to(tl.float32), input_precision=PRECISION
            )  # (BK, BV)
        else:
            state += tl.dot(tl.trans(x), y, input_precision=PRECISION)  # (BK, BV)
        # Forward: now the sum before tile i + 1; reversed: the sum from tile i on, which is
        # slot (i - 1) // STRIDE when tile i starts a chunk of STRIDE tiles.
        if REVERSE:
            slot = (i - 1) // STRIDE
            keep = i % STRIDE == 0
        else:
            slot = (i + 1) // STRIDE
            keep = (i + 1) % STRIDE == 0
        if STRIDE == 1:
            tl.store(s_ptrs + slot * D * DV, state, mask=s_mask)
        else:
            if keep:  # noqa: SIM102 (a constexpr branch around a runtime one)
                tl.store(s_ptrs + slot * D * DV, state, mask=s_mask)


@triton.jit
def _chunk_out(
    Q, K, V, S, O, LOG2G,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    H, T, D, DV, NS,
    INTRA: tl.constexpr, DECAY: tl.constexpr, STRIDE: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """o for one tile and Dv tile: gamma^(j+1) q h_slot (earlier tiles), plus the masked,
    decayed dense part inside the tile when INTRA."""
    pid_v = tl.program_id(0)
    i_t = tl.program_id(1)
    bh = tl.program_id(2)
    b, h = bh // H, bh % H
    offs_c = tl.arange(0, BT)
    offs_t = i_t * BT + offs_c
    offs_d = tl.arange(0, BD)
    offs_v = pid_v * BV + tl.arange(0, BV)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    qk_mask = (offs_t[:, None] < T) & (offs_d[None, :] < D)
    v_mask = (offs_t[:, None] < T) & (offs_v[None, :] < DV)
    q = tl.load(
        Q + b64 * sqb + h64 * sqh + offs_t[:, None] * sqt + offs_d[None, :], mask=qk_mask, other=0.0
    )  # (BT, BD)
    s_off = (bh.to(tl.int64) * NS + i_t // STRIDE) * D * DV
    s = tl.load(
        S + s_off + offs_d[:, None] * DV + offs_v[None, :],
        mask=(offs_d[:, None] < D) & (offs_v[None, :] < DV),
        other=0.0,
    )  # (BD, BV) fp32
    o = tl.dot(q.to(tl.float32), s, input_precision=PRECISION)  # (BT, BV): earlier tiles
    if DECAY:
        log2g = tl.load(LOG2G + h)
        o = o * tl.exp2((offs_c + 1).to(tl.float32) * log2g)[:, None]  # gamma^(j + 1)
    if INTRA:
        k = tl.load(
            K + b64 * skb + h64 * skh + offs_t[:, None] * skt + offs_d[None, :],
            mask=qk_mask,
            other=0.0,
        )  # (BT, BD)
        a = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BT, BT): q_t . k_s
        gap = offs_c[:, None] - offs_c[None, :]  # t - s
        a = _decayed_causal(a, gap, LOG2G, h, DECAY)
        v = tl.load(
            V + b64 * svb + h64 * svh + offs_t[:, None] * svt + offs_v[None, :],
            mask=v_mask,
            other=0.0,
        )  # (BT, BV)
        o += tl.dot(a.to(v.dtype), v, input_precision=PRECISION)  # inside the tile
    tl.store(
        O + b64 * sob + h64 * soh + offs_t[:, None] * sot + offs_v[None, :],
        o.to(O.dtype.element_ty),
        mask=v_mask,
    )


@triton.jit
def _chunk_dv(
    Q, K, DO, DS, DV_, LOG2G,
    sqb, sqh, sqt, skb, skh, skt, sdob, sdoh, sdot, sdvb, sdvh, sdvt,
    H, T, D, DV, NS,
    INTRA: tl.constexpr, DECAY: tl.constexpr, STRIDE: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dv for one tile and Dv tile: gamma^(BT-1-j) k dh_slot (later tiles), plus the masked,
    decayed dense part inside the tile, A^T do, when INTRA."""
    pid_v = tl.program_id(0)
    i_t = tl.program_id(1)
    bh = tl.program_id(2)
    b, h = bh // H, bh % H
    offs_c = tl.arange(0, BT)
    offs_t = i_t * BT + offs_c
    offs_d = tl.arange(0, BD)
    offs_v = pid_v * BV + tl.arange(0, BV)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    qk_mask = (offs_t[:, None] < T) & (offs_d[None, :] < D)
    v_mask = (offs_t[:, None] < T) & (offs_v[None, :] < DV)
    k = tl.load(
        K + b64 * skb + h64 * skh + offs_t[:, None] * skt + offs_d[None, :], mask=qk_mask, other=0.0
    )  # (BT, BD)
    ds_off = (bh.to(tl.int64) * NS + i_t // STRIDE) * D * DV
    dh = tl.load(
        DS + ds_off + offs_d[:, None] * DV + offs_v[None, :],
        mask=(offs_d[:, None] < D) & (offs_v[None, :] < DV),
        other=0.0,
    )  # (BD, BV) fp32
    dv = tl.dot(k.to(tl.float32), dh, input_precision=PRECISION)  # (BT, BV): later tiles
    if DECAY:
        log2g = tl.load(LOG2G + h)
        dv = dv * tl.exp2((BT - 1 - offs_c).to(tl.float32) * log2g)[:, None]  # gamma^(BT-1-j)
    if INTRA:
        q = tl.load(
            Q + b64 * sqb + h64 * sqh + offs_t[:, None] * sqt + offs_d[None, :],
            mask=qk_mask,
            other=0.0,
        )  # (BT, BD)
        at = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BT, BT): [s, t] = q_t . k_s
        gap = offs_c[None, :] - offs_c[:, None]  # t - s
        at = _decayed_causal(at, gap, LOG2G, h, DECAY)
        do = tl.load(
            DO + b64 * sdob + h64 * sdoh + offs_t[:, None] * sdot + offs_v[None, :],
            mask=v_mask,
            other=0.0,
        )  # (BT, BV)
        dv += tl.dot(at.to(do.dtype), do, input_precision=PRECISION)  # inside the tile
    tl.store(
        DV_ + b64 * sdvb + h64 * sdvh + offs_t[:, None] * sdvt + offs_v[None, :],
        dv.to(DV_.dtype.element_ty),
        mask=v_mask,
    )


@triton.jit
def _chunk_dqk(
    Q, K, V, DO, S, DS, DQ, DK, LOG2G,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
    sdqb, sdqh, sdqt, sdkb, sdkh, sdkt,
    H, T, D, DV, NS,
    INTRA: tl.constexpr, DECAY: tl.constexpr, STRIDE: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dq, then dk, for one tile and a BD-wide slice of D: gamma^(j+1) do h^T and
    gamma^(BT-1-j) v dh^T through the states, plus dS k and dS^T q inside the tile when INTRA,
    the Dv sums in BV-wide steps. Two phases, so that only one [BT, BD] accumulator is live at
    a time (with both, the kernel spills registers at 4 and 8 warps, seen compiling for sm_90)."""
    pid_d = tl.program_id(0)
    i_t = tl.program_id(1)
    bh = tl.program_id(2)
    b, h = bh // H, bh % H
    offs_c = tl.arange(0, BT)
    offs_t = i_t * BT + offs_c
    offs_d = pid_d * BD + tl.arange(0, BD)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    t_ok = offs_t < T
    qk_mask = t_ok[:, None] & (offs_d[None, :] < D)
    s_off = (bh.to(tl.int64) * NS + i_t // STRIDE) * D * DV
    n_v = tl.cdiv(DV, BV)
    if DECAY:
        log2g = tl.load(LOG2G + h)
    # dq = gamma^(j+1) do h^T + dS k, with dS = (do v^T) masked and decayed.
    dq = tl.zeros([BT, BD], dtype=tl.float32)
    if INTRA:
        dsc = tl.zeros([BT, BT], dtype=tl.float32)  # [t, s] = do_t . v_s
    for j in range(0, n_v):
        offs_v = j * BV + tl.arange(0, BV)
        v_mask = t_ok[:, None] & (offs_v[None, :] < DV)
        do = tl.load(
            DO + b64 * sdob + h64 * sdoh + offs_t[:, None] * sdot + offs_v[None, :],
            mask=v_mask,
            other=0.0,
        )  # (BT, BV)
        hs = tl.load(
            S + s_off + offs_d[:, None] * DV + offs_v[None, :],
            mask=(offs_d[:, None] < D) & (offs_v[None, :] < DV),
            other=0.0,
        )  # (BD, BV) fp32
        dq += tl.dot(do.to(tl.float32), tl.trans(hs), input_precision=PRECISION)  # (BT, BD)
        if INTRA:
            v = tl.load(
                V + b64 * svb + h64 * svh + offs_t[:, None] * svt + offs_v[None, :],
                mask=v_mask,
                other=0.0,
            )  # (BT, BV)
            dsc += tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BT, BT)
    if DECAY:
        dq = dq * tl.exp2((offs_c + 1).to(tl.float32) * log2g)[:, None]  # gamma^(j + 1)
    if INTRA:
        gap = offs_c[:, None] - offs_c[None, :]  # t - s
        dsc = _decayed_causal(dsc, gap, LOG2G, h, DECAY)
        k = tl.load(
            K + b64 * skb + h64 * skh + offs_t[:, None] * skt + offs_d[None, :],
            mask=qk_mask,
            other=0.0,
        )  # (BT, BD)
        dsc_in = dsc.to(k.dtype)
        dq += tl.dot(dsc_in, k, input_precision=PRECISION)  # inside the tile
    tl.store(
        DQ + b64 * sdqb + h64 * sdqh + offs_t[:, None] * sdqt + offs_d[None, :],
        dq.to(DQ.dtype.element_ty),
        mask=qk_mask,
    )
    # dk = gamma^(BT-1-j) v dh^T + dS^T q.
    dk = tl.zeros([BT, BD], dtype=tl.float32)
    for j in range(0, n_v):
        offs_v = j * BV + tl.arange(0, BV)
        v = tl.load(
            V + b64 * svb + h64 * svh + offs_t[:, None] * svt + offs_v[None, :],
            mask=t_ok[:, None] & (offs_v[None, :] < DV),
            other=0.0,
        )  # (BT, BV)
        dh = tl.load(
            DS + s_off + offs_d[:, None] * DV + offs_v[None, :],
            mask=(offs_d[:, None] < D) & (offs_v[None, :] < DV),
            other=0.0,
        )  # (BD, BV) fp32
        dk += tl.dot(v.to(tl.float32), tl.trans(dh), input_precision=PRECISION)  # (BT, BD)
    if DECAY:
        dk = dk * tl.exp2((BT - 1 - offs_c).to(tl.float32) * log2g)[:, None]  # gamma^(BT-1-j)
    if INTRA:
        q = tl.load(
            Q + b64 * sqb + h64 * sqh + offs_t[:, None] * sqt + offs_d[None, :],
            mask=qk_mask,
            other=0.0,
        )  # (BT, BD)
        dk += tl.dot(tl.trans(dsc_in), q, input_precision=PRECISION)  # inside the tile
    tl.store(
        DK + b64 * sdkb + h64 * sdkh + offs_t[:, None] * sdkt + offs_d[None, :],
        dk.to(DK.dtype.element_ty),
        mask=qk_mask,
    )


# --------------------------------------------------------------------------------------------
# Launch configurations: (num_warps for head dims <= 64, num_warps at 128, num_stages)
# --------------------------------------------------------------------------------------------

#: The state pass: 4 warps hold a <= 64 x 64 fp32 state (32 registers a thread); three stages
#: keep the next two tiles' x, y loads in flight while the current one is summed (the loads do
#: not depend on the state, the pass is latency-bound). Compiled for sm_90 (Triton 3.9, bf16,
#: BT = 64): 32 KB of shared memory, 241-251 registers, none spilled; float32: 80 KB.
_STATES_CONFIG = (4, 4, 3)
#: The output and dv kernels: no loop, so nothing to pipeline (one stage); 8 warps at head dim
#: 128 for the [BT, 128] tiles of q, k and the [128, BV] fp32 state (sm_90, bf16: 143-155
#: registers at 64 with 4 warps, 194-198 at 128 with 8; none spilled).
_TILE_CONFIG = (4, 8, 1)
#: dq, dk, on <= 64-wide slices of D, 8 warps (sm_90, bf16: a 128-wide slice spills 584 bytes
#: a thread with 8 warps, a 64-wide one 1.4 KB with 4; 64 wide with 8 warps: 255 registers and
#: 88 bytes spilled with the dense part, 201 and none without); one stage, the loops over Dv
#: have one BV-wide step at Dv <= 64 and two at 128.
_DQK_CONFIG = (8, 8, 1)


def _warps(config: tuple[int, int, int], bd: int) -> int:
    return config[0] if bd <= 64 else config[1]


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Plan:
    """One call's tiling: BT positions a tile, states every ``stride`` tiles (``n_states`` of
    them), the dense part inside a tile (``intra``) and the decay (``decay``) on or off."""

    bt: int
    stride: int
    intra: bool
    decay: bool
    bd: int
    bv: int
    precision: str
    n_tiles: int
    n_states: int

    def constexprs(self) -> dict:
        return {
            "INTRA": self.intra,
            "DECAY": self.decay,
            "STRIDE": self.stride,
            "BT": self.bt,
            "BD": self.bd,
            "BV": self.bv,
            "PRECISION": self.precision,
        }


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _plan(
    q: Tensor, v: Tensor, log2g: Tensor | None, block: int | None, chunk: int | None
) -> _Plan:
    T, D, DV = q.shape[-2], q.shape[-1], v.shape[-1]
    if chunk is None:  # retention: the chunk is the tile, the dense part inside it counts
        bt, stride = block or TILE, 1
    else:  # FLASH's global part: whole earlier chunks of ``chunk`` only
        bt = min(chunk, block or TILE)
        stride = chunk // bt
        if stride * bt != chunk:
            raise ValueError(f"chunk {chunk} is not a multiple of the tile {bt}")
    n_tiles = triton.cdiv(T, bt)
    return _Plan(
        bt=bt,
        stride=stride,
        intra=chunk is None,
        decay=log2g is not None,
        bd=_pow2(D),
        bv=min(MAX_TILE, _pow2(DV)),
        precision="ieee" if q.dtype == torch.float32 else "tf32",
        n_tiles=n_tiles,
        n_states=triton.cdiv(n_tiles, stride),
    )


@functools.lru_cache(maxsize=16)
def _sm_count(device: str) -> int:
    """Multiprocessors of ``device`` (an H100's 132 where there is no CUDA device)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(dev).multi_processor_count


def _state_tiles(d: int, dv: int, bh: int, device: torch.device) -> tuple[int, int]:
    """(BK, BV) of a state pass: <= 64, halved (the wider first, not below 32) while the pass
    has fewer programs than the GPU has multiprocessors."""
    bk, bv = min(MAX_TILE, _pow2(d)), min(MAX_TILE, _pow2(dv))
    target = _sm_count(str(device))
    while bh * triton.cdiv(d, bk) * triton.cdiv(dv, bv) < target:
        if bv >= bk and bv > MIN_STATE_TILE:
            bv //= 2
        elif bk > MIN_STATE_TILE:
            bk //= 2
        else:
            break
    return bk, bv


def _strides(x: Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _states(x: Tensor, y: Tensor, log2g: Tensor | None, plan: _Plan, *, reverse: bool) -> Tensor:
    """The states at chunk boundaries (forward: x, y = k, v) or their gradients (reversed: x, y =
    q, do), ``[B*H, n_states, D, Dv]`` float32 (see the module docstring)."""
    B, H, T, D = x.shape
    DV = y.shape[-1]
    s = torch.empty((B * H, plan.n_states, D, DV), dtype=torch.float32, device=x.device)
    if plan.n_states == 0:  # T = 0: the kernel would store its first (empty) slot out of bounds
        return s
    bk, bv = _state_tiles(D, DV, B * H, x.device)
    grid = (triton.cdiv(D, bk) * triton.cdiv(DV, bv), B * H)
    args = (x, y, s, s if log2g is None else log2g, *_strides(x), *_strides(y), H, T, D, DV,
            plan.n_states)  # fmt: skip
    consts = {"REVERSE": reverse, "DECAY": plan.decay, "STRIDE": plan.stride, "BT": plan.bt,
              "BK": bk, "BV": bv, "PRECISION": plan.precision}  # fmt: skip
    warps, _, stages = _STATES_CONFIG
    _launch("states", _chunk_states, grid, args, consts, x, warps, stages)
    return s


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log2g: Tensor | None,
    *,
    block: int | None = None,
    chunk: int | None = None,
) -> tuple[Tensor, Tensor]:
    """(o, h): the causal decayed sum o ``[B, H, T, Dv]`` in q's dtype and the chunk states h
    ``[B*H, NS, D, Dv]`` float32 (kept for :func:`backward`). q, k ``[B, H, T, D]``, v
    ``[B, H, T, Dv]`` (last dims contiguous), log2g ``[H]`` float32 log2(gamma_h), or None for
    gamma = 1 without any decay arithmetic. ``chunk`` None: retention, tile ``block`` (default
    TILE); ``chunk`` c: FLASH's global part, whole earlier chunks of c only, tile min(c, block)."""
    plan = _plan(q, v, log2g, block, chunk)
    B, H, T, D = q.shape
    DV = v.shape[-1]
    h = _states(k, v, log2g, plan, reverse=False)
    o = torch.empty((B, H, T, DV), dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(DV, plan.bv), plan.n_tiles, B * H)
    args = (q, k, v, h, o, h if log2g is None else log2g,
            *_strides(q), *_strides(k), *_strides(v), *_strides(o), H, T, D, DV,
            plan.n_states)  # fmt: skip
    _launch("out", _chunk_out, grid, args, plan.constexprs(), q,
            _warps(_TILE_CONFIG, plan.bd), _TILE_CONFIG[2])  # fmt: skip
    return o, h


def backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    do: Tensor,
    h: Tensor,
    log2g: Tensor | None,
    *,
    block: int | None = None,
    chunk: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of :func:`forward` (the same ``block``, ``chunk``, and its states h) given
    do ``[B, H, T, Dv]`` (last dim contiguous): one reversed state pass for dh, then dv and
    (dq, dk), each parallel over tiles."""
    plan = _plan(q, v, log2g, block, chunk)
    B, H, T, D = q.shape
    DV = v.shape[-1]
    dh = _states(q, do, log2g, plan, reverse=True)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    gamma = dh if log2g is None else log2g
    grid = (triton.cdiv(DV, plan.bv), plan.n_tiles, B * H)
    args = (q, k, do, dh, dv, gamma, *_strides(q), *_strides(k), *_strides(do), *_strides(dv),
            H, T, D, DV, plan.n_states)  # fmt: skip
    _launch("dv", _chunk_dv, grid, args, plan.constexprs(), q,
            _warps(_TILE_CONFIG, plan.bd), _TILE_CONFIG[2])  # fmt: skip
    bk = min(MAX_TILE, plan.bd)
    grid = (triton.cdiv(D, bk), plan.n_tiles, B * H)
    args = (q, k, v, do, h, dh, dq, dk, gamma,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
            *_strides(dk), H, T, D, DV, plan.n_states)  # fmt: skip
    _launch("dqk", _chunk_dqk, grid, args, {**plan.constexprs(), "BD": bk}, q,
            _warps(_DQK_CONFIG, bk), _DQK_CONFIG[2])  # fmt: skip
    return dq, dk, dv


def _launch(
    name: str, kernel, grid: tuple, args: tuple, consts: dict, like: Tensor, warps: int, stages: int
) -> None:
    """``kernel[grid](*args, **consts)`` with ``warps`` and ``stages``; on a shared-memory
    refusal, once more with one stage (remembered for this configuration)."""
    config = (name, tuple(sorted(consts.items())), warps, like.dtype, str(like.device))
    stages = _STAGES.get(config, stages)
    try:
        kernel[grid](*args, **consts, num_warps=warps, num_stages=stages)
    except OUT_OF_RESOURCES as e:
        # Software pipelining keeps num_stages copies of a loop's tiles in shared memory: a
        # large user ``block`` (256 positions, float32) needs more than an H100's 228 KB. One
        # stage holds one copy; remember it for this configuration.
        if stages == 1:
            raise
        _STAGES[config] = 1
        try:
            kernel[grid](*args, **consts, num_warps=warps, num_stages=1)
        except OUT_OF_RESOURCES:
            raise e from None


def _out_of_resources() -> tuple[type[BaseException], ...]:
    kinds = []
    for holder in ("triton.runtime.errors", "triton.runtime", "triton.compiler.errors"):
        try:
            module = __import__(holder, fromlist=["OutOfResources"])
        except ImportError:
            continue
        kind = getattr(module, "OutOfResources", None)
        if isinstance(kind, type):
            kinds.append(kind)
    return tuple(dict.fromkeys(kinds)) or (RuntimeError,)


#: Triton's "out of resource" (shared memory, registers) error, wherever this version keeps it.
OUT_OF_RESOURCES = _out_of_resources()
#: num_stages chosen per (kernel, constexprs, num_warps, dtype, device) after a refusal.
_STAGES: dict[tuple, int] = {}
