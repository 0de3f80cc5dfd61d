"""Triton kernel for chunkwise causal decayed linear attention: retention (Sun et al. 2023,
RetNet) and, with gamma = 1, plain causal linear attention (Katharopoulos et al. 2020).

MUST EQUAL (the dense parallel form, written out in tests/kernels/test_triton_interpret.py):

    o_t = sum_{s <= t} gamma_h^(t - s) (q_t . k_s) v_s          (reverse=False)
    o_t = sum_{s >= t} gamma_h^(s - t) (q_t . k_s) v_s          (reverse=True, anti-causal)

and with intra=False only pairs in different chunks count (s in an earlier chunk, or a later one
when reversed): FLASH's causal global part, sum_{s < c * floor(t / c)} (q_t . k_s) v_s, c = BT.

Chunkwise form: the sequence is cut into chunks of BT positions. Inside a chunk the scores are
dense, (q k^T) * gamma^(t-s) masked to s <= t; across chunks a state S = sum_s gamma^(.) k_s^T v_s
([D, Dv], fp32, in registers) carries everything before the chunk. Every decay is a non-negative
power of gamma measured from inside the chunk, so nothing overflows for any length.

The reverse form makes the backward a reuse of this kernel, since each gradient is a sum of the
same shape: dq = fwd(do, v, k); dk = rev(v, do, q); dv = rev(k, q, do).

One program per (batch*head, Dv tile); chunks are walked in order. Imported lazily (this module
imports triton); call it through :mod:`attnbench.kernels.triton_ops`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _chunk_fwd(
    Q, K, V, O, LOG2G,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    H, T, D, DV,
    REVERSE: tl.constexpr, INTRA: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_v = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    log2g = tl.load(LOG2G + h)  # log2(gamma_h), <= 0
    offs_c = tl.arange(0, BT)  # position inside a chunk
    offs_d = tl.arange(0, BD)
    offs_v = pid_v * BV + tl.arange(0, BV)
    # Decays inside a chunk, all gamma^(non-negative).
    if REVERSE:
        gap = offs_c[None, :] - offs_c[:, None]  # s - t
        q_dec = tl.exp2((BT - offs_c).to(tl.float32) * log2g)  # gamma^(t0 + BT - t)
        k_dec = tl.exp2(offs_c.to(tl.float32) * log2g)  # gamma^(s - t0)
    else:
        gap = offs_c[:, None] - offs_c[None, :]  # t - s
        q_dec = tl.exp2((offs_c + 1).to(tl.float32) * log2g)  # gamma^(t - t0 + 1)
        k_dec = tl.exp2((BT - 1 - offs_c).to(tl.float32) * log2g)  # gamma^(t0 + BT - 1 - s)
    intra = tl.where(gap >= 0, tl.exp2(tl.maximum(gap, 0).to(tl.float32) * log2g), 0.0)
    chunk_dec = tl.exp2(BT * log2g)  # gamma^BT
    state = tl.zeros([BD, BV], dtype=tl.float32)
    n_chunks = tl.cdiv(T, BT)
    for c in range(0, n_chunks):
        if REVERSE:  # noqa: SIM108 (a constexpr branch, resolved when compiling)
            t0 = (n_chunks - 1 - c) * BT
        else:
            t0 = c * BT
        offs_t = t0 + offs_c
        kq_mask = (offs_t[:, None] < T) & (offs_d[None, :] < D)
        v_mask = (offs_t[:, None] < T) & (offs_v[None, :] < DV)
        q = tl.load(
            Q + b * sqb + h * sqh + offs_t[:, None] * sqt + offs_d[None, :], mask=kq_mask, other=0.0
        )  # (BT, BD)
        k = tl.load(
            K + b * skb + h * skh + offs_t[:, None] * skt + offs_d[None, :], mask=kq_mask, other=0.0
        )  # (BT, BD)
        v = tl.load(
            V + b * svb + h * svh + offs_t[:, None] * svt + offs_v[None, :], mask=v_mask, other=0.0
        )  # (BT, BV)
        if INTRA:
            a = tl.dot(q, tl.trans(k), input_precision=PRECISION) * intra  # (BT, BT)
            o = tl.dot(a.to(v.dtype), v, input_precision=PRECISION)  # (BT, BV), inside the chunk
        else:
            o = tl.zeros([BT, BV], dtype=tl.float32)
        q_in = (q * q_dec[:, None]).to(q.dtype)
        o += tl.dot(q_in, state.to(q.dtype), input_precision=PRECISION)  # earlier chunks
        tl.store(
            O + b * sob + h * soh + offs_t[:, None] * sot + offs_v[None, :],
            o.to(O.dtype.element_ty),
            mask=v_mask,
        )
        k_in = tl.trans((k * k_dec[:, None]).to(k.dtype))  # (BD, BT)
        state = state * chunk_dec + tl.dot(k_in, v, input_precision=PRECISION)  # (BD, BV)


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log2g: Tensor,
    *,
    reverse: bool,
    intra: bool = True,
    block: int | None = None,
) -> Tensor:
    """The causal (or, ``reverse``, anti-causal) decayed sum; q, k [B, H, T, D], v
    [B, H, T, Dv], log2g [H] fp32 -> [B, H, T, Dv] in q's dtype. ``intra=False`` drops the
    pairs inside a chunk (only earlier chunks count: FLASH's global part, chunk = ``block``)."""
    B, H, T, D = q.shape
    DV = v.shape[-1]
    o = torch.empty((B, H, T, DV), dtype=q.dtype, device=q.device)
    BD = max(16, triton.next_power_of_2(D))
    BV = min(64, max(16, triton.next_power_of_2(DV)))
    BT = block or 64
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    grid = (triton.cdiv(DV, BV), B * H)
    config = (BT, BD, BV, q.dtype, reverse, intra, str(q.device))

    def launch(num_stages: int | None) -> None:
        stages = {} if num_stages is None else {"num_stages": num_stages}
        _chunk_fwd[grid](
            q, k, v, o, log2g,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
            H, T, D, DV,
            REVERSE=reverse, INTRA=intra, BT=BT, BD=BD, BV=BV, PRECISION=precision,
            num_warps=4 if BD <= 64 else 8, **stages,
        )  # fmt: skip

    stages = _STAGES.get(config)
    try:
        launch(stages)
    except OUT_OF_RESOURCES as e:
        # Triton's default software pipelining keeps num_stages copies of the q, k, v tiles in
        # shared memory: FLASH's 256-long chunks at head dim 128 need ~270-440 KB of it, over
        # an H100's 228 KB (seen there). One stage holds one copy; remember it for this config.
        if stages == 1:
            raise
        _STAGES[config] = 1
        try:
            launch(1)
        except OUT_OF_RESOURCES:
            raise e from None
    return o


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
#: num_stages chosen per (BT, BD, BV, dtype, reverse, intra, device) after a refusal.
_STAGES: dict[tuple, int] = {}
