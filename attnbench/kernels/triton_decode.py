"""Triton kernels for decoding: a recurrent state stepped once per call (linear attention,
retention) and softmax attention over a K/V cache split along the cache (Flash-Decoding).

MUST EQUAL (the decode contract of :mod:`attnbench.core.decode`: the rows n .. n + Tq - 1 of
the mechanism's causal output over n + Tq tokens; tested under Triton's interpreter against the
dense references in float64, tests/kernels/interpreted_decode.py):

* :func:`_recurrent_step`, linear attention (Katharopoulos et al. 2020, "Transformers are
  RNNs") and retention (Sun et al. 2023, "Retentive Network"): for each new token t in order

      S <- gamma S + phi(k_t)^T v_t,  z <- gamma z + phi(k_t)      (fp32, in registers)
      o_t = scale * phi(q_t) S,  then the finish:
        linear, normalised:  o_t / (phi(q_t) . z + eps)
        retention, rownorm:  o_t r_t / max(|scale (q_t . z) r_t|, 1), r_t = (sum_{i<c} gamma^i)
                             ^(-1/2), c = the keys row t sees (its absolute position + 1)

  with gamma = 1 and phi a feature map for linear attention, phi = identity and RetNet's
  per-head gamma for retention. The state ``[B*H, D, W]`` (fp32; W = Dv, plus z as column Dv
  when a finish needs it) is read once into registers, stepped over the Tq new tokens, and
  written once, to a new buffer (the old one stays valid: a benchmark steps one state again
  and again). One program per (Dv tile, b*h), the whole D in the tile; z is kept by every
  program and stored by the first. Every product is a float32 multiply-add on CUDA cores (a
  state times one row is a matrix-vector product: no tensor-core shape), as FLA's
  ``fused_recurrent`` kernels do.

* :func:`_split_partials` and :func:`_split_combine`, softmax over a cache, split along the
  keys (Dao, Haziza, Massa and Sizov 2023, "Flash-Decoding for long-context inference",
  https://crfm.stanford.edu/2023/10/12/flashdecoding.html): program (split, row block,
  b*hkv) holds the G Tq query rows that share K/V head hkv (G = H / Hkv: MQA and GQA read each
  K/V tile once for all G heads) and walks its split's key tiles with an online softmax
  (running max m and sum l in base 2), writing unnormalised partials (acc, m, l) in fp32; the
  combine rescales each split's partials by 2^(m_split - max m) and divides once. The new rows
  see keys j <= their absolute position (causal, bottom right). q k^T runs on the input dtype's
  tensor cores with fp32 accumulation, p is rounded to v's dtype for p v (as flash attention
  does); float32 inputs use IEEE dots.

Imported lazily (this module imports triton); call it through
:mod:`attnbench.kernels.decode_ops`.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from attnbench.kernels.triton_linear import FEATURE_MAPS, _phi

#: log2(e): exp(x) = exp2(x log2 e), the softmax in base 2 as flash attention's kernels.
LOG2E = math.log2(math.e)
#: Finishes of the recurrent step: none, linear attention's normaliser, retention's rownorm.
FINISH = {"none": 0, "normalize": 1, "rownorm": 2}


@triton.jit
def _one_minus_exp(x):
    """1 - e^x for float32 x <= 0 to about 1e-7 relative: -x (1 + x/2 (1 + x/3 (..(1 + x/9))))
    near 0, where 1 - e^x cancels, and 1 - e^x below -0.5 (it is >= 0.39 there)."""
    t = 1.0 + x / 9.0
    t = 1.0 + x / 8.0 * t
    t = 1.0 + x / 7.0 * t
    t = 1.0 + x / 6.0 * t
    t = 1.0 + x / 5.0 * t
    t = 1.0 + x / 4.0 * t
    t = 1.0 + x / 3.0 * t
    t = 1.0 + x / 2.0 * t
    return tl.where(x > -0.5, -x * t, 1.0 - tl.exp(x))


@triton.jit
def _recurrent_step(
    Q, K, V, S_IN, S_OUT, O, LNG,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    H, TQ, D, DV, W, start, scale, eps,
    FMAP: tl.constexpr, DECAY: tl.constexpr, FINISH: tl.constexpr,
    BD: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """Tq tokens of one b*h and one Dv tile: S and z read once, stepped, written once."""
    pid_v = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_d = tl.arange(0, BD)
    offs_v = pid_v * BV + tl.arange(0, BV)
    d_ok = offs_d < D
    v_ok = offs_v < DV
    s_mask = d_ok[:, None] & v_ok[None, :]
    s_base = bh.to(tl.int64) * D * W
    s = tl.load(S_IN + s_base + offs_d[:, None] * W + offs_v[None, :], mask=s_mask, other=0.0)
    if FINISH != 0:
        z = tl.load(S_IN + s_base + offs_d * W + DV, mask=d_ok, other=0.0)  # (BD,)
    if DECAY:
        lng = tl.load(LNG + h)  # ln(gamma_h) < 0
        gamma = tl.exp(lng)
    q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    k_base = K + b.to(tl.int64) * skb + h.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + h.to(tl.int64) * svh
    o_base = O + b.to(tl.int64) * sob + h.to(tl.int64) * soh
    for t in range(0, TQ):
        x = tl.load(k_base + t * skt + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        fk = tl.where(d_ok, _phi(x, FMAP), 0.0)  # (BD,): padding adds nothing (elu + 1 of 0 is 1)
        v = tl.load(v_base + t * svt + offs_v, mask=v_ok, other=0.0).to(tl.float32)  # (BV,)
        if DECAY:
            s = s * gamma
        s += fk[:, None] * v[None, :]
        x = tl.load(q_base + t * sqt + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        fq = tl.where(d_ok, _phi(x, FMAP), 0.0)  # (BD,)
        o = tl.sum(fq[:, None] * s, 0) * scale  # (BV,)
        if FINISH != 0:
            if DECAY:
                z = z * gamma
            z += fk
            den = tl.sum(fq * z, 0)
            if FINISH == 1:
                o = o / (den + eps)
            else:  # rownorm at the row's absolute position: c = start + t + 1 keys seen
                count = (start + t + 1).to(tl.float32)
                r = tl.sqrt(_one_minus_exp(lng) / _one_minus_exp(count * lng))
                o = o * r / tl.maximum(tl.abs(den * scale * r), 1.0)
        tl.store(o_base + t * sot + offs_v, o.to(O.dtype.element_ty), mask=v_ok)
    tl.store(S_OUT + s_base + offs_d[:, None] * W + offs_v[None, :], s, mask=s_mask)
    if FINISH != 0:  # noqa: SIM102 (a constexpr branch around a runtime one)
        if pid_v == 0:  # every Dv tile keeps z; the first stores it
            tl.store(S_OUT + s_base + offs_d * W + DV, z, mask=d_ok)


@triton.jit
def _split_partials(
    Q, K, V, ACC, M, L,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
    HKV, G, TQ, D, DV, length, start, tiles_per_split, n_splits, qk_scale,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Split ``program_id(0)``'s keys for one block of BM query rows of K/V head b*hkv: the
    unnormalised acc = sum_j 2^(s_j - m) v_j, m = max_j s_j, l = sum_j 2^(s_j - m) (s in base
    2), over the keys j of the split each row sees. Rows: r = g Tq + a, query head hkv G + g,
    new token a (absolute position start + a)."""
    split = tl.program_id(0)
    blk = tl.program_id(1)
    bhkv = tl.program_id(2)
    b, hk = bhkv // HKV, bhkv % HKV
    rows = blk * BM + tl.arange(0, BM)
    row_ok = rows < G * TQ
    g, a = rows // TQ, rows % TQ
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    heads = (hk * G + g).to(tl.int64)
    q = tl.load(
        Q + b.to(tl.int64) * sqb + heads[:, None] * sqh + a[:, None] * sqt + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # (BM, BD)
    pos = start + a  # each row's absolute position: it sees keys j <= pos
    k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    m = tl.full([BM], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BM], dtype=tl.float32)  # noqa: E741
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    lo = split * tiles_per_split * BN
    hi = tl.minimum(lo + tiles_per_split * BN, length)
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        n_ok = offs_n < hi
        k = tl.load(k_base + offs_n[:, None] * skt + offs_d[None, :],
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BM, BN), base 2
        s = tl.where(n_ok[None, :] & (offs_n[None, :] <= pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that sees nothing yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m - m_safe)
        v = tl.load(v_base + offs_n[:, None] * svt + offs_dv[None, :],
                    mask=n_ok[:, None] & dv_ok[None, :], other=0.0)  # fmt: skip
        l = l * alpha + tl.sum(p, 1)  # noqa: E741
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    rows_total = G * TQ
    part = (bhkv.to(tl.int64) * n_splits + split) * rows_total + rows  # (BM,)
    tl.store(ACC + part[:, None] * DV + offs_dv[None, :], acc,
             mask=row_ok[:, None] & dv_ok[None, :])  # fmt: skip
    tl.store(M + part, m, mask=row_ok)
    tl.store(L + part, l, mask=row_ok)


@triton.jit
def _split_combine(
    ACC, M, L, O,
    sob, soh, sot,
    HKV, G, TQ, DV, n_splits,
    BS: tl.constexpr, SC: tl.constexpr, BDV: tl.constexpr,
):  # fmt: skip
    """One query row: o = sum_s 2^(m_s - m) acc_s / sum_s 2^(m_s - m) l_s, m = max_s m_s
    (finite: every row sees key 0, in split 0)."""
    row = tl.program_id(0)
    bhkv = tl.program_id(1)
    b, hk = bhkv // HKV, bhkv % HKV
    rows_total = G * TQ
    offs_s = tl.arange(0, BS)
    s_ok = offs_s < n_splits
    first = bhkv.to(tl.int64) * n_splits * rows_total + row
    m_all = tl.load(M + first + offs_s * rows_total, mask=s_ok, other=float("-inf"))
    l_all = tl.load(L + first + offs_s * rows_total, mask=s_ok, other=0.0)
    top = tl.max(m_all, 0)
    den = tl.sum(l_all * tl.exp2(m_all - top), 0)
    offs_dv = tl.arange(0, BDV)
    dv_ok = offs_dv < DV
    o = tl.zeros([BDV], dtype=tl.float32)
    for s0 in range(0, n_splits, SC):  # the partials in chunks of SC splits
        offs_c = s0 + tl.arange(0, SC)
        c_ok = offs_c < n_splits
        w = tl.exp2(tl.load(M + first + offs_c * rows_total, mask=c_ok, other=float("-inf")) - top)
        acc = tl.load(ACC + (first + offs_c * rows_total)[:, None] * DV + offs_dv[None, :],
                      mask=c_ok[:, None] & dv_ok[None, :], other=0.0)  # fmt: skip
        o += tl.sum(acc * w[:, None], 0)
    g, a = row // TQ, row % TQ
    head = (hk * G + g).to(tl.int64)
    tl.store(O + b.to(tl.int64) * sob + head * soh + a * sot + offs_dv,
             (o / den).to(O.dtype.element_ty), mask=dv_ok)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def _pow2(n: int) -> int:
    """A tile width for n: a power of two >= 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(n))


@functools.lru_cache(maxsize=16)
def _sm_count(device: str) -> int:
    """Multiprocessors of ``device`` (an H100's 132 where there is no CUDA device, so that the
    interpreter splits as a GPU would)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(dev).multi_processor_count


#: The recurrent step's widest Dv tile, and its narrowest (halved while the grid has fewer
#: programs than twice the multiprocessors: the step is a read of the state, and only programs
#: in flight read it; 16 fp32 columns are 64 bytes, two 32-byte sectors a state row).
STEP_TILE, MIN_STEP_TILE = 64, 16


def step_tile(dv: int, bh: int, device: str) -> int:
    """The Dv tile of the recurrent step for Dv columns and B*H heads on ``device``."""
    bv = min(STEP_TILE, _pow2(dv))
    while bv > MIN_STEP_TILE and bh * triton.cdiv(dv, bv) < 2 * _sm_count(device):
        bv //= 2
    return bv


def recurrent_step(
    state: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str,
    finish: str,
    ln_gamma: Tensor | None,
    scale: float,
    eps: float,
    start: int,
) -> tuple[Tensor, Tensor]:
    """(o ``[B, H, Tq, Dv]`` in q's dtype, the new state) after the Tq tokens q, k ``[B, H, Tq,
    D]``, v ``[B, H, Tq, Dv]``, from ``state`` ``[B, H, D, W]`` fp32 contiguous (W = Dv + 1 with
    z in the last column when ``finish`` is not "none"). ``ln_gamma``: ``[H]`` fp32 ln(gamma_h),
    None for no decay; ``start``: the tokens before (rownorm's positions)."""
    B, H, TQ, D = q.shape
    DV, W = v.shape[-1], state.shape[-1]
    out = torch.empty_like(state)
    o = torch.empty((B, H, TQ, DV), dtype=q.dtype, device=q.device)
    bv = step_tile(DV, B * H, str(q.device))
    grid = (triton.cdiv(DV, bv), B * H)
    lng = state if ln_gamma is None else ln_gamma  # an unused pointer without decay
    warps = 4 if _pow2(D) * bv <= 64 * 64 else 8
    _recurrent_step[grid](
        q, k, v, state, out, o, lng,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        H, TQ, D, DV, W, start, scale, eps,
        FMAP=FEATURE_MAPS[feature_map], DECAY=ln_gamma is not None, FINISH=FINISH[finish],
        BD=_pow2(D), BV=bv, num_warps=warps,
    )  # fmt: skip
    return o, out


def _strides(x: Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


#: The split kernel's tiles, 16-bit (True) and float32 (False) inputs: keys a tile, query rows
#: a program holds at most. Read off ptxas's report for sm_90 (Triton 3.9, D = Dv = 64 and 128
#: with the divisibility hints of a real launch): 16-bit, 64 keys, 4 warps to 64 x 128 rows x
#: width, else 8, spill nothing (at most 226 registers). float32 (IEEE dots on the CUDA cores,
#: both operands in registers) spilled with 32 keys at 4 warps: 512 bytes at 16 rows and D = 128
#: (SSMax's decode, computed in float32), 1 KB at 32, 16 KB at 128; 8 warps with 32 keys at 16
#: rows and 16 keys above spill nothing to 64 rows (at most 196 registers; 32 x 32 at D = 128
#: still spills 460 bytes, 128 rows more).
SPLIT_TILE = {True: 64, False: 32}
MAX_ROWS = {True: 128, False: 64}
#: The most splits a row is cut into; splits the combine reads per step.
MAX_SPLITS, COMBINE_CHUNK = 256, 32


def split_tiles(half: bool, rows: int, width: int, block: int | None) -> tuple[int, int, int]:
    """(BM query rows, BN keys, warps) of the split kernel for ``rows`` = G Tq query rows and
    ``width`` = the padded max(D, Dv) (``block``: a caller's key tile)."""
    bm = min(MAX_ROWS[half], _pow2(rows))
    if half:
        return bm, block or SPLIT_TILE[half], 4 if bm * width <= 64 * 128 else 8
    return bm, block or (SPLIT_TILE[half] if bm <= 16 else 16), 8


def split_plan(
    rows: int, bm: int, bhkv: int, length: int, block: int, splits: int | None, device: str
) -> tuple[int, int, int]:
    """(row blocks, tiles per split, splits) for blocks of ``bm`` rows: enough programs for
    about four per multiprocessor (``splits`` when given), never an empty split."""
    blocks = triton.cdiv(rows, bm)
    n_tiles = triton.cdiv(length, block)
    want = splits or triton.cdiv(4 * _sm_count(device), bhkv * blocks)
    want = max(1, min(want, n_tiles, MAX_SPLITS))
    per = triton.cdiv(n_tiles, want)
    return blocks, per, triton.cdiv(n_tiles, per)


def split_softmax(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    start: int,
    scale: float,
    block: int | None = None,
    splits: int | None = None,
) -> Tensor:
    """softmax(scale q K^T) V for the new rows at positions start .. start + Tq - 1 (each sees
    keys j <= its position) against the first ``length`` keys of a cache. q ``[B, H, Tq, D]``;
    keys ``[B, Hkv, length, D]``, values ``[B, Hkv, length, Dv]`` (views of a cache buffer, last
    dim contiguous; Hkv divides H) -> ``[B, H, Tq, Dv]`` in q's dtype."""
    B, H, TQ, D = q.shape
    HKV, length, DV = keys.shape[1], keys.shape[2], values.shape[-1]
    G = H // HKV
    half = q.dtype in (torch.float16, torch.bfloat16)
    bd, bdv = _pow2(D), _pow2(DV)
    bm, bn, warps = split_tiles(half, G * TQ, max(bd, bdv), block)
    blocks, per, n_splits = split_plan(G * TQ, bm, B * HKV, length, bn, splits, str(q.device))
    acc = torch.empty((B * HKV, n_splits, G * TQ, DV), dtype=torch.float32, device=q.device)
    m = torch.empty((B * HKV, n_splits, G * TQ), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)  # noqa: E741
    _split_partials[(n_splits, blocks, B * HKV)](
        q, keys, values, acc, m, l,
        *_strides(q), *_strides(keys), *_strides(values),
        HKV, G, TQ, D, DV, length, start, per, n_splits, scale * LOG2E,
        BM=bm, BN=bn, BD=bd, BDV=bdv, PRECISION="tf32" if half else "ieee", num_warps=warps,
    )  # fmt: skip
    o = torch.empty((B, H, TQ, DV), dtype=q.dtype, device=q.device)
    _split_combine[(G * TQ, B * HKV)](
        acc, m, l, o, *_strides(o), HKV, G, TQ, DV, n_splits,
        BS=triton.next_power_of_2(n_splits), SC=min(COMBINE_CHUNK, _pow2(n_splits)), BDV=bdv,
        num_warps=4,
    )  # fmt: skip
    return o
