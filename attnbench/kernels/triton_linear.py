"""Triton kernels for bidirectional (global) linear attention: Katharopoulos et al. 2020's
bidirectional form and FLASH's bidirectional global part (Hua et al. 2022), forward and backward.

MUST EQUAL (the dense formula, written out in tests/kernels/interpreted_linear.py):

    S = sum_t phi(k_t)^T v_t  [D, Dv]        z = sum_t phi(k_t)  [D]
    o_t = scale * phi(q_t) S / (phi(q_t) . z + eps)     (NORM)
    o_t = scale * phi(q_t) S                            (not NORM)

phi: identity, relu or elu + 1 (as e^min(x, 0) + max(x, 0), never (e^x - 1) + 1, which cancels
to 0 below x = -17 in float32), applied in registers in float32 to the loaded 16/32-bit x and
rounded back to the input dtype: the operands are exactly ``phi(x.float()).to(dtype)``, as
the float32-matmul path before these kernels used. No T x T tensor anywhere.

Two kernel shapes, each used for the forward and the backward:

* :func:`_reduce`, a split reduction over T: program (split, b*h) sums
  ``sum_t phi(a_t)^T (r_t b_t)`` [D, Dv] and ``sum_t c_t phi(a_t)`` [D] over its contiguous
  range of T tiles into float32 registers and stores them as one partial state
  [B*H, splits, D, Dv (+1 for the column sum)]; the partials are summed afterwards by
  ``torch.sum`` (fixed order: deterministic, no atomics). Splitting T fills the GPU when B*H
  is small (one program per (b, h) would leave most SMs idle at B*H = 32).
* :func:`_rows`, a per-row-tile product: program (p, b*h) walks its range of T tiles with the
  state [D, Dv] (float32) in registers, computing ``phi(x) M`` and/or ``w M^T`` per tile.

Forward: S, z = _reduce(a = k, b = v); o = _rows(MODE 0: phi(q) S, / (phi(q) . z + eps), scale).
Backward, with a_t = phi(q_t), den_t = a_t . z + eps, rs_t = scale / den_t and the output
gradient g_t (the derivation: o_t = rs_t a_t S, so d o / d den_t = -o_t / den_t):

    y_t   = g_t S^T                                  [D]   (_rows MODE 1)
    gd_t  = -rs_t (a_t . y_t) / den_t                      (= -(g_t . o_t) / den_t, as
                                                             g_t . (a_t S) = a_t . (g_t S^T))
    da_t  = rs_t y_t + gd_t z                              dq = da * phi'(q)
    dS    = sum_t a_t^T (rs_t g_t),  dz = sum_t gd_t a_t   (_reduce with rows r = rs, c = gd)
    dphi(k_t) = v_t dS^T + dz,  dv_t = phi(k_t) dS         (_rows MODE 2), dk = dphi(k) phi'(k)

i.e. G = [g / den, -(g . o) / den] times scale and S' = [S, z]: dphi(q) = G S'^T,
dS' = phi(q)^T G. Unnormalised: rs_t = scale, no gd, no z. phi'(x): elu + 1, e^min(x, 0);
relu, [x > 0]; identity, 1.

Precision. float32 inputs: IEEE dots (no TF32) on float32 operands, so the result matches a
float32 reference. 16-bit inputs: tensor-core dots on 16-bit operands with float32
accumulation; the states (S, z, dS, dz) are float32. A float32 state M enters a 16-bit dot as
two 16-bit matrices: M = p (hi + lo), p a power of two putting max |M| / p in [2^13, 2^14)
(so hi never passes float16's 65504), hi = (M / p).to(dtype), lo = (M / p - hi).to(dtype), and
x M = p (x hi + x lo), two dots. |M / p - hi - lo| <= 2^-22 |M / p| + 2^-25 for float16
(hi keeps 11 significant bits, lo the next 11; 2^-25, half float16's smallest subnormal, only
matters for entries 2^-38 below the tile's max) and 2^-16 |M / p| for bfloat16 (8 + 8 bits):
well below the output's own rounding (2^-11, 2^-8), where one 16-bit cast of M would add an
error as large as that rounding to every term, and pass 65504 once |M| does (S grows like T
when v has a mean). (TF32 on the float32 state keeps 11 bits: no better than one float16 cast.)
p is built from M's exponent bits, so the scaling is exact. The denominator a . z, the
normalisation, eps, scale and the final cast are float32, in the same kernel.

In the backward the row factor rs_t = scale / den_t (about 1 / (T d) for unit-size elu + 1
features: below float16's smallest normal, 6e-5, once T d passes ~16k) multiplies g_t before
dS's 16-bit dot. It is taken relative to the tile's largest |rs| (a power of two, multiplied
back onto the dot's float32 result), so no row falls into float16's subnormals, and rs_t g_t
enters as hi + lo 16-bit parts like M: dk = (v dS^T + dz) phi'(k) cancels when v has a large
mean (dz carries -(g . o) / den with o ~ that mean), so dS must be as exact as float32 dz; with
one 16-bit part the test with v ~ 1000 was 300x off the float32 reference.

Imported lazily (this module imports triton); call it through
:func:`attnbench.kernels.triton_ops.linear_attention_global`. Tensors: q, k ``[B, H, T, D]``,
v ``[B, H, T, Dv]`` (D, Dv <= 128), last dim contiguous.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from attnbench.kernels.triton_retention import OUT_OF_RESOURCES

#: Feature-map codes the kernels branch on (attnbench.variants.linear.FEATURE_MAPS' names).
FEATURE_MAPS = {"identity": 0, "relu": 1, "elu+1": 2}


@triton.jit
def _phi(x, FMAP: tl.constexpr):
    """phi(x) in float32 for float32 x: identity, relu, or elu + 1 = e^min(x, 0) + max(x, 0)."""
    if FMAP == 2:
        y = tl.exp(tl.minimum(x, 0.0)) + tl.maximum(x, 0.0)
    elif FMAP == 1:
        y = tl.maximum(x, 0.0)
    else:
        y = x
    return y


@triton.jit
def _times_dphi(g, x, FMAP: tl.constexpr):
    """g * phi'(x): elu + 1, e^min(x, 0); relu, [x > 0]; identity, 1. float32."""
    if FMAP == 2:
        g = g * tl.exp(tl.minimum(x, 0.0))
    elif FMAP == 1:
        g = tl.where(x > 0.0, g, 0.0)
    return g


@triton.jit
def _pow2(top, TARGET: tl.constexpr):
    """(inv, p): powers of two, p = 1 / inv exactly, with top * inv in [2^TARGET, 2^(TARGET+1))
    for a float32 top >= 0, read off top's exponent bits (no log2 / exp2 approximation)."""
    e = (top.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased exponent: floor(log2 top) + 127
    e = tl.minimum(tl.maximum(e, TARGET + 1), 253 + TARGET)  # both results normal floats
    inv = ((254 + TARGET - e) << 23).to(tl.float32, bitcast=True)
    p = ((e - TARGET) << 23).to(tl.float32, bitcast=True)
    return inv, p


@triton.jit
def _reduce(
    A, B, R, C, PART,
    sab, sah, sat, sbb, sbh, sbt, s_pbh, s_ps, s_pd,
    H, T, D, DV, tiles_per_split, mult,
    FMAP: tl.constexpr, ROWS: tl.constexpr, HAS_Z: tl.constexpr, HALF: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Partial state of split ``program_id(0)``: PART[bh, split, :D, :DV] = mult * sum_t
    phi(a_t)^T (r_t b_t) and, with HAS_Z, PART[bh, split, :D, DV] = sum_t c_t phi(a_t), over
    the split's T tiles. r_t = c_t = 1 unless ROWS (then read from R, C: [B*H, T] float32)."""
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_c = tl.arange(0, BT)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BV)
    d_ok = offs_d < D
    v_ok = offs_v < DV
    acc = tl.zeros([BD, BV], dtype=tl.float32)
    col = tl.zeros([BD], dtype=tl.float32)
    t_lo = split * tiles_per_split * BT
    t_hi = tl.minimum(t_lo + tiles_per_split * BT, T)
    for t0 in range(t_lo, t_hi, BT):
        offs_t = t0 + offs_c
        t_ok = offs_t < T
        a_mask = t_ok[:, None] & d_ok[None, :]
        x = tl.load(
            A + b * sab + h * sah + offs_t[:, None] * sat + offs_d[None, :], mask=a_mask, other=0.0
        )  # (BT, BD)
        # Padding is zeroed after phi (elu + 1 of 0 is 1): it must add nothing to S or z.
        a = tl.where(a_mask, _phi(x.to(tl.float32), FMAP), 0.0).to(x.dtype)  # (BT, BD)
        y = tl.load(
            B + b * sbb + h * sbh + offs_t[:, None] * sbt + offs_v[None, :],
            mask=t_ok[:, None] & v_ok[None, :],
            other=0.0,
        )  # (BT, BV)
        if ROWS:
            r = tl.load(R + bh * T + offs_t, mask=t_ok, other=0.0)  # (BT,) float32
            c = tl.load(C + bh * T + offs_t, mask=t_ok, other=0.0)  # (BT,) float32
            col += tl.sum(a.to(tl.float32) * c[:, None], 0)
            if HALF:
                # r relative to the tile's largest |r| (a power of two): no 16-bit subnormals;
                # r b as hi + lo 16-bit parts, two dots (dk's v dS^T + dz cancels: see above).
                inv, p = _pow2(tl.max(tl.abs(r), 0), -1)
                yr = y.to(tl.float32) * (r * inv)[:, None]  # (BT, BV), |.| <= |b|
                yr_hi = yr.to(y.dtype)
                yr_lo = (yr - yr_hi.to(tl.float32)).to(y.dtype)
                part = tl.dot(tl.trans(a), yr_hi, input_precision=PRECISION)
                part = tl.dot(tl.trans(a), yr_lo, part, input_precision=PRECISION)
                acc += part * p
            else:
                yr = y * r[:, None]  # (BT, BV) float32
                acc = tl.dot(tl.trans(a), yr, acc, input_precision=PRECISION)
        else:
            if HAS_Z:
                col += tl.sum(a.to(tl.float32), 0)
            acc = tl.dot(tl.trans(a), y, acc, input_precision=PRECISION)  # (BD, BV)
    base = PART + bh * s_pbh + split * s_ps
    tl.store(
        base + offs_d[:, None] * s_pd + offs_v[None, :],
        acc * mult,
        mask=d_ok[:, None] & v_ok[None, :],
    )
    if HAS_Z:
        tl.store(base + offs_d * s_pd + DV, col, mask=d_ok)


@triton.jit
def _dot_m(x, m, m_hi, m_lo, p, TRANS: tl.constexpr, HALF: tl.constexpr, PRECISION: tl.constexpr):
    """x M (or x M^T with TRANS) in float32: two 16-bit dots on M's hi and lo parts scaled back
    by p (HALF), else one IEEE dot on the float32 M."""
    if HALF:
        if TRANS:
            out = tl.dot(x, tl.trans(m_hi), input_precision=PRECISION)
            out = tl.dot(x, tl.trans(m_lo), out, input_precision=PRECISION)
        else:
            out = tl.dot(x, m_hi, input_precision=PRECISION)
            out = tl.dot(x, m_lo, out, input_precision=PRECISION)
        out = out * p
    else:
        if TRANS:
            out = tl.dot(x, tl.trans(m), input_precision=PRECISION)
        else:
            out = tl.dot(x, m, input_precision=PRECISION)
    return out


@triton.jit
def _rows(
    X, W, M, Z, O1, O2, RS, GD,
    sxb, sxh, sxt, swb, swh, swt, smb, smd, szb, szd,
    s1b, s1h, s1t, s2b, s2h, s2t,
    H, T, D, DV, tiles_per_prog, scale, eps,
    MODE: tl.constexpr, FMAP: tl.constexpr, NORM: tl.constexpr, HALF: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Per row tile, with the state M [D, DV] (and z [D] when NORM) of this b*h in registers:

    MODE 0 (forward):  O1 = scale * phi(x) M / (phi(x) . z + eps)   [or scale * phi(x) M]
    MODE 1 (dq):       y = w M^T; rs = scale / (phi(x) . z + eps); gd = -rs (phi(x) . y) / den;
                       O2 = (rs y + gd z) phi'(x), RS = rs, GD = gd   [or O2 = scale y phi'(x)]
    MODE 2 (dk, dv):   O2 = (w M^T + z) phi'(x), O1 = phi(x) M        [z only when NORM]
    """
    prog = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_c = tl.arange(0, BT)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BV)
    d_ok = offs_d < D
    v_ok = offs_v < DV
    m = tl.load(
        M + bh * smb + offs_d[:, None] * smd + offs_v[None, :],
        mask=d_ok[:, None] & v_ok[None, :],
        other=0.0,
    )  # (BD, BV) float32
    if NORM:
        z = tl.load(Z + bh * szb + offs_d * szd, mask=d_ok, other=0.0)  # (BD,) float32
    else:
        z = tl.zeros([BD], dtype=tl.float32)
    dtype = X.dtype.element_ty
    if HALF:
        inv, p = _pow2(tl.max(tl.max(tl.abs(m), 1), 0), 13)
        ms = m * inv  # max |ms| in [2^13, 2^14): exact, a power-of-two scaling
        m_hi = ms.to(dtype)
        m_lo = (ms - m_hi.to(tl.float32)).to(dtype)
    else:
        p = 1.0
        m_hi = m
        m_lo = m
    t_lo = prog * tiles_per_prog * BT
    t_hi = tl.minimum(t_lo + tiles_per_prog * BT, T)
    for t0 in range(t_lo, t_hi, BT):
        offs_t = t0 + offs_c
        t_ok = offs_t < T
        x_mask = t_ok[:, None] & d_ok[None, :]
        w_mask = t_ok[:, None] & v_ok[None, :]
        x = tl.load(
            X + b * sxb + h * sxh + offs_t[:, None] * sxt + offs_d[None, :], mask=x_mask, other=0.0
        ).to(tl.float32)  # (BT, BD)
        a = tl.where(x_mask, _phi(x, FMAP), 0.0).to(dtype)  # (BT, BD): the dots' operand
        if MODE == 0:
            o = _dot_m(a, m, m_hi, m_lo, p, False, HALF, PRECISION)  # (BT, BV)
            if NORM:
                den = tl.sum(a.to(tl.float32) * z[None, :], 1) + eps  # (BT,)
                den = tl.where(t_ok, den, 1.0)  # padding rows: no 0 / 0 (not stored)
                o = o * (scale / den)[:, None]
            else:
                o = o * scale
            tl.store(
                O1 + b * s1b + h * s1h + offs_t[:, None] * s1t + offs_v[None, :],
                o.to(O1.dtype.element_ty),
                mask=w_mask,
            )
        else:
            w = tl.load(
                W + b * swb + h * swh + offs_t[:, None] * swt + offs_v[None, :],
                mask=w_mask,
                other=0.0,
            )  # (BT, BV): do (MODE 1) or v (MODE 2)
            y = _dot_m(w, m, m_hi, m_lo, p, True, HALF, PRECISION)  # (BT, BD) = w M^T
            if MODE == 1:
                if NORM:
                    af = a.to(tl.float32)
                    den = tl.sum(af * z[None, :], 1) + eps  # (BT,)
                    den = tl.where(t_ok, den, 1.0)  # padding rows: rs = gd = 0 there
                    rs = tl.where(t_ok, scale / den, 0.0)
                    gd = -rs * tl.sum(af * y, 1) / den  # -(do . o) / den
                    da = y * rs[:, None] + gd[:, None] * z[None, :]  # (BT, BD)
                    tl.store(RS + bh * T + offs_t, rs, mask=t_ok)
                    tl.store(GD + bh * T + offs_t, gd, mask=t_ok)
                else:
                    da = y * scale
            else:
                da = y + z[None, :]  # z is dz here (0 when not NORM)
                dv = _dot_m(a, m, m_hi, m_lo, p, False, HALF, PRECISION)  # (BT, BV)
                tl.store(
                    O1 + b * s1b + h * s1h + offs_t[:, None] * s1t + offs_v[None, :],
                    dv.to(O1.dtype.element_ty),
                    mask=w_mask,
                )
            dx = _times_dphi(da, x, FMAP)  # (BT, BD)
            tl.store(
                O2 + b * s2b + h * s2h + offs_t[:, None] * s2t + offs_d[None, :],
                dx.to(O2.dtype.element_ty),
                mask=x_mask,
            )


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def _pad(d: int) -> int:
    """Tile width for a head dim: a power of two >= 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(d))


def _strides(t: Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


@functools.lru_cache(maxsize=16)
def _sm_count(device: str) -> int:
    """Streaming multiprocessors of a CUDA device (132 on an H100 SXM); 1 elsewhere (the
    interpreter: one split unless a test asks for more)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(dev).multi_processor_count


def _ranges(n_tiles: int, bh: int, per_sm: int, device: str, count: int | None) -> tuple[int, int]:
    """(tiles per program, programs per b*h) over ``n_tiles`` T tiles: ``count`` programs per
    b*h when given (tests), else enough for ``per_sm`` programs per SM in all; never an empty
    program (the count is recomputed from the tiles each one takes)."""
    want = count or -(-per_sm * _sm_count(device) // max(bh, 1))
    want = max(1, min(want, n_tiles))
    per = -(-n_tiles // want) if n_tiles else 1
    return per, max(1, -(-n_tiles // per))


def _config(q: Tensor, v: Tensor, block: int | None) -> tuple[int, int, int, dict]:
    """Tile sizes and launch options, chosen from ptxas' register counts for sm_90 (compiled
    without a GPU, not timed). 16-bit: 64 positions a tile, 8 warps (no spills up to
    128 x 128 but 64 bytes in the dq pass; 4 warps spill at D = 128). float32: IEEE dots are
    CUDA-core FMA dots whose operands Triton keeps whole in registers (K = D or Dv deep), so
    16 positions a tile and 8 warps (16 past head dim 64); the dq pass still spills ~2 KB a
    thread at 128 x 128."""
    BD, BV = _pad(q.shape[-1]), _pad(v.shape[-1])
    half = q.dtype in (torch.float16, torch.bfloat16)
    BT = block or (64 if half else 16)
    opts = {
        "num_warps": 8 if half or max(BD, BV) <= 64 else 16,
        "HALF": half,
        "PRECISION": "tf32" if half else "ieee",  # 16-bit operands ignore it; float32: IEEE
    }
    return BT, BD, BV, opts


#: num_stages chosen per (kernel, BT, BD, BV, dtype, device) after a shared-memory refusal.
_STAGES: dict[tuple, int] = {}


def _launch(kernel, grid, key: tuple, *args, **kwargs) -> None:
    """Launch; if Triton's default software pipelining asks for more shared memory than the GPU
    has (float32 tiles at head dim 128), retry with one stage and remember it (as
    triton_retention does)."""
    stages = _STAGES.get(key)
    extra = {} if stages is None else {"num_stages": stages}
    try:
        kernel[grid](*args, **kwargs, **extra)
    except OUT_OF_RESOURCES as e:
        if stages == 1:
            raise
        _STAGES[key] = 1
        try:
            kernel[grid](*args, **kwargs, num_stages=1)
        except OUT_OF_RESOURCES:
            raise e from None


def _reduce_launch(
    a: Tensor,
    b: Tensor,
    rows: tuple[Tensor, Tensor] | None,
    fmap: int,
    has_z: bool,
    mult: float,
    block: int | None,
    splits: int | None,
) -> Tensor:
    """mult * sum_t phi(a_t)^T (r_t b_t) [B*H, D, Dv], with sum_t c_t phi(a_t) appended as
    column Dv when ``has_z`` ((r, c) = ``rows``, else 1): float32, summed over T splits."""
    B, H, T, D = a.shape
    DV = b.shape[-1]
    BT, BD, BV, opts = _config(a, b, block)
    per, n = _ranges(triton.cdiv(T, BT), B * H, 2, str(a.device), splits)
    part = torch.empty((B * H, n, D, DV + has_z), dtype=torch.float32, device=a.device)
    r, c = rows if rows is not None else (part, part)  # unused pointers when not ROWS
    _launch(
        _reduce, (n, B * H), ("reduce", BT, BD, BV, a.dtype, str(a.device)),
        a, b, r, c, part,
        *_strides(a), *_strides(b), part.stride(0), part.stride(1), part.stride(2),
        H, T, D, DV, per, mult,
        FMAP=fmap, ROWS=rows is not None, HAS_Z=has_z, BT=BT, BD=BD, BV=BV, **opts,
    )  # fmt: skip
    return part.sum(1) if n > 1 else part[:, 0]  # (B*H, D, Dv (+1))


def _rows_launch(
    mode: int,
    x: Tensor,
    w: Tensor | None,
    state: Tensor,
    dv: int,
    outs: tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None],
    fmap: int,
    norm: bool,
    scale: float,
    eps: float,
    block: int | None,
    splits: int | None,
) -> None:
    """One :func:`_rows` pass; ``state`` [B*H, D, >= dv] float32 holds M in its first ``dv``
    columns and z in column ``dv`` when ``norm``; ``outs`` = (O1, O2, RS, GD) or None."""
    B, H, T, D = x.shape
    BT, BD, BV, opts = _config(x, state[..., :dv], block)
    per, n = _ranges(triton.cdiv(T, BT), B * H, 4, str(x.device), splits)
    z = state[..., dv] if norm else state[..., 0]  # (B*H, D) view: a pointer and strides
    w = x if w is None else w
    o1, o2, rs, gd = (x if t is None else t for t in outs)
    _launch(
        _rows, (n, B * H), ("rows", mode, BT, BD, BV, x.dtype, str(x.device)),
        x, w, state, z, o1, o2, rs, gd,
        *_strides(x), *_strides(w), state.stride(0), state.stride(1), z.stride(0), z.stride(1),
        *_strides(o1), *_strides(o2),
        H, T, D, dv, per, scale, eps,
        MODE=mode, FMAP=fmap, NORM=norm, BT=BT, BD=BD, BV=BV, **opts,
    )  # fmt: skip


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    feature_map: str,
    normalize: bool,
    eps: float,
    scale: float,
    block: int | None = None,
    splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """(o [B, H, T, Dv] in q's dtype, state [B*H, D, Dv (+1)] float32: S, and z as the last
    column when ``normalize``) of the formula in the module docstring. ``block``: positions a
    tile (a power of two >= 16); ``splits``: programs per b*h (default: enough to fill the GPU)."""
    B, H, T, _ = q.shape
    DV = v.shape[-1]
    fmap = FEATURE_MAPS[feature_map]
    state = _reduce_launch(k, v, None, fmap, normalize, 1.0, block, splits)  # (B*H, D, DV(+1))
    o = torch.empty((B, H, T, DV), dtype=q.dtype, device=q.device)
    outs = (o, None, None, None)
    _rows_launch(0, q, None, state, DV, outs, fmap, normalize, scale, eps, block, splits)
    return o, state


def backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: Tensor,
    do: Tensor,
    feature_map: str,
    normalize: bool,
    eps: float,
    scale: float,
    block: int | None = None,
    splits: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of :func:`forward` for the output gradient ``do`` [B, H, T, Dv]: three
    passes (dq and the row factors; dS, dz; dk and dv), see the module docstring."""
    B, H, T, _ = q.shape
    DV = v.shape[-1]
    fmap = FEATURE_MAPS[feature_map]
    do = do if do.stride(-1) == 1 else do.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    rows = None
    if normalize:
        rows = tuple(torch.empty((B * H, T), dtype=torch.float32, device=q.device) for _ in "rc")
    outs = (None, dq, *(rows or (None, None)))
    _rows_launch(1, q, do, state, DV, outs, fmap, normalize, scale, eps, block, splits)
    mult = 1.0 if normalize else scale  # normalised: scale is inside the row factors rs
    dstate = _reduce_launch(q, do, rows, fmap, normalize, mult, block, splits)  # (B*H, D, DV(+1))
    _rows_launch(
        2, k, v, dstate, DV, (dv, dk, None, None), fmap, normalize, 1.0, 0.0, block, splits
    )
    return dq, dk, dv
