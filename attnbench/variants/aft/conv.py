"""AFT-conv: a per-head 1-D kernel as the bias, computed by convolution (Zhai et al.
2021). For head i with kernel w^i of size s::

    Y[t] = sigmoid(Q[t]) * [conv1d(e^K * V, e^{w^i} - 1) + sum_t' e^{K[t']} V[t']]
                         / [conv1d(e^K,     e^{w^i} - 1) + sum_t' e^{K[t']}]

i.e. AFT with bias w[t, t'] = w^i[j] at offset t' - t = j - (s - 1) // 2 (a centred kernel,
PyTorch's ``padding='same'`` alignment) and 0 elsewhere: global connectivity is kept. The kernel
is reparameterised per head as ``gamma (w - mean(w)) / std(w) + beta`` with ``gamma = beta = 0``
at initialisation (so a fresh layer is AFT-simple); std is the population std with 1e-5 added to
the variance, as in LayerNorm, so that s = 1 is defined.

Choices where the paper is silent or differs from our layout: K is elementwise like the other AFT
forms (the paper gives K one scalar per head to save parameters; tying K across a head's
features in the projection recovers it). The paper defines AFT-conv for images (non-causal) and
has no causal form, so ``causal=True`` is an error.

Stabilisation is exact: a per-feature maximum of K and a per-head maximum of the bias (over the
taps that meet a key at this length, and 0 when some row has keys outside the kernel) are
subtracted from every exponent, so every factor is <= 1 and the common factor cancels. That
stabiliser is separable, an upper bound of each (row, feature)'s joint maximum of bias + K that
can miss it by up to the bias's span (a large negative beta, or gamma spreading the taps): in
float16 the denominators underflowed to 0 (0/0, issue 11) and in float32 lost digits (up to 3 %
of the output scale at beta = -100, T <= 7, where every key is inside the kernel). So the sums are
taken in float32 for half inputs and certified as in aft-full
(:mod:`~attnbench.variants.aft.softmax_sums`): a denominator below ``underflow_threshold(T)`` has
its (row, feature) taken from the same sums in float64, and if it fails there too, recomputed
densely over all T keys with its exact maximum; neither happens for ordinary inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.core import sources
from attnbench.core.errors import AttnbenchError
from attnbench.core.precision import float32_sums
from attnbench.core.spec import ExtraInput, Mechanism, PathSpec, Shape, positive_int
from attnbench.variants.aft.common import check_elementwise
from attnbench.variants.aft.dense import aft_dense, kernel_to_dense
from attnbench.variants.aft.layer import aft_layer, same_at_every_length
from attnbench.variants.aft.softmax_sums import certified_average, exact_average

VAR_EPS = 1e-5
NO_CAUSAL = "aft-conv has no causal form (the paper defines it for images); use aft-local"


def effective_kernel(kernel: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
    """The paper's reparameterisation, per head: kernel ``[H, s]``, gamma, beta ``[H]``."""
    mean = kernel.mean(-1, keepdim=True)  # (H, 1)
    var = kernel.var(-1, unbiased=False, keepdim=True)  # (H, 1)
    return gamma[:, None] * (kernel - mean) / torch.sqrt(var + VAR_EPS) + beta[:, None]


def reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    kernel: Tensor,
    gamma: Tensor,
    beta: Tensor,
) -> Tensor:
    """Dense AFT with the kernel laid out as a Toeplitz bias per head. q, k, v: [B, H, T, D]."""
    if causal:
        raise AttnbenchError(NO_CAUSAL)
    bias = kernel_to_dense(effective_kernel(kernel, gamma, beta), q.shape[-2])  # (H, T, T)
    return aft_dense(q, k, v, bias, causal=False)


@float32_sums(name="aft-conv:efficient")
def conv(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    s: int,
    kernel: Tensor,
    gamma: Tensor,
    beta: Tensor,
) -> Tensor:
    """The formula of Zhai et al. 2021 with a depthwise ``F.conv1d``.
    q, k, v: [B, H, T, D] -> [B, H, T, D].

    Written as ``conv1d(x, e^w) + (keys outside the kernel's reach)``, which is the paper's
    ``conv1d(x, e^w - 1) + sum_t' x`` with the window's unit terms moved out of the global sum:
    the outside keys come from prefix and suffix cumulative sums, so nothing is subtracted (the
    paper's form cancels when e^w << 1 where the mass is, e.g. 30 ulps of error on dK at T = 1).
    """
    if causal:
        raise AttnbenchError(NO_CAUSAL)
    b, h, t, d = q.shape
    left, right = (s - 1) // 2, s - 1 - (s - 1) // 2  # the kernel reaches t - left .. t + right
    eff = effective_kernel(kernel, gamma, beta)  # (H, s)

    def sums(dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        return _conv_sums(eff.to(dtype), k.to(dtype), v.to(dtype), left, right)

    by_feature: list[Tensor] = []  # K and V as [B, H, D, T], made contiguous once if needed

    def exact(bi: Tensor, hi: Tensor, ti: Tensor, di: Tensor) -> Tensor:
        """Entries (b, h, t, d) densely over all T keys, each with its exact maximum."""
        if not by_feature:
            by_feature.extend(x.transpose(-2, -1).contiguous() for x in (k, v))
        kt, vt = by_feature
        j = torch.arange(t, device=eff.device)[None, :] - ti[:, None] + left  # (n, T): tap
        inside_kernel = (j >= 0) & (j < s)
        bias = eff[hi].gather(1, j.clamp(0, s - 1)).masked_fill(~inside_kernel, 0.0)  # (n, T)
        return exact_average(bias + kt[bi, hi, di], vt[bi, hi, di])

    avg = certified_average(sums, q.dtype, t, exact, piece=max(t, b * h * d))  # (B, H, T, D)
    return torch.sigmoid(q) * avg


def _conv_sums(eff: Tensor, k: Tensor, v: Tensor, left: int, right: int) -> tuple[Tensor, Tensor]:
    """Stabilised numerator and denominator, each [B, H, T, D], scaled by the common factor
    e^{-(cap[h] + max K[:, f])}. eff [H, s] (effective kernel), k, v [B, H, T, D]."""
    b, h, t, d = k.shape
    s = eff.shape[-1]
    used = (torch.arange(s, device=eff.device) - left).abs() <= t - 1  # taps that meet a key
    cap = eff.detach().masked_fill(~used, float("-inf")).amax(-1)  # (H,)
    if t - 1 > left:  # some row has keys outside the kernel: bias 0
        cap = cap.clamp(min=0.0)
    taps = torch.exp((eff - cap[:, None]).masked_fill(~used, float("-inf")))  # (H, s), <= 1
    outside = torch.exp(-cap)[None, :, None, None]  # (1, H, 1, 1): e^{0 - cap}, <= 1
    ek = torch.exp(k - k.detach().amax(-2, keepdim=True))  # (B, H, T, D), feature max 1
    x = torch.cat((ek * v, ek), dim=-1).transpose(-2, -1).reshape(b, h * 2 * d, t)  # (B,2HD,T)
    weight = taps.repeat_interleave(2 * d, dim=0)[:, None, :]  # (H*2D, 1, s)
    inside = F.conv1d(F.pad(x, (left, right)), weight, groups=h * 2 * d)  # (B, 2HD, T)
    before = F.pad(x.cumsum(-1), (left + 1, 0))[..., :t]  # keys t' < t - left
    after = F.pad(x.flip(-1).cumsum(-1).flip(-1), (0, right + 1))[..., right + 1 :]  # t' > t+right

    def split(y: Tensor) -> tuple[Tensor, Tensor]:  # (B, 2HD, T) -> 2 x (B, H, T, D)
        return y.reshape(b, h, 2 * d, t).transpose(-2, -1).split(d, dim=-1)

    (num_in, den_in), (num_out, den_out) = split(inside), split(before + after)
    return num_in + outside * num_out, den_in + outside * den_out


def flops(shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
    """4 per (query, kernel tap, feature) (the convolution: 2 channels x multiply-add) plus 4 per
    (key, feature) for the sums outside the kernel (see aft.common)."""
    feats = shape.batch * shape.heads * shape.head_dim
    return 4 * feats * shape.seq_len * (params["s"] + 1)


def layer_init(params: Mapping[str, Any], heads: int, max_len: int) -> dict[str, Tensor]:
    """The paper's init: gamma = beta = 0 (the effective kernel starts at 0); raw kernel N(0, 1)
    so that gamma receives a gradient."""
    return {
        "kernel": torch.randn(heads, params["s"]),
        "gamma": torch.zeros(heads),
        "beta": torch.zeros(heads),
    }


MECHANISM = Mechanism(
    name="aft-conv",
    family="aft",
    description="AFT with a per-head 1-D kernel bias (gamma/beta reparameterised), via conv1d",
    sources=(sources.ZHAI_2021,),
    params=(positive_int("s", 7, "kernel size (centred: offsets -(s-1)//2 .. s//2)"),),
    extra_inputs=(
        ExtraInput("kernel", "raw kernel per head [H, s]", lambda sh, p: (sh.heads, p["s"])),
        ExtraInput("gamma", "kernel gain per head [H] (0 at init)", lambda sh, p: (sh.heads,)),
        ExtraInput("beta", "kernel bias per head [H] (0 at init)", lambda sh, p: (sh.heads,)),
    ),
    paths=(
        PathSpec("reference", "reference", reference, memory="O(n^2 d)"),
        PathSpec(
            "efficient",
            "efficient",
            conv,
            memory="O(n d)",
            note="depthwise F.conv1d with e^w taps plus prefix/suffix sums outside the kernel",
        ),
    ),
    causal=False,
    no_decode="decoding is causal, and AFT-conv is defined for images only (no causal form)",
    check_inputs=check_elementwise,
    flops=flops,
    layer=aft_layer(layer_init, same_at_every_length),
    time="O(n s d)",
    memory="O(n d)",
    notes="Bidirectional only: the paper has no causal AFT-conv. The kernel does not depend on T, "
    "so any length works.",
)
