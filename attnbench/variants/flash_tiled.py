"""FlashAttention's algorithm in plain PyTorch (Dao et al., 2022).

Exact softmax attention computed over K/V tiles with an online softmax: a running row maximum m and
a running sum l rescale the partial output whenever a tile raises the maximum. They and the output
accumulator are float32 for half inputs, as in FlashAttention. The backward pass recomputes each
tile's probabilities instead of storing the n x n matrix, so activation memory is O(n * tile), not
O(n^2).

The backward differs from FlashAttention's in two places, both for large scores (issue 64, where
they cost 14x and 393x the dense softmax's error at scores of 6e4): it recomputes P = exp(s - m) / l
from the saved maximum and sum, not exp(s - lse) (lse's rounding is a relative error of eps * |s|
in every probability), and it sums delta_i = sum_j P_ij dP_ij in a first pass over the tiles
instead of taking rowsum(dO * O) (see :meth:`_FlashTiled.backward`). The first pass costs two
more tile products per tile (seven instead of five).

All queries are processed together against one K/V tile at a time, which keeps the Python loop to
n / tile iterations. When causal, the queries before a tile's first key are skipped (they cannot
see it), so roughly half the work is done.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbench.core import sources
from attnbench.core.precision import HALF
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


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the running statistics and sums: float32 for half inputs (FlashAttention keeps
    its row maximum, row sum and output accumulator in float32 whatever the input dtype)."""
    return torch.float32 if dtype in HALF else dtype


class _FlashTiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, causal: bool, tile: int) -> Tensor:
        B, H, T, D = q.shape
        scale = 1.0 / math.sqrt(D)
        work = _work_dtype(q.dtype)
        qw = q.to(work)  # half products are exact in float32: a float32-accumulating product
        m = torch.full((B, H, T, 1), float("-inf"), dtype=work, device=q.device)  # running max
        l = torch.zeros((B, H, T, 1), dtype=work, device=q.device)  # running sum  # noqa: E741
        acc = torch.zeros((B, H, T, v.shape[-1]), dtype=work, device=q.device)  # running P V
        for k0 in range(0, k.shape[-2], tile):
            q0 = _first_query(k0, causal)
            kt, vt = k[:, :, k0 : k0 + tile].to(work), v[:, :, k0 : k0 + tile].to(work)
            s = _tile_scores(qw[:, :, q0:], kt, q0, k0, causal, scale)  # (B, H, T-q0, tile)
            m_old = m[:, :, q0:]
            m_new = torch.maximum(m_old, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)  # (B, H, T-q0, tile)
            correction = torch.exp(m_old - m_new)  # 0 on the first tile (m_old = -inf)
            l[:, :, q0:] = l[:, :, q0:] * correction + p.sum(-1, keepdim=True)
            acc[:, :, q0:] = acc[:, :, q0:] * correction + p @ vt
            m[:, :, q0:] = m_new
        o = acc / l  # (B, H, T, Dv)
        ctx.save_for_backward(q, k, v, o, m, l)
        ctx.causal, ctx.tile = causal, tile
        return o.to(q.dtype)

    @staticmethod
    def backward(ctx, do: Tensor):
        q, k, v, o, m, l = ctx.saved_tensors  # noqa: E741
        causal, tile = ctx.causal, ctx.tile
        qw, dow = q.to(o.dtype), do.to(o.dtype)
        scale = 1.0 / math.sqrt(q.shape[-1])

        def recompute(k0: int) -> tuple[int, Tensor, Tensor, Tensor]:
            """Key tile k0's first query, keys (work dtype), probabilities and dP = dO V^T. The
            scores are the forward's own (the same product of the same tiles), so P = exp(s - m)
            / l with the forward's maximum and sum keeps the probabilities' relative error at any
            score, where exp(s - lse) loses |s| * eps of it to the rounding of lse."""
            q0 = _first_query(k0, causal)
            kt, vt = k[:, :, k0 : k0 + tile].to(o.dtype), v[:, :, k0 : k0 + tile].to(o.dtype)
            s = _tile_scores(qw[:, :, q0:], kt, q0, k0, causal, scale)  # (B, H, T-q0, tile)
            p = torch.exp(s - m[:, :, q0:]) / l[:, :, q0:]
            return q0, kt, p, dow[:, :, q0:] @ vt.transpose(-2, -1)

        # First pass: delta_i = sum_j P_ij dP_ij, from the very dP the second pass subtracts it
        # from. FlashAttention's rowsum(dO * O) is the same sum in exact arithmetic, but at a
        # saturated row (P one-hot) dS = P (dP - delta) is then the rounding difference of two
        # sums of the same products, which |q| or |k| multiply into dK and dQ: at scores of 1e4
        # 100-400x the dense softmax's error, which subtracts the same dP and gets dS = 0.
        delta = torch.zeros_like(m)  # (B, H, T, 1)
        for k0 in range(0, k.shape[-2], tile):
            q0, _, p, dp = recompute(k0)
            delta[:, :, q0:] += (p * dp).sum(-1, keepdim=True)
        dq = torch.zeros_like(qw)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        for k0 in range(0, k.shape[-2], tile):
            q0, kt, p, dp = recompute(k0)
            dv[:, :, k0 : k0 + tile] = p.transpose(-2, -1) @ dow[:, :, q0:]  # (B, H, tile, Dv)
            ds = p * (dp - delta[:, :, q0:]) * scale  # (B, H, T-q0, tile)
            dq[:, :, q0:] += ds @ kt
            dk[:, :, k0 : k0 + tile] = ds.transpose(-2, -1) @ qw[:, :, q0:]
        return dq.to(q.dtype), dk, dv, None, None


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
            note="custom autograd Function; backward recomputes from the saved row max and sum",
        ),
    ),
    decode=(TILED,),
    time="O(n^2 d)",
    memory="O(n * tile)",
)
