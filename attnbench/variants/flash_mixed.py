"""Mixed chunk attention: FLASH and MC-TFM (Hua et al. 2022; Su 2022).

The sequence is cut into chunks of ``chunk`` = c tokens (the last one shorter when c does not
divide T). Each output row is the sum of a local part, quadratic inside the row's chunk, and a
global part, linear attention over the chunks, from its own projections q_lin, k_lin::

    o_i = local_i + q_lin_i · (sum_{j in L_i} k_lin_jᵀ v_j) / |L_i|

Shapes: q, k, q_lin, k_lin ``[B, H, T, s]``, v ``[B, H, T, e]`` -> o ``[B, H, T, e]``.

Normalisers — every one counts the terms really summed (Su 2022's correction):

* ``flash`` local part: relu²(q_i · k_j) / (m_i s) over the keys j of i's chunk (``norm=ns``, the
  1/(c s) of Su 2022) or / m_i² (``norm=n2``, the paper's code style), where m_i is the number of
  keys row i sees in its chunk: the chunk's real length (so a partial last chunk divides by its own
  length, not c), and the position inside the chunk plus one when causal (upper triangle masked).
* ``mc-softmax`` local part: softmax(q_i · k_j / √s) over the same keys (no count needed).
* global part: bidirectional L_i = all T tokens, |L_i| = T. Causal: L_i = the tokens of the chunks
  before i's chunk (an exclusive prefix sum over chunks), |L_i| = g·c for a row in chunk g
  (0-based), not T as in the paper's appendix code; rows of the first chunk get no global part.

``mc-softmax`` (MC-TFM) is the same scheme in a standard Transformer: multi-head, softmax inside the
chunks, the two parts added as in FLASH. Its layer projects q, k, v, q_lin, k_lin per head.

Paths: ``reference`` builds the T x T matrix of both parts with the counts above read off the
masks. ``efficient`` computes the local part per chunk (O(T·c) memory) and the global part from
per-chunk states k_linᵀ v (the causal one keeps (T/c)·s·e numbers, Su 2022's b(n/c)se), never a
T x T tensor; the state sums run in float32 for half inputs. ``triton`` (fused, CUDA): the Triton
relu² kernel restricted to chunks for the local part and the chunkwise kernel for the causal
global part (:func:`flash_triton`); causal calls need a chunk that is a power of two >= 16.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.core import sources
from attnbench.core.errors import AttnbenchError
from attnbench.core.precision import float32_sums, refuse_overflow, to_dtype
from attnbench.core.spec import ExtraInput, Mechanism, Param, PathSpec, Shape, positive_int
from attnbench.kernels import triton_ops
from attnbench.variants.gau import NORMS, sdpa_any_width
from attnbench.variants.gau_decode import FLASH_CHUNK, MC_CHUNK

# --------------------------------------------------------------------------------------------
# Reference: both parts as dense T x T matrices
# --------------------------------------------------------------------------------------------


def _masks(T: int, chunk: int, causal: bool, device) -> tuple[Tensor, Tensor]:
    """Boolean [T, T] masks of the local part (same chunk) and the global part."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    same = (i // chunk) == (j // chunk)
    if not causal:
        return same, torch.ones(T, T, dtype=torch.bool, device=device)
    return same & (j <= i), (j // chunk) < (i // chunk)


def _per_row(mask: Tensor) -> Tensor:
    """1 / (number of True in each row) as float64 [T, 1]; 0 for an empty row."""
    n = mask.sum(-1, keepdim=True).to(torch.float64)
    return torch.where(n > 0, 1.0 / n.clamp(min=1), torch.zeros((), dtype=torch.float64))


def _global_matrix(q_lin: Tensor, k_lin: Tensor, mask: Tensor) -> Tensor:
    """The global part's matrix (q_lin k_linᵀ) / |L_i| on the pairs of ``mask``. [B,H,T,T]."""
    a = q_lin @ k_lin.transpose(-2, -1)  # (B, H, T, T)
    return torch.where(mask, a, torch.zeros((), dtype=a.dtype)) * _per_row(mask).to(a.dtype)


@float32_sums(name="flash:reference")
def flash_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    chunk: int,
    norm: str,
    q_lin: Tensor,
    k_lin: Tensor,
) -> Tensor:
    """Dense FLASH: (block-diagonal relu² matrix + global linear matrix) v. [B, H, T, D] layout.
    Half inputs are computed in float32 (relu²(q·k) passes float16's 65504 at |q·k| > 255.9)."""
    T, D = q.shape[-2], q.shape[-1]
    local, glob = _masks(T, chunk, causal, q.device)
    inv_m = _per_row(local)  # (T, 1) 1 / keys seen in the chunk
    weight = inv_m / D if norm == "ns" else inv_m**2
    a = torch.relu(q @ k.transpose(-2, -1)) ** 2  # (B, H, T, T)
    a = torch.where(local, a, torch.zeros((), dtype=a.dtype)) * weight.to(a.dtype)
    return (a + _global_matrix(q_lin, k_lin, glob)) @ v  # (B, H, T, e)


@float32_sums(name="mc-softmax:reference")
def mc_reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, chunk: int, q_lin: Tensor, k_lin: Tensor
) -> Tensor:
    """Dense MC-TFM: (softmax inside chunks, -inf elsewhere, + global linear matrix) v. Half
    inputs are computed in float32 (the global matrix's sums pass float16's range first)."""
    T, D = q.shape[-2], q.shape[-1]
    local, glob = _masks(T, chunk, causal, q.device)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # (B, H, T, T)
    probs = torch.softmax(scores.masked_fill(~local, float("-inf")), dim=-1)
    return (probs + _global_matrix(q_lin, k_lin, glob)) @ v  # (B, H, T, e)


# --------------------------------------------------------------------------------------------
# Efficient: per-chunk local part, chunk states for the global part
# --------------------------------------------------------------------------------------------


def _chunks(x: Tensor, c: int) -> tuple[Tensor, Tensor]:
    """[B, H, T, D] -> the full chunks [B, H, G, c, D] and the remainder [B, H, T % c, D]."""
    B, H, T, D = x.shape
    G = T // c
    return x[:, :, : G * c].reshape(B, H, G, c, D), x[:, :, G * c :]


def _relu2_block(q: Tensor, k: Tensor, v: Tensor, causal: bool, norm: str, s: int) -> Tensor:
    """relu² attention inside one block of m rows [..., m, D], row weights folded into q."""
    m = q.shape[-2]
    if causal:
        n = torch.arange(1, m + 1, dtype=torch.float64, device=q.device)[:, None]  # (m, 1)
    else:
        n = torch.full((m, 1), float(m), dtype=torch.float64, device=q.device)
    root_w = (n * s).rsqrt() if norm == "ns" else 1.0 / n  # (m, 1)
    r = torch.relu((q * root_w.to(q.dtype)) @ k.transpose(-2, -1))  # (..., m, m)
    if causal:
        upper = torch.ones(m, m, dtype=torch.bool, device=q.device).triu(1)
        r = r.masked_fill(upper, 0.0)
    return r.square() @ v  # (..., m, e)


def _local_relu2(q: Tensor, k: Tensor, v: Tensor, causal: bool, chunk: int, norm: str) -> Tensor:
    """FLASH's local part: [B, H, T, D] -> [B, H, T, e], one c x c block per chunk.

    float16 inputs are computed in float32 (one cast back): the gradient with respect to the
    row-scaled q is sqrt(c s) (or c) times dq, and in float16 it overflows where dq fits
    (bfloat16 has float32's range)."""
    if q.dtype == torch.float16:
        out = _local_relu2(q.float(), k.float(), v.float(), causal, chunk, norm)
        return to_dtype(out, q.dtype, "flash:efficient (its local part)")
    s = q.shape[-1]
    (qf, qr), (kf, kr), (vf, vr) = _chunks(q, chunk), _chunks(k, chunk), _chunks(v, chunk)
    parts = []
    if qf.shape[2]:
        o = _relu2_block(qf, kf, vf, causal, norm, s)  # (B, H, G, c, e)
        parts.append(o.flatten(2, 3))
    if qr.shape[2]:
        parts.append(_relu2_block(qr, kr, vr, causal, norm, s))  # (B, H, T % c, e)
    return torch.cat(parts, dim=2)


def _local_softmax(q: Tensor, k: Tensor, v: Tensor, causal: bool, chunk: int) -> Tensor:
    """MC-TFM's local part: SDPA on the chunks as a batch of short sequences."""
    B, H, _, D = q.shape
    scale = 1.0 / math.sqrt(D)
    (qf, qr), (kf, kr), (vf, vr) = _chunks(q, chunk), _chunks(k, chunk), _chunks(v, chunk)
    parts = []
    if qf.shape[2]:
        G, c = qf.shape[2], qf.shape[3]
        o = sdpa_any_width(
            (qf * scale).reshape(B, H * G, c, D),
            kf.reshape(B, H * G, c, D),
            vf.reshape(B, H * G, c, vf.shape[-1]),
            causal=causal,
        )  # (B, H*G, c, e)
        parts.append(o.reshape(B, H, G * c, -1))
    if qr.shape[2]:
        parts.append(sdpa_any_width(qr * scale, kr, vr, causal=causal))  # (B, H, T % c, e)
    return torch.cat(parts, dim=2)


def _global_linear(q_lin: Tensor, k_lin: Tensor, v: Tensor, causal: bool, chunk: int) -> Tensor:
    """The global part without a T x T tensor. [B, H, T, D] -> [B, H, T, e]."""
    B, H, T, D = q_lin.shape
    acc = torch.float32 if q_lin.dtype in (torch.float16, torch.bfloat16) else q_lin.dtype
    prod = torch.float32 if q_lin.dtype == torch.float16 else q_lin.dtype  # q_lin . state
    if not causal:
        state = (k_lin.to(acc).transpose(-2, -1) @ v.to(acc)) / T  # (B, H, D, e)
        # For float16 the product in float32 too: its backward sums q_lin^T do over T, which
        # passes float16's range where every gradient it leads to fits.
        return (q_lin.to(prod) @ state.to(prod)).to(q_lin.dtype)  # (B, H, T, e)
    G = -(-T // chunk)  # chunks, the last maybe partial
    if G == 1:
        return q_lin.new_zeros(B, H, T, v.shape[-1])
    c, e = chunk, v.shape[-1]
    done = (G - 1) * c  # tokens of the chunks some later chunk reads: all full
    kc = k_lin[:, :, :done].reshape(B, H, G - 1, c, D).to(acc)
    vc = v[:, :, :done].reshape(B, H, G - 1, c, e).to(acc)
    states = (kc.transpose(-2, -1) @ vc).cumsum(2)  # (B, H, G-1, D, e): chunks 0..g-1, g = 1..G-1
    counts = torch.arange(1, G, dtype=acc, device=q_lin.device) * c  # (G-1,) tokens summed
    states = (states / counts[:, None, None]).to(prod)  # (B, H, G-1, D, e)
    ql = F.pad(q_lin[:, :, c:], (0, 0, 0, G * c - T)).to(prod)  # (B, H, (G-1) c, D): chunks 1..
    out = (ql.reshape(B, H, G - 1, c, D) @ states).to(q_lin.dtype)  # (B, H, G-1, c, e)
    first = q_lin.new_zeros(B, H, c, e)  # chunk 0 sees no earlier chunk
    return torch.cat((first, out.reshape(B, H, (G - 1) * c, e)[:, :, : T - c]), dim=2)


def flash_efficient(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    chunk: int,
    norm: str,
    q_lin: Tensor,
    k_lin: Tensor,
) -> Tensor:
    """Chunked FLASH: O(T c) memory, no T x T tensor. [B, H, T, D] layout."""
    o = _local_relu2(q, k, v, causal, chunk, norm) + _global_linear(q_lin, k_lin, v, causal, chunk)
    return refuse_overflow(o, (q, k, v, q_lin, k_lin), "flash:efficient")


def mc_efficient(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, chunk: int, q_lin: Tensor, k_lin: Tensor
) -> Tensor:
    """Chunked MC-TFM: SDPA per chunk + chunk states. [B, H, T, D] layout."""
    return _local_softmax(q, k, v, causal, chunk) + _global_linear(q_lin, k_lin, v, causal, chunk)


# --------------------------------------------------------------------------------------------
# Fused: Triton kernels for both parts (attnbench/kernels/triton_*.py)
# --------------------------------------------------------------------------------------------


def triton_global_refuses(chunk: int) -> str | None:
    """Why the causal global-part kernel cannot take this chunk (None when it can): the chunk is
    the kernel's tile, so it must be a power of two >= 16."""
    if chunk < 16 or chunk & (chunk - 1):
        return (
            f"the Triton FLASH kernel takes a causal chunk that is a power of two >= 16 "
            f"(got chunk={chunk}); use the efficient path"
        )
    return None


def flash_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    chunk: int,
    norm: str,
    q_lin: Tensor,
    k_lin: Tensor,
) -> Tensor:
    """FLASH on Triton kernels. Local part: the relu² kernel restricted to chunks, row i divided
    by m_i s (or m_i²) with m_i the keys it sees in its chunk, partial last chunk included
    (:func:`attnbench.kernels.triton_ops.gau_relu2` with ``chunk``). Global part, causal: the
    chunkwise kernel over whole earlier chunks only, / (g c); bidirectional: q_lin (k_linᵀ v) / T
    on the fused global linear-attention kernels (identity feature map, no normaliser, scale
    1 / T: :func:`attnbench.kernels.triton_ops.linear_attention_global`; k_linᵀ v summed in
    float32 over T splits from tensor-core dots, the 1 / T fused into the output kernel). q, k,
    q_lin, k_lin ``[B, H, T, s]``, v ``[B, H, T, e]`` -> ``[B, H, T, e]``; any e (v is split
    into slices of at most 128 for the global kernels).
    """
    if causal and (why := triton_global_refuses(chunk)):
        raise AttnbenchError(why)
    local = triton_ops.gau_relu2(q, k, v, causal=causal, norm=norm, chunk=chunk)  # (B, H, T, e)
    if not causal:
        T = q.shape[-2]
        glob = triton_ops.linear_attention_global(q_lin, k_lin, v, scale=1.0 / T)  # (B, H, T, e)
        o = local + glob  # (B, H, T, e)
        return refuse_overflow(o, (q, k, v, q_lin, k_lin), "flash:triton")
    width = triton_ops.MAX_HEAD_DIM
    glob = [
        triton_ops.flash_global_chunked(q_lin, k_lin, v[..., i : i + width], chunk=chunk)
        for i in range(0, v.shape[-1], width)
    ]  # each (B, H, T, <= 128)
    o = local + torch.cat(glob, dim=-1)  # (B, H, T, e)
    return refuse_overflow(o, (q, k, v, q_lin, k_lin), "flash:triton")


# --------------------------------------------------------------------------------------------
# Counts and records
# --------------------------------------------------------------------------------------------


def local_pairs(T: int, chunk: int, causal: bool) -> int:
    """(query, key) pairs of the local part: sum over chunks of m² (m(m+1)/2 when causal)."""
    sizes = [chunk] * (T // chunk) + ([T % chunk] if T % chunk else [])
    return sum(m * (m + 1) // 2 if causal else m * m for m in sizes)


def flops(shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
    """Forward FLOPs, 2 per multiply-add, adds of the state sums counted once each.

    Local: q kᵀ and A v over the local pairs. Global, bidirectional: k_linᵀ v over T tokens and
    q_lin · state for T rows. Causal: k_linᵀ v over the (G-1)·c tokens of every chunk but the
    last, a running sum of G-1 states minus one add each (G-2 adds of D·e), and q_lin · state for
    the T - c rows outside the first chunk. Elementwise work (relu², softmax, the 1/count scaling)
    is not counted, as for softmax attention.
    """
    T, D, E, c = shape.seq_len, shape.head_dim, shape.dv, params["chunk"]
    bh = shape.batch * shape.heads
    local = 2 * local_pairs(T, c, causal) * (D + E)
    G = -(-T // c)
    if not causal:
        glob = 2 * T * D * E + 2 * T * D * E
    elif G == 1:
        glob = 0
    else:
        glob = 2 * (G - 1) * c * D * E + max(G - 2, 0) * D * E + 2 * (T - c) * D * E
    return bh * (local + glob)


def _lin_shape(shape: Shape, params: Mapping[str, Any]) -> tuple[int, ...]:
    return (shape.batch, shape.heads, shape.seq_len, shape.head_dim)


LIN_INPUTS = (
    ExtraInput("q_lin", "queries of the global linear part, [B, H, T, s]", _lin_shape, "input"),
    ExtraInput("k_lin", "keys of the global linear part, [B, H, T, s]", _lin_shape, "input"),
)


def _flash_layer(mech, d_model, heads, **kwargs):
    from attnbench.variants.gau_layers import FlashLayer

    return FlashLayer(mech, d_model, heads, **kwargs)


def _mc_layer(mech, d_model, heads, **kwargs):
    from attnbench.variants.gau_layers import MixedChunkMixer

    return MixedChunkMixer(mech, d_model, heads, **kwargs)


CHUNK = positive_int("chunk", 256, "tokens per chunk c (local part is c x c per chunk)")

FLASH = Mechanism(
    name="flash",
    family="gau",
    description="FLASH mixed chunk attention: relu² inside chunks + linear attention across",
    sources=(sources.HUA_2022, sources.SU_2022_FLASH),
    params=(
        CHUNK,
        Param(
            "norm",
            "ns",
            "local relu2 normaliser: ns = 1/(m s) (Su 2022), n2 = 1/m^2; m = keys in chunk",
            choices=NORMS,
        ),
        positive_int("s", 128, "FLASH layer: width of Z, the q/k head dim (operator: q's)"),
        positive_int("expansion", 2, "FLASH layer: e = expansion * d_model, the width of U and V"),
    ),
    extra_inputs=LIN_INPUTS,
    paths=(
        PathSpec("reference", "reference", flash_reference, memory="O(n^2)"),
        PathSpec(
            "efficient",
            "efficient",
            flash_efficient,
            memory="O(n c + (n/c) s e)",
            note="c x c blocks per chunk + exclusive prefix sum of chunk states",
        ),
        triton_ops.fused_path(
            flash_triton,
            memory="O(n (s + e)) (scores recomputed in the backward, no chunk states stored)",
            note="Triton relu² kernel in chunks + chunkwise global kernel (causal chunk 2^k>=16)",
        ),
    ),
    adapt_shape=lambda shape, params: replace(
        shape, value_dim=params["expansion"] * shape.head_dim
    ),
    flops=flops,
    layer=_flash_layer,
    whole_block=True,
    decode=(FLASH_CHUNK,),
    time="O(n c (s + e) + n s e)",
    memory="O(n c + (n/c) s e)",
    notes="single head in the layer (ignores `heads`); rotary, when given, on all four of q/k.",
)

MC_SOFTMAX = Mechanism(
    name="mc-softmax",
    family="gau",
    description="MC-TFM: softmax attention inside chunks + linear attention across chunks",
    sources=(sources.HUA_2022, sources.SU_2022_FLASH),
    params=(CHUNK,),
    extra_inputs=LIN_INPUTS,
    paths=(
        PathSpec("reference", "reference", mc_reference, memory="O(n^2)"),
        PathSpec(
            "efficient",
            "efficient",
            mc_efficient,
            memory="O(n d + (n/c) d^2) (SDPA flash kernel per chunk)",
            note="SDPA on the chunks as a batch + exclusive prefix sum of chunk states",
        ),
    ),
    flops=flops,
    layer=_mc_layer,
    decode=(MC_CHUNK,),
    time="O(n c d + n d^2)",
    memory="O(n d + (n/c) d^2)",
    notes="multi-head; the layer projects q, k, v, q_lin, k_lin and adds the two parts.",
)
