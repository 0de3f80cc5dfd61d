"""The sparse engine's parts on the CPU through PyTorch's fused flash-attention kernel.

:mod:`attnbench.variants.sparse.engine` arranges each part's queries and keys into ``G`` groups
(``[B, H, G, M, C]``); every group is a small dense attention problem with a static mask. The CPU
build of PyTorch has a fused kernel for exactly that, ``aten::_scaled_dot_product_flash_attention
_for_cpu``: scores, mask, online softmax and the value product tile by tile in cache, returning
the output and its log-sum-exp. Here every part is one call of it, with the part's groups as its
"heads" (``[B * H, G, M, C]``: queries of group g against keys of group g) and the part's mask as
one additive ``[1, G, Mq, Mk]`` tensor (0 or -inf) broadcast over batch and heads. A band's keys
are the same overlapping strided view the chunked path reads (the kernel takes any strides with
a contiguous last dimension), so nothing is gathered for a band.

Parts are merged by their log-sum-exps, weighted relative to each row's largest and renormalised
by the weights' sum (as the chunked path merges them). The backward uses the identity
FlashAttention's split-KV backward rests on: with the merged output O and merged log-sum-exp L of
a row, each part's share of the gradient is the kernel's own backward called with
O and L in place of the part's own output and log-sum-exp (it then sees P = exp(s - L), the merged
softmax restricted to the part's keys, and delta = rowsum(dO * O), the merged one), so the parts'
gradients add up to the exact gradient of the merged softmax, and no gradient has to flow through
a log-sum-exp. For half inputs the backward runs the kernel in float32 and rounds each gradient
once. Its probabilities exp(s - L) lose eps * |L| of their relative error to the float32 L: at
scores beyond about 50 its gradients leave the tolerance rule for a stated range (docs/
correctness.md, "At large scores"), as PyTorch's SDPA backward does.

The kernel outputs zeros, and a log-sum-exp of 0, for a row whose keys are all masked; such rows
are known from the mask and get -inf here. Masks are built once per pattern and length (the
``key`` of :func:`attend`) and kept in a small cache.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnbench.variants.sparse import engine
from attnbench.variants.sparse.engine import NEG_INF, Band, Dilated, Full, Layout, Part, Rule

_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

#: dtypes the CPU flash kernel takes.
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
HALF = (torch.bfloat16, torch.float16)
#: Prepared masks kept (each O(n * keys per query)); least recently used dropped first.
CACHE_SIZE = 8
_CACHE: OrderedDict[Hashable, list[_Prepared]] = OrderedDict()


def supports(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """True where the fused kernel can run these inputs: CPU, a dtype it takes, one head dim for
    queries, keys and values."""
    return (
        q.device.type == "cpu"
        and q.dtype in DTYPES
        and q.dtype == k.dtype == v.dtype
        and q.shape[-1] == k.shape[-1] == v.shape[-1]
    )


@dataclass(frozen=True, eq=False)
class _Prepared:
    """One part, ready for the kernel: its layouts, its additive mask ``[1, G, Mq, Mk]`` (None
    when every slot pair is attended) and which query slots have at least one key ``[G, Mq]``."""

    part: Part
    mask: Tensor | None
    has_keys: Tensor


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the backward runs the kernel in, and of the masks: float32 for half inputs (the
    kernel takes a float32 mask with half operands too), else the input's."""
    return torch.float32 if dtype in HALF else dtype


def _prepare(parts: Sequence[Part], rule: Rule, like: Tensor) -> list[_Prepared]:
    out = []
    for part in parts:
        qpos = part.queries.positions(like.device)  # (G, Mq)
        kpos = _key_positions(part, like.device)  # (G, Mk)
        blocked = engine.part_mask(qpos, kpos, rule, part.keep)  # (G, Mq, Mk)
        has_keys = ~blocked.all(-1)  # (G, Mq)
        mask = None
        if bool(blocked.any()):
            mask = torch.zeros(blocked.shape, dtype=_work_dtype(like.dtype), device=like.device)
            mask = mask.masked_fill_(blocked, NEG_INF).unsqueeze(0)  # (1, G, Mq, Mk)
        out.append(_Prepared(part, mask, has_keys))
    return out


def _prepared(
    key: Hashable | None, parts: Sequence[Part], rule: Rule, n: int, like: Tensor
) -> list[_Prepared]:
    if key is None:
        return _prepare(parts, rule, like)
    full_key = (key, n, like.device, like.dtype)
    found = _CACHE.get(full_key)
    if found is None:
        found = _prepare(parts, rule, like)
        _CACHE[full_key] = found
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(full_key)
    return found


def _key_positions(part: Part, device: torch.device) -> Tensor:
    keys = part.keys
    if isinstance(keys, Band) and part.queries != engine.Blocks(keys.n, keys.b):
        raise ValueError("a Band part needs Blocks queries of the same block size")
    return keys.positions(device)


# --------------------------------------------------------------------------------------------
# Layouts as the kernel's [B * H, G, M, C] operands, and their gradients back
# --------------------------------------------------------------------------------------------


def _grouped(x: Tensor, layout: Layout) -> Tensor:
    """``[B, H, n, C]`` -> ``[B * H, G, M, C]`` (a view where the layout allows)."""
    if isinstance(layout, Band):
        return _band_view(x, layout)
    g = layout.gather(x)  # (B, H, G, M, C)
    return g.flatten(0, 1)


def _band_view(x: Tensor, band: Band) -> Tensor:
    """The band's keys of every query block: ``[B * H, G, W * b, C]``, overlapping windows of
    ``x`` padded by ``lo`` blocks in front (padding slots are masked)."""
    B, H, n, C = x.shape
    b, G, W, lo = band.b, band.groups, band.width, band.lo
    total = (G + W - 1) * b
    padded = engine.pad_positions(x, lo * b, total - lo * b - n).reshape(B * H, total, C)
    return padded.unfold(1, W * b, b).transpose(-1, -2)[:, :G]  # (B*H, G, W*b, C), a view


def _queries_back(dx: Tensor, layout: Layout, shape: torch.Size) -> Tensor:
    """Inverse of :func:`_grouped` for a query layout (each position at most once)."""
    B, H = shape[0], shape[1]
    G, M, C = dx.shape[1:]
    return layout.place(dx.view(B, H, G, M, C), 0.0)


def _keys_back(dx: Tensor, layout: Layout, shape: torch.Size) -> Tensor:
    """The gradient of ``[B, H, n, C]`` from that of its ``[B * H, G, M, C]`` key operand: a
    position that sits in several slots gets their sum."""
    B, H, n, C = shape
    if isinstance(layout, Band):
        return _band_back(dx, layout, shape)
    if isinstance(layout, (Dilated, Full, engine.Residue)):  # each position at most once
        return _queries_back(dx, layout, shape)
    pos = layout.positions(dx.device).flatten()  # (G * M,), -1 for padding
    index = torch.where(pos >= 0, pos, n)
    out = dx.new_zeros(B * H, n + 1, C)
    out.index_add_(1, index, dx.reshape(B * H, -1, C))
    return out[:, :n].view(B, H, n, C)


def _band_back(dx: Tensor, band: Band, shape: torch.Size) -> Tensor:
    """:func:`_keys_back` of a band: slot u of window w of query block g is padded key
    (g + w) * b + u, so the windows' gradients fold onto ``G + W - 1`` blocks. The kernel returns
    key gradients stored as ``[B * H, M, G, C]`` (its own layout, transposed to the operand's
    shape); the fold reads them in that order, W adds of contiguous ``[G, C]`` rows."""
    B, H, n, C = shape
    b, G, W, lo = band.b, band.groups, band.width, band.lo
    stored = dx.transpose(1, 2).contiguous()  # (B*H, W*b, G, C); no copy in the kernel's layout
    windows = stored.view(B * H, W, b, G, C)
    folded = dx.new_zeros(B * H, b, G + W - 1, C)
    for w in range(W):
        folded[:, :, w : w + G] += windows[:, w]
    blocks = folded.transpose(1, 2).reshape(B, H, (G + W - 1) * b, C)
    return blocks[:, :, lo * b : lo * b + n]


# --------------------------------------------------------------------------------------------
# Forward, merge, backward
# --------------------------------------------------------------------------------------------


def _part_forward(q, k, v, prep: _Prepared, scale: float) -> tuple[Tensor, Tensor]:
    """One part: its output ``[B, H, n, C]`` (zeros where it holds no key for a query) and its
    log-sum-exp ``[B, H, n]`` (the kernel's: float64 for float64 inputs, else float32; -inf
    there)."""
    part = prep.part
    q4, k4, v4 = _grouped(q, part.queries), _grouped(k, part.keys), _grouped(v, part.keys)
    o4, lse4 = _FORWARD(q4, k4, v4, attn_mask=prep.mask, scale=scale)
    lse4 = lse4.masked_fill(~prep.has_keys, NEG_INF)  # (B*H, G, Mq)
    B, H = q.shape[:2]
    G, M = lse4.shape[1:]
    o = part.queries.place(o4.view(B, H, G, M, -1), 0.0)
    lse = part.queries.place(lse4.view(B, H, G, M, 1), NEG_INF).squeeze(-1)
    return o, lse


def _merge(results: Sequence[tuple[Tensor, Tensor]], dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """One softmax over the union of the parts' keys: the output (``dtype``) and its
    log-sum-exp (the parts' precision, -inf on rows with no key anywhere; their output is 0).

    The parts' weights are taken relative to the largest log-sum-exp of the row, w_p =
    exp(lse_p - max), and the weighted sum is divided by their sum: a convex combination, as the
    online softmax renormalises by its running maximum. Weighting by exp(lse_p - L) with the
    merged L instead does not renormalise: L is rounded at the scale of the scores (one ulp of
    1e4 in float32 is 1e-3), and that rounding scaled every output (issue 64: 2e-4 errors at
    scores of 1e4 where a naive float32 softmax errs by 3e-8)."""
    if len(results) == 1:
        return results[0]
    lses = torch.stack([lse for _, lse in results])  # (P, B, H, n)
    top = lses.amax(0)  # (B, H, n); -inf where every part is empty
    top = torch.where(torch.isfinite(top), top, 0.0)
    weights = torch.exp(lses - top)  # (P, B, H, n): the largest is 1 on rows with a key
    total = weights.sum(0)  # (B, H, n): >= 1 on rows with a key, 0 on rows without
    out = None
    for w, (o, _) in zip(weights, results, strict=True):
        term = w.unsqueeze(-1) * o.to(w.dtype)
        out = term if out is None else out.add_(term)
    out = out.div_(torch.where(total > 0, total, 1.0).unsqueeze(-1))
    return out.to(dtype), top + torch.log(total)  # log 0 = -inf on rows without a key


class _FusedParts(torch.autograd.Function):
    """Softmax attention over the union of prepared parts, on the CPU flash kernel."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, prepared: list[_Prepared], scale: float):
        results = [_part_forward(q, k, v, prep, scale) for prep in prepared]
        out, lse = _merge(results, q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.prepared, ctx.scale = prepared, scale
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor | None):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            return None, None, None, None, None
        # Rows with no key at all: L = +inf makes every probability exp(s - L) zero.
        lse = torch.where(torch.isfinite(lse), lse, math.inf)
        grads: list[Tensor | None] = [None, None, None]
        # Half inputs: the kernel runs in float32 here, so that every gradient is rounded to the
        # input's dtype once, after the parts' shares of a key's gradient are added up (in half
        # precision each share was rounded, then each sum: 2-5x a naive computation's error,
        # e.g. BigBird's dv at an upstream gradient of 1e-6 in float16).
        dtype, work = q.dtype, _work_dtype(q.dtype)
        q, k, v, out = (x.to(work) for x in (q, k, v, out))
        dout = dout.to(work).contiguous()
        for prep in ctx.prepared:
            part = prep.part
            qs = part.queries
            q4, k4, v4 = _grouped(q, qs), _grouped(k, part.keys), _grouped(v, part.keys)
            o4, do4 = _grouped(out, qs), _grouped(dout, qs)
            lse4 = _grouped(lse.unsqueeze(-1), qs).squeeze(-1)  # (B*H, G, Mq)
            dq4, dk4, dv4 = _BACKWARD(
                do4, q4, k4, v4, o4, lse4, 0.0, False, attn_mask=prep.mask, scale=ctx.scale
            )
            shares = (
                _queries_back(dq4, qs, q.shape),
                _keys_back(dk4, part.keys, k.shape),
                _keys_back(dv4, part.keys, v.shape),
            )
            grads = [s if g is None else g.add_(s) for g, s in zip(grads, shares, strict=True)]
        dq, dk, dv = (g.to(dtype) for g in grads)
        return dq, dk, dv, None, None


def attend(
    q: Tensor, k: Tensor, v: Tensor, parts: Sequence[Part], rule: Rule, key: Hashable | None
) -> Tensor:
    """:func:`attnbench.variants.sparse.executor.attend` on the fused CPU kernel (:func:`supports`
    must hold)."""
    prepared = _prepared(key, parts, rule, q.shape[-2], q)
    scale = 1.0 / math.sqrt(q.shape[-1])
    return _FusedParts.apply(q, k, v, prepared, scale)
