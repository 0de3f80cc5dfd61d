"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"; Su 2022).

    O_t = phi(Q_t) (sum_t' phi(K_t')^T V_t') / (phi(Q_t) sum_t' phi(K_t')^T + eps)

with t' over all positions (bidirectional) or t' <= t (causal); phi = elu + 1 by default, the
paper's choice. ``normalize=True`` (default) divides by phi(Q) sum phi(K)^T as the paper does,
with Katharopoulos' eps = 1e-6 added to the denominator; ``normalize=False`` returns the bare
sum (as fla's linear attention does with its normaliser off). No 1/sqrt(d) scale: with the
normaliser it would cancel.

Paths (all compute the same function):

* ``reference``: dense ``(phi(Q) phi(K)^T, zeroed above the diagonal when causal) V``, T x T.
* ``chunkwise`` (default): bidirectional, ``phi(K)^T V`` once (O(T d^2)). Causal, chunks of
  ``chunk`` positions: inside a chunk densely (``chunk x chunk``), across chunks through an
  exclusive cumulative sum of the per-chunk states ``phi(K_c)^T V_c``, so memory is
  O(T chunk + T d^2 / chunk), never the T d^2 of one state per position (Su 2022's b*n*s^2).
* ``compiled``: ``chunkwise`` under ``torch.compile`` (:mod:`attnbench.kernels.inductor`;
  Inductor's C++ on the CPU, Triton on CUDA), the feature map written out of place
  (:func:`traceable_phi`) so that it, the normaliser and the division become one fused pass
  each. On one CPU thread at T = 8192, D = 32 the bidirectional forward takes about 0.65x the
  eager path's time and forward+backward 0.65x; causal about 0.85x (its time is in the small
  batched products, which stay as they are). Each new shape compiles once (seconds).
* ``recurrent``: the RNN view, a Python loop over positions, ``S_t = S_{t-1} + phi(K_t)^T V_t``,
  ``O_t = phi(Q_t) S_t`` (bidirectional: every query reads the final state). O(d^2) state;
  autograd keeps one state per step for backward.
* ``triton`` (fused, CUDA): causal, the Triton chunkwise kernel of
  :mod:`attnbench.kernels.triton_retention` with gamma = 1; bidirectional, the fused kernels of
  :mod:`attnbench.kernels.triton_linear` (phi in registers, S = phi(K)^T V and z = sum phi(K)
  summed over T splits in float32 on tensor cores, then phi(Q) S / (phi(Q) . z + eps) per row
  tile; the backward the same two kernel shapes).
* ``triton-fused`` (fused, CUDA): causal, the chunk kernels of
  :mod:`attnbench.kernels.triton_linear_causal`, with phi, the normaliser and eps inside them
  (forward and backward; no elementwise pass or float32 copy outside the kernels); bidirectional,
  ``triton``'s fused kernels. Beside ``triton`` so that a GPU run times the two side by side.

In the causal efficient paths the normaliser rides along as an extra column of ones appended to
V (``phi(K)^T [V, 1]`` carries sum phi(K) in its last column); the bidirectional chunkwise path
sums phi(K) once and takes its row-wise dot product with phi(Q).

FLOPs (``Mechanism.flops``) are those of the default ``chunkwise`` path's matrix products, as
``torch.utils.flop_counter.FlopCounterMode`` counts them (2 per multiply-add, the ones column and
the zero padding of a last partial chunk of the causal path included; the bidirectional path's
normaliser is a sum and row-wise dot products, not a product); the feature map and the division
are not counted, as dense attention's count leaves out its softmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.core import sources
from attnbench.core.capabilities import FLA_CORE
from attnbench.core.precision import float32_sums, refuse_overflow
from attnbench.core.spec import Mechanism, Param, PathSpec, Shape, positive_int
from attnbench.kernels import inductor, linear_causal_ops, triton_ops
from attnbench.libraries import fla, fla_varlen
from attnbench.variants import linear_decode
from attnbench.variants.chunks import chunked

#: log2(e): e^x is computed as 2^(x log2 e). On the CPU torch's exp2 kernel ran 2.7x faster than
#: its exp (1M float32 values: 0.33 against 0.90 ms, one AVX-512 EPYC thread), and the feature
#: map's exponential was the largest cost of bidirectional linear attention after its products.
#: The rounding of x log2 e adds a relative error of about |x| eps / 2 to e^x (at most |x| eps
#: with the exponential's own: 2e-6 at x = -17 in float32, where e^x is already 4e-8; tested).
LOG2E = math.log2(math.e)


def _exp_of_negative_part(x: Tensor) -> Tensor:
    """e^min(x, 0), as 2^min(x log2 e, 0): a new tensor."""
    return (x * LOG2E).clamp_(max=0).exp2_()


class _EluPlusOne(torch.autograd.Function):
    """elu(x) + 1 = x + 1 for x > 0, e^x otherwise, as e^min(x, 0) + max(x, 0): never the
    literal (e^x - 1) + 1, which cancels to 0 once e^x < eps/2 (x < -17 in float32, -8 in
    float16) and leaves a row of very negative features 0 instead of e^x. The input is saved
    (the caller holds it anyway), not the output, so the features need not outlive their use;
    the derivative is e^min(x, 0), 1 for x > 0."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return _exp_of_negative_part(x).add_(x.clamp(min=0))

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: differentiable ops, for double backward
            return grad * torch.exp2((x * LOG2E).clamp(max=0))
        return _exp_of_negative_part(x).mul_(grad)  # one new tensor, as elu's backward


def elu_plus_one(x: Tensor) -> Tensor:
    """Katharopoulos et al. 2020's feature map elu(x) + 1, without cancellation (see above)."""
    return _EluPlusOne.apply(x)


FEATURE_MAPS: dict[str, Callable[[Tensor], Tensor]] = {
    "elu+1": elu_plus_one,
    "relu": F.relu,
    "identity": lambda x: x,
}


def phi(x: Tensor, feature_map: str) -> Tensor:
    return FEATURE_MAPS[feature_map](x)


def traceable_phi(x: Tensor, feature_map: str) -> Tensor:
    """:func:`phi` as plain out-of-place expressions, for the compiled path: elu + 1 as
    e^min(x, 0) + max(x, 0) (no cancellation, as above) with no in-place ops or custom backward,
    so Inductor fuses it into one pass and derives its gradient, e^min(x, 0) [x < 0] + [x > 0]."""
    if feature_map == "elu+1":
        return torch.exp2((x * LOG2E).clamp(max=0)) + x.clamp(min=0)
    return FEATURE_MAPS[feature_map](x)


@float32_sums
def reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    feature_map: str,
    normalize: bool,
    eps: float,
) -> Tensor:
    """Dense T x T scores phi(Q) phi(K)^T. q, k: [B, H, T, D], v: [B, H, T, Dv] -> [B, H, T, Dv].
    Half inputs are computed in float32, as every path here is: the normaliser's row sum passes
    float16's 65504 near T = 1000 and e^x of a very negative feature underflows it."""
    t = q.shape[-2]
    scores = phi(q, feature_map) @ phi(k, feature_map).transpose(-2, -1)  # (B, H, T, T)
    if causal:
        future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, 0.0)
    out = scores @ v  # (B, H, T, Dv)
    if normalize:
        out = out / (scores.sum(-1, keepdim=True) + eps)
    return out


def _values(v: Tensor, normalize: bool) -> Tensor:
    """V with a ones column appended when normalising: [B, H, T, Dv] -> [B, H, T, Dv + 1]."""
    return torch.cat((v, torch.ones_like(v[..., :1])), dim=-1) if normalize else v


def _finish(o: Tensor, normalize: bool, eps: float) -> Tensor:
    """Divide by the last (normaliser) column when normalising. [.., Dv + 1] -> [.., Dv]."""
    return o[..., :-1] / (o[..., -1:] + eps) if normalize else o


@float32_sums
def chunkwise(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    feature_map: str,
    normalize: bool,
    eps: float,
    chunk: int,
) -> Tensor:
    """Dense inside chunks, prefix sums of chunk states across. q, k, v: [B, H, T, D]."""
    return _chunkwise(q, k, v, causal, feature_map, normalize, eps, chunk, phi)


@float32_sums
def compiled(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    feature_map: str,
    normalize: bool,
    eps: float,
    chunk: int,
) -> Tensor:
    """``chunkwise`` under ``torch.compile`` (:mod:`attnbench.kernels.inductor`): the feature
    map, the normaliser and the division each one fused pass; the products as they were."""
    return inductor.run_compiled(_traceable_chunkwise, q, k, v, causal, feature_map, normalize,
                                 float(eps), chunk)  # fmt: skip


def _traceable_chunkwise(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    feature_map: str,
    normalize: bool,
    eps: float,
    chunk: int,
) -> Tensor:
    return _chunkwise(q, k, v, causal, feature_map, normalize, eps, chunk, traceable_phi)


def _chunkwise(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    feature_map: str,
    normalize: bool,
    eps: float,
    chunk: int,
    phi: Callable[[Tensor, str], Tensor],
) -> Tensor:
    if not causal:
        return _global(q, k, v, feature_map=feature_map, normalize=normalize, eps=eps, phi=phi)
    fq, fk, vv = phi(q, feature_map), phi(k, feature_map), _values(v, normalize)
    b, h, t, d = fq.shape
    c = min(chunk, t)
    n = math.ceil(t / c)
    dv = vv.shape[-1]
    qc, kc, vc = (chunked(x, n, c) for x in (fq, fk, vv))  # (BHn, c, D or Dv')
    inner = torch.bmm(qc, kc.transpose(-2, -1)).tril_()  # (BHn, c, c): keys up to the query
    states = torch.bmm(kc.transpose(-2, -1), vc).view(b * h, n, d, dv)  # one per chunk
    # the states of the chunks before each one: an exclusive prefix sum over chunks
    before = F.pad(states[:, :-1].cumsum(1), (0, 0, 0, 0, 1, 0)).view(b * h * n, d, dv)
    out = torch.baddbmm(torch.bmm(inner, vc), qc, before)  # inside + across, (BHn, c, Dv')
    return _finish(out.view(b, h, n * c, dv)[:, :, :t], normalize, eps)


def _global(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str,
    normalize: bool,
    eps: float,
    phi: Callable[[Tensor, str], Tensor],
) -> Tensor:
    """Bidirectional: phi(Q) (phi(K)^T V) / (phi(Q) . sum_t phi(K_t) + eps). The normaliser is
    its own sum and row-wise dot product rather than a ones column on V: no widened copy of V,
    both products keep V's width (at D = 32 on one CPU thread a 33-wide product took 1.23 ms
    against 0.92 for the 32-wide one), and the division is in place."""
    fk = phi(k, feature_map)
    state = fk.transpose(-2, -1) @ v  # (B, H, D, Dv)
    total = fk.sum(-2, keepdim=True) if normalize else None  # (B, H, 1, D)
    del fk
    fq = phi(q, feature_map)
    out = fq @ state  # (B, H, T, Dv)
    if total is None:
        return out
    # phi(Q_t) . z elementwise: as a product with one column it took as long as phi(Q) S
    den = (fq * total).sum(-1, keepdim=True)  # (B, H, T, 1)
    return out.div_(den.add_(eps))


@float32_sums
def recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    feature_map: str,
    normalize: bool,
    eps: float,
) -> Tensor:
    """The RNN form, one position at a time. q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    fq, fk, vv = phi(q, feature_map), phi(k, feature_map), _values(v, normalize)
    b, h, t, d = fq.shape
    state = fq.new_zeros(b, h, d, vv.shape[-1])  # (B, H, D, Dv')
    outs = []
    # unbind rather than x[:, :, i]: indexing in a loop costs a full-size zero-fill per step in
    # backward (O(T^2 d)); unbind's backward stacks once.
    for qi, ki, vi in zip(fq.unbind(2), fk.unbind(2), vv.unbind(2), strict=True):
        state = state + ki[..., :, None] * vi[..., None, :]  # S_t = S_{t-1} + k^T v
        if causal:
            outs.append(qi[..., None, :] @ state)  # (B, H, 1, Dv')
    out = torch.cat(outs, dim=-2) if causal else fq @ state  # (B, H, T, Dv')
    return _finish(out, normalize, eps)


def prefix_sum(x: Tensor) -> Tensor:
    """``x.cumsum(-2)`` (sum over s <= t along the sequence dimension of ``[..., T, D]``) as two
    short scans: one inside chunks of about sqrt(T) positions, one over the chunk totals.

    On CUDA, torch's cumsum along a dimension that is not the innermost is a serial scan over it
    (one thread per column walks all T positions): for causal ``linear:triton`` at T = 8192 on an
    H100 it was 59 % of the forward's GPU time, more than the chunk kernel, in a profile. Here
    every scan is about sqrt(T) long with the rest of the tensor in parallel, in the same float
    arithmetic order up to reassociation of one sum per chunk boundary."""
    t = x.shape[-2]
    chunk = max(16, 1 << math.ceil(math.log2(math.sqrt(max(t, 1)))))
    if t <= chunk:
        return x.cumsum(-2)
    pad = (-t) % chunk
    blocks = F.pad(x, (0, 0, 0, pad)).unflatten(-2, (-1, chunk))  # (..., N, C, D)
    inside = blocks.cumsum(-2)  # sums within each chunk
    totals = inside[..., -1:, :].cumsum(-3)  # (..., N, 1, D): through the end of each chunk
    before = torch.cat((torch.zeros_like(totals[..., :1, :, :]), totals[..., :-1, :, :]), dim=-3)
    return (inside + before).flatten(-3, -2)[..., :t, :]


def triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    feature_map: str,
    normalize: bool,
    eps: float,
) -> Tensor:
    """Causal: the sum by the Triton chunkwise kernel (gamma = 1) on phi(Q), phi(K); the
    normaliser phi(Q_t) . sum_{s<=t} phi(K_s) in float32 (:func:`prefix_sum`; O(T d); it grows
    like T d and passes float16's 65504 near T = 1000 at d = 64). Bidirectional: the fused
    kernels of :func:`attnbench.kernels.triton_ops.linear_attention_global` (phi applied in
    registers; phi(K)^T V and sum phi(K) as float32 sums of tensor-core dots, the normaliser,
    eps and the division fused into the output kernel; before them this branch ran float32
    matmuls on CUDA cores plus about ten elementwise passes, 1-5 % of the matmul rate in an
    H100 profile). ``chunk`` does not apply (the kernels have their own tiles). q, k:
    [B, H, T, D], v: [B, H, T, Dv] (D, Dv <= 128) -> [B, H, T, Dv]. A float16 result past 65504
    (the unnormalised sum, or the causal kernel's) is refused, never inf.
    """
    triton_ops.check_call("linear attention", q, k, v, max_v=triton_ops.MAX_HEAD_DIM)
    if not causal:
        o = triton_ops.linear_attention_global(
            q, k, v, feature_map=feature_map, normalize=normalize, eps=eps
        )  # (B, H, T, Dv)
        return refuse_overflow(o, (q, k, v), "linear:triton")
    fq, fk = phi(q.float(), feature_map).to(q.dtype), phi(k.float(), feature_map).to(k.dtype)
    # The kernel returns the bare sum in the input dtype: in float16 it can pass 65504 long
    # before the normalised output does (T ~ 850 at d = 64): refused, never inf.
    num = refuse_overflow(triton_ops.retention_chunked(fq, fk, v, 1.0), (q, k, v),
                          "linear:triton (its unnormalised sum)")  # fmt: skip
    if not normalize:
        return num
    fq32 = fq.float()  # the kernel's operands, exactly, for the normaliser
    z = prefix_sum(fk.float())  # (B, H, T, D): sum_{s <= t} phi(k_s)
    den = (fq32 * z).sum(-1, keepdim=True)  # (B, H, T, 1)
    return (num.float() / (den + eps)).to(v.dtype)


def triton_fused(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    feature_map: str,
    normalize: bool,
    eps: float,
) -> Tensor:
    """Causal: :func:`attnbench.kernels.linear_causal_ops.linear_attention_causal`, the
    feature map, the normaliser phi(Q_t) . sum_{s<=t} phi(K_s) (float32) and eps inside the chunk
    kernels, forward and backward. Bidirectional: :func:`triton`'s fused kernels. q, k:
    [B, H, T, D], v: [B, H, T, Dv] (D, Dv <= 128) -> [B, H, T, Dv]. A float16 result past 65504
    (the unnormalised sum) is refused, never inf."""
    if not causal:
        return triton(q, k, v, causal=False, feature_map=feature_map, normalize=normalize, eps=eps)
    o = linear_causal_ops.linear_attention_causal(
        q, k, v, feature_map=feature_map, normalize=normalize, eps=eps
    )
    return refuse_overflow(o, (q, k, v), "linear:triton-fused")


def _fla(form: str) -> Callable[..., Tensor]:
    def fn(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, feature_map: str, normalize: bool):
        """FLA's causal linear attention on phi(Q), phi(K) (the feature map in float32, cast
        back, as the Triton path): scale 1, FLA's normaliser (+1e-10, not ``eps``). Its sum is
        kept in the input dtype: float16 past 65504 is refused, never inf."""
        fq, fk = phi(q.float(), feature_map).to(q.dtype), phi(k.float(), feature_map).to(k.dtype)
        o = fla.linear_attention(fq, fk, v, causal=causal, normalize=normalize, form=form)
        return refuse_overflow(o, (q, k, v), f"linear:fla-{form}")

    fn.__name__ = fn.__qualname__ = f"fla_{form}"
    return fn


def flops(shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
    """Matrix-product FLOPs of the chunkwise path (see the module docstring)."""
    t, d = shape.seq_len, shape.head_dim
    dv = shape.dv + (1 if params["normalize"] else 0)
    if not causal:  # phi(K)^T V, then phi(Q) S (the normaliser: a sum and row-wise dots)
        per_head = 2 * t * d * shape.dv * 2
    else:
        c = min(params["chunk"], t)
        tp = math.ceil(t / c) * c
        per_head = 2 * tp * c * (d + dv) + 2 * tp * d * dv * 2  # inside chunks; states, across
    return shape.batch * shape.heads * per_head


def _check(params: Mapping[str, Any]) -> str | None:
    if params["feature_map"] == "identity" and params["normalize"]:
        return (
            "feature_map=identity with normalize=true can divide by zero or a negative number "
            "(q . sum k has no sign); use normalize=false or a non-negative feature map"
        )
    return None


MECHANISM = Mechanism(
    name="linear",
    family="linear",
    description="linear attention phi(Q)(phi(K)^T V), normalised, phi = elu + 1",
    sources=(sources.KATHAROPOULOS_2020, sources.SU_2022_FLASH),
    params=(
        Param(
            "feature_map",
            "elu+1",
            "phi applied to q and k",
            choices=tuple(FEATURE_MAPS),
        ),
        Param("normalize", True, "divide by phi(Q) sum phi(K)^T (the paper); false: bare sum"),
        Param(
            "eps",
            1e-6,
            "added to the normaliser (Katharopoulos et al.'s code)",
            accepted="a number >= 0",
            valid=lambda x: x >= 0 and math.isfinite(x),
        ),
        positive_int("chunk", 64, "positions per chunk of the causal chunkwise path"),
    ),
    paths=(
        PathSpec("reference", "reference", reference, memory="O(n^2)"),
        PathSpec(
            "chunkwise",
            "efficient",
            chunkwise,
            memory="O(n d^2 / chunk + n chunk)",
            note="causal: dense inside chunks, exclusive prefix sum of chunk states across",
        ),
        PathSpec(
            "compiled",
            "efficient",
            compiled,
            memory="O(n d^2 / chunk + n chunk)",
            requires=inductor.REQUIRES,
            note="chunkwise under torch.compile: the feature map, normaliser and division fused",
            compiled=True,
        ),
        PathSpec(
            "recurrent",
            "efficient",
            recurrent,
            memory="O(d^2) state; O(n d^2) kept for backward",
            note="Python loop over positions: the RNN form, slow",
        ),
        triton_ops.fused_path(
            triton,
            memory="O(n d + n d^2 / 64) (causal: float32 chunk states, kept for the backward)",
            note="causal: Triton chunkwise kernel, fp32 normaliser; bidirectional: fused kernels",
        ),
        triton_ops.fused_path(
            triton_fused,
            memory="O(n d + n d^2 / 64) (causal: float32 chunk states, kept for the backward)",
            note="causal: phi, normaliser and eps inside the Triton chunk kernels; bidir: fused",
            name="triton-fused",
        ),
        *(
            PathSpec(
                f"fla-{form}",
                "fused",
                _fla(form),
                memory="O(n d) (chunk: O(n d^2 / 64) states)" if form == "chunk" else "O(n d)",
                requires=(*triton_ops.REQUIRES, FLA_CORE),
                note=f"FLA's {form} kernel (fla-core); causal only; its normaliser's eps is 1e-10",
                varlen=fla_varlen.linear(form, phi),
            )
            for form in fla.FORMS
        ),
    ),
    check_params=_check,
    flops=flops,
    decode=linear_decode.decode_forms(phi),
    time="O(n d^2) (causal chunkwise: O(n chunk d + n d^2))",
    memory="O(n d + d^2) bidirectional; O(n chunk + n d^2 / chunk) causal",
)
