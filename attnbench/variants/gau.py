"""GAU's attention core (Hua et al. 2022, "Transformer Quality in Linear Time"; Su 2022).

q ``[B, H, T, s]``, k ``[B, H, T, s]``, v ``[B, H, T, e]`` -> o ``[B, H, T, e]``. The GAU layer uses
one head (H = 1) with s = 128 and e = 2d; the operator works for any H and any value width.

``scoring`` picks the attention matrix A (o = A v):

* ``relu2`` (default): A = relu²(Q Kᵀ) · w_i, no softmax. The row weight w_i is set by ``norm``:
  ``ns`` (default) w_i = 1/(n_i s), i.e. relu²(Q Kᵀ/√s)/n, Su 2022's form; ``n2`` w_i = 1/n_i², the
  paper's appendix code (relu²(Q Kᵀ/n)). n_i is the number of keys row i really sees: T when
  bidirectional, i + 1 when causal (lucidrains divides causal rows by the full T too; the count of
  the terms summed is the consistent choice).
* ``softmax``: softmax(Q Kᵀ/√s) — GAU with ordinary softmax scores.
* ``softmax_plus``: softmax(log_512(max(n_i, min_n)) · Q Kᵀ/√s), the entropy-invariant scale of
  Su 2021 as its author uses it in GAU (bert4keras ``softmax_plus`` takes min_n = 16).

``norm`` only affects ``relu2``; ``min_n`` only ``softmax_plus``. s is q's head dim; the ``s`` and
``expansion`` parameters size the GAU layer (and the benchmark's value width), not the operator.

Paths: ``reference`` builds the [B, H, T, T] matrix literally. ``efficient``: for relu2, a custom
autograd Function over query tiles whose backward recomputes each tile (relu² has no normaliser to
track, so nothing but q, k, v is saved: O(T · tile) memory); the row weight is folded into q as
√w_i (relu²(x)·w = relu²(x·√w) for w > 0), which also keeps relu² far from the fp16 overflow at
65504 (see ``overflow_bound``). For the softmax scorings: SDPA with the row scale folded into q;
when the value width differs from s, q and k are zero-padded to it (dot products unchanged), since
the CPU flash kernel needs equal widths and otherwise falls back to an n x n kernel. ``triton``
(fused, CUDA): the Triton relu² kernels of :mod:`attnbench.kernels.triton_gau`, forward and
backward, scoring=relu2 only (the softmax scorings are refused with a pointer to ``efficient``).
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
from attnbench.core.precision import float32_sums, refuse_overflow
from attnbench.core.spec import Mechanism, Param, PathSpec, Shape, positive_int
from attnbench.kernels.triton_ops import gau_path
from attnbench.variants.dense import causal_mask, keys_seen, softmax_attention
from attnbench.variants.gau_decode import GAU_CACHE

SCORINGS = ("relu2", "softmax", "softmax_plus")
NORMS = ("ns", "n2")
#: Base of the entropy-invariant log (Su 2021): n = 512 gives back 1/sqrt(s).
LOG_BASE = 512.0
#: Largest finite float16: relu²(x) overflows once x > sqrt(65504) ~ 255.9.
FP16_MAX = 65504.0


# --------------------------------------------------------------------------------------------
# Reference: the literal n x n formula
# --------------------------------------------------------------------------------------------


@float32_sums
def reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    scoring: str,
    norm: str,
    min_n: int,
) -> Tensor:
    """Dense A = score(Q Kᵀ), then A v. q, k ``[B, H, T, s]``, v ``[B, H, T, e]`` -> o, same.
    Half inputs are computed in float32: relu²(q·k) itself passes float16's 65504 once |q·k| >
    255.9, long before the weighted output does; an output beyond float16's range is refused."""
    T, D = q.shape[-2], q.shape[-1]
    mask = causal_mask(T, T, q.device)
    if not causal:
        mask = torch.ones_like(mask)
    n = mask.sum(-1, keepdim=True).to(torch.float64)  # (T, 1) keys each row sees
    if scoring == "relu2":
        weight = 1.0 / (n * D) if norm == "ns" else 1.0 / n**2  # (T, 1)
        a = torch.relu(q @ k.transpose(-2, -1)) ** 2  # (B, H, T, T)
        a = torch.where(mask, a, torch.zeros((), dtype=a.dtype)) * weight.to(a.dtype)
        return a @ v  # (B, H, T, e)
    if scoring == "softmax":
        return softmax_attention(q, k, v, mask=mask if causal else None)
    factor = torch.log(n.clamp(min=min_n)) / math.log(LOG_BASE) / math.sqrt(D)  # (T, 1)
    return softmax_attention(q, k, v, mask=mask if causal else None, scale=factor.to(q.dtype))


# --------------------------------------------------------------------------------------------
# Efficient: tiled relu² with a recomputing backward; SDPA for the softmax scorings
# --------------------------------------------------------------------------------------------


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulate tile sums in float32 for half types (bf16 keeps 8 bits of mantissa)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _Relu2Tiled(torch.autograd.Function):
    """o_i = sum_j relu(w_i q_i . k_j)^2 v_j over query tiles, w_i = ``root_w[i]`` the square root
    of row i's weight.

    The row weight is applied inside, not folded into q before the call: the gradient with
    respect to the scaled q is 1 / w_i (sqrt(n s), or n) times larger than dq, and in float16 that
    intermediate overflows where dq itself fits by a wide margin. The backward computes the score
    gradients in float32 for float16 inputs and scales by w_i before the one cast to q's dtype."""

    @staticmethod
    def forward(ctx, q: Tensor, root_w: Tensor, k: Tensor, v: Tensor, causal: bool,
                tile: int) -> Tensor:  # fmt: skip
        B, H, T, _ = q.shape
        w = root_w.to(q.dtype)  # (T, 1)
        o = q.new_empty(B, H, T, v.shape[-1])
        for i0 in range(0, T, tile):
            i1 = min(i0 + tile, T)
            end = i1 if causal else k.shape[-2]  # keys this tile can see
            qt = q[:, :, i0:i1] * w[i0:i1]  # (B, H, t, s)
            r = torch.relu_(qt @ k[:, :, :end].transpose(-2, -1))  # (B, H, t, end)
            if causal:
                r[..., i0:end].masked_fill_(_upper(i1 - i0, q.device), 0.0)
            o[:, :, i0:i1] = r.square_() @ v[:, :, :end]  # (B, H, t, e)
        ctx.save_for_backward(q, root_w, k, v)
        ctx.causal, ctx.tile = causal, tile
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        q, root_w, k, v = ctx.saved_tensors
        causal, tile = ctx.causal, ctx.tile
        T = q.shape[-2]
        acc = _acc_dtype(q.dtype)  # the sums over tiles
        # The per-tile products: float32 for float16, whose range the scaled-q gradient passes;
        # bfloat16 has float32's range and keeps its own arithmetic.
        work = torch.float32 if q.dtype == torch.float16 else q.dtype
        w = root_w.to(q.dtype)  # (T, 1), rounded as the forward used it
        w_work = w.to(work)
        kw, vw = k.to(work), v.to(work)  # once, not per tile
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        for i0 in range(0, T, tile):
            i1 = min(i0 + tile, T)
            end = i1 if causal else k.shape[-2]
            qt = (q[:, :, i0:i1] * w[i0:i1]).to(work)  # the forward's scaled q, exactly
            dot = do[:, :, i0:i1].to(work)
            kt, vt = kw[:, :, :end], vw[:, :, :end]
            r = torch.relu_(qt @ kt.transpose(-2, -1))  # (B, H, t, end)
            if causal:
                r[..., i0:end].masked_fill_(_upper(i1 - i0, q.device), 0.0)
            dv[:, :, :end] += (r.square().transpose(-2, -1) @ dot).to(acc)  # (B, H, end, e)
            ds = (dot @ vt.transpose(-2, -1)).mul_(r).mul_(2.0)  # (B, H, t, end) dP * 2 relu
            dq[:, :, i0:i1] = ((ds @ kt) * w_work[i0:i1]).to(q.dtype)  # (B, H, t, s)
            dk[:, :, :end] += (ds.transpose(-2, -1) @ qt).to(acc)  # (B, H, end, s)
        return dq, None, dk.to(k.dtype), dv.to(v.dtype), None, None


def _upper(t: int, device) -> Tensor:
    """Boolean [t, t], True strictly above the diagonal (keys after the query, inside a tile)."""
    return torch.ones(t, t, dtype=torch.bool, device=device).triu(1)


def sdpa_any_width(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """SDPA with scale 1 for any value width: the narrower of (q, k) and v is zero-padded so the
    CPU flash kernel applies (zero columns change no dot product). [B, H, T, D] layout."""
    D, Dv = q.shape[-1], v.shape[-1]
    if Dv > D:
        q, k = F.pad(q, (0, Dv - D)), F.pad(k, (0, Dv - D))  # (B, H, T, Dv)
    elif Dv < D:
        v = F.pad(v, (0, D - Dv))  # (B, H, T, D)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0)
    return o[..., :Dv]  # (B, H, T, Dv)


def efficient(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    scoring: str,
    norm: str,
    min_n: int,
    tile: int,
) -> Tensor:
    """No n x n tensor: tiled relu², or SDPA. q, k ``[B, H, T, s]``, v ``[B, H, T, e]``."""
    T, D = q.shape[-2], q.shape[-1]
    n = keys_seen(T, T, causal, q.device)  # (T, 1)
    if scoring == "relu2":
        root_w = (n * D).rsqrt() if norm == "ns" else 1.0 / n  # (T, 1) sqrt of the row weight
        o = _Relu2Tiled.apply(q, root_w, k, v, causal, tile)
        return refuse_overflow(o, (q, k, v), "gau:efficient")
    if scoring == "softmax":
        row = torch.full_like(n, 1.0 / math.sqrt(D))  # (T, 1)
    else:
        row = n.clamp(min=min_n).log() / math.log(LOG_BASE) / math.sqrt(D)  # (T, 1)
    return sdpa_any_width(q * row.to(q.dtype), k, v, causal=causal)


# --------------------------------------------------------------------------------------------
# Fused: the Triton relu² kernels (attnbench/kernels/triton_gau.py)
# --------------------------------------------------------------------------------------------


def triton_refuses(params: Mapping[str, Any]) -> str | None:
    """Why the Triton relu² kernel does not compute these params (None when it does)."""
    if params["scoring"] != "relu2":
        return (
            f"scoring={params['scoring']}: the kernel computes relu2 only; "
            "the efficient path runs the softmax scorings on SDPA's fused kernels"
        )
    return None


#: relu²(Q Kᵀ) · w_i with w_i = 1/(n_i s) (``ns``) or 1/n_i² (``n2``), n_i = T or i + 1, s = q's
#: head dim: exactly :func:`reference` for scoring=relu2 (``tile`` does not apply: the kernel
#: has its own tiles).
TRITON = gau_path(norm=lambda params: params["norm"], refuse=triton_refuses)


# --------------------------------------------------------------------------------------------
# Numerics, FLOPs, the record
# --------------------------------------------------------------------------------------------


def overflow_bound(n: int, s: int, norm: str = "ns") -> float:
    """The largest |q_i . k_j| for which the efficient relu2 path stays finite in float16.

    The efficient path computes relu(x · sqrt(w))² with w = 1/(n s) or 1/n², so one term
    overflows only when x² w > 65504; a row sum of n such terms times |v| <= 1 stays finite while
    x² w < 65504 / n. The literal form relu²(x) (the reference, any code that normalises after
    squaring) overflows as soon as |x| > 255.9, whatever n is.
    """
    w = 1.0 / (n * s) if norm == "ns" else 1.0 / n**2
    return math.sqrt(FP16_MAX / (n * w))


def flops(shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
    """Forward FLOPs: Q Kᵀ and A V over the attended pairs (2 per multiply-add).

    Elementwise work (relu², the softmax) is not counted, as for softmax attention.
    """
    T = shape.seq_len
    pairs = T * (T + 1) // 2 if causal else T * T
    return 2 * shape.batch * shape.heads * pairs * (shape.head_dim + shape.dv)


def value_shape(shape: Shape, params: Mapping[str, Any]) -> Shape:
    """GAU's value width is e = expansion · d; the benchmark shape takes d = head dim (s)."""
    return replace(shape, value_dim=params["expansion"] * shape.head_dim)


def _gau_layer(mech, d_model, heads, **kwargs):
    from attnbench.variants.gau_layers import GAULayer

    return GAULayer(mech, d_model, heads, **kwargs)


PARAMS = (
    Param(
        "scoring",
        "relu2",
        "attention scores: relu2 (GAU), softmax, softmax_plus (log_512 n scaled softmax)",
        choices=SCORINGS,
    ),
    Param(
        "norm",
        "ns",
        "relu2 row normaliser: ns = 1/(n s) (Su 2022), n2 = 1/n^2 (the paper's code)",
        choices=NORMS,
    ),
    positive_int("min_n", 1, "softmax_plus: floor on n before the log (bert4keras: 16)"),
    positive_int("tile", 256, "efficient relu2 path: query rows per tile (memory ~ n * tile)"),
    positive_int("s", 128, "GAU layer: width of Z, the q/k head dim (the operator reads q's)"),
    positive_int("expansion", 2, "GAU layer: e = expansion * d_model, the width of U and V"),
)


MECHANISM = Mechanism(
    name="gau",
    family="gau",
    description="gated attention unit core: relu²(QKᵀ)/(n s) V, single head (FLASH-Quad's layer)",
    sources=(sources.HUA_2022, sources.SU_2022_FLASH),
    aliases=("flash-quad",),
    params=PARAMS,
    paths=(
        PathSpec("reference", "reference", reference, memory="O(n^2)"),
        PathSpec(
            "efficient",
            "efficient",
            efficient,
            memory="O(n * tile) relu2; O(n) softmax (SDPA flash kernel)",
            note="relu2: query-tiled autograd Function recomputing in backward; softmax: SDPA",
        ),
        TRITON,
    ),
    adapt_shape=value_shape,
    flops=flops,
    layer=_gau_layer,
    whole_block=True,
    decode=(GAU_CACHE,),
    time="O(n^2 (s + e))",
    memory="O(n * tile)",
    notes=(
        "FLASH-Quad is a stack of GAU layers with no FFN (two GAU layers ~ one attention + FFN "
        "block in parameters at e = 2d); the layer is single-head and ignores `heads`."
    ),
)
