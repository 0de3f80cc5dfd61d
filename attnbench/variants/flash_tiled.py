"""FlashAttention's algorithm in plain PyTorch (Dao et al., 2022).

Exact softmax attention computed over K/V tiles with an online softmax: a running row maximum m and
a running sum l rescale the partial output whenever a tile raises the maximum. The backward pass
recomputes each tile's probabilities from the saved log-sum-exp (lse = m + log l) instead of
storing the n x n matrix, so activation memory is O(n * tile), not O(n^2).

All queries are processed together against one K/V tile at a time, which keeps the Python loop to
n / tile iterations. When causal, the queries before a tile's first key are skipped (they cannot
see it), so roughly half the work is done.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbench.core import sources
from attnbench.core.spec import Mechanism, PathSpec, positive_int
from attnbench.variants.softmax import reference as softmax_reference
from attnbench.variants.softmax_decode import TILED


def _tile_scores(q: Tensor, k_tile: Tensor, q0: int, k0: int, causal: bool, scale: float) -> Tensor:
    """Scores of queries q0.. against one key tile starting at k0, masked when causal.

    q ``[B, H, Tq', D]`` (queries q0..), k_tile ``[B, H, Tk', D]`` -> ``[B, H, Tq', Tk']``.
    """
    s = (q @ k_tile.transpose(-2, -1)) * scale  # (B, H, Tq', Tk')
    if causal:
        # Only the first Tk' query rows can meet a key to their right: mask that square alone.
        rows = min(s.shape[-2], k_tile.shape[-2])
        qi = torch.arange(q0, q0 + rows, device=q.device)[:, None]
        kj = torch.arange(k0, k0 + k_tile.shape[-2], device=q.device)[None, :]
        s[..., :rows, :] = s[..., :rows, :].masked_fill(kj > qi, float("-inf"))
    return s


def _first_query(k0: int, causal: bool) -> int:
    """The first query that can see a key tile starting at k0."""
    return k0 if causal else 0


class _FlashTiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, causal: bool, tile: int) -> Tensor:
        B, H, T, D = q.shape
        scale = 1.0 / math.sqrt(D)
        m = torch.full((B, H, T, 1), float("-inf"), dtype=q.dtype, device=q.device)  # running max
        l = torch.zeros((B, H, T, 1), dtype=q.dtype, device=q.device)  # running sum  # noqa: E741
        acc = torch.zeros((B, H, T, v.shape[-1]), dtype=q.dtype, device=q.device)  # running P V
        for k0 in range(0, k.shape[-2], tile):
            q0 = _first_query(k0, causal)
            kt, vt = k[:, :, k0 : k0 + tile], v[:, :, k0 : k0 + tile]  # (B, H, tile, D)
            s = _tile_scores(q[:, :, q0:], kt, q0, k0, causal, scale)  # (B, H, T-q0, tile)
            m_old = m[:, :, q0:]
            m_new = torch.maximum(m_old, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)  # (B, H, T-q0, tile)
            correction = torch.exp(m_old - m_new)  # 0 on the first tile (m_old = -inf)
            l[:, :, q0:] = l[:, :, q0:] * correction + p.sum(-1, keepdim=True)
            acc[:, :, q0:] = acc[:, :, q0:] * correction + p @ vt
            m[:, :, q0:] = m_new
        o = acc / l  # (B, H, T, Dv)
        lse = m + torch.log(l)  # (B, H, T, 1)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.tile = causal, tile
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        causal, tile = ctx.causal, ctx.tile
        scale = 1.0 / math.sqrt(q.shape[-1])
        delta = (do * o).sum(-1, keepdim=True)  # (B, H, T, 1) = rowsum(dP * P)
        dq = torch.zeros_like(q)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        for k0 in range(0, k.shape[-2], tile):
            q0 = _first_query(k0, causal)
            kt, vt = k[:, :, k0 : k0 + tile], v[:, :, k0 : k0 + tile]
            qs, dos = q[:, :, q0:], do[:, :, q0:]
            p = torch.exp(_tile_scores(qs, kt, q0, k0, causal, scale) - lse[:, :, q0:])
            dv[:, :, k0 : k0 + tile] = p.transpose(-2, -1) @ dos  # (B, H, tile, Dv)
            dp = dos @ vt.transpose(-2, -1)  # (B, H, T-q0, tile)
            ds = p * (dp - delta[:, :, q0:]) * scale
            dq[:, :, q0:] += ds @ kt
            dk[:, :, k0 : k0 + tile] = ds.transpose(-2, -1) @ qs
        return dq, dk, dv, None, None


def tiled(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, tile: int) -> Tensor:
    """Online-softmax attention over K/V tiles of ``tile`` keys. q, k, v: [B, H, T, D]."""
    return _FlashTiled.apply(q, k, v, causal, tile)


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """The dense softmax attention flash-tiled must equal. q, k, v: [B, H, T, D]."""
    return softmax_reference(q, k, v, causal=causal)


MECHANISM = Mechanism(
    name="flash-tiled",
    family="softmax",
    description="FlashAttention's tiled online softmax with recomputing backward, in PyTorch",
    sources=(sources.DAO_2022,),
    params=(positive_int("tile", 256, "keys per tile (memory grows like n * tile)"),),
    paths=(
        PathSpec("reference", "reference", reference, memory="O(n^2)"),
        PathSpec(
            "efficient",
            "efficient",
            tiled,
            memory="O(n * tile)",
            note="custom autograd Function; backward recomputes from the saved log-sum-exp",
        ),
    ),
    decode=(TILED,),
    time="O(n^2 d)",
    memory="O(n * tile)",
)
