"""Flash Linear Attention (``fla-core``; Yang and Zhang 2024,
github.com/fla-org/flash-linear-attention) as paths of ``linear``, ``retention``, ``softmax``
and ``local``.

FLA's Triton kernels take [B, T, H, D]; attnbench's paths [B, H, T, D]. Each adapter transposes
on the way in and out (views: FLA makes them contiguous itself, and that copy is part of what a
user of the library pays from this layout) and maps the conventions:

* **linear attention** (``chunk_linear_attn``, ``fused_recurrent_linear_attn``): causal only.
  The feature map is applied by the caller (FLA applies none); ``scale = 1``, so the numerator
  is phi(Q) S exactly; ``normalize=True`` divides by phi(q_t) . sum_{s<=t} phi(k_s) + 1e-10: FLA's
  constant, not the mechanism's ``eps`` (the difference is eps / (phi(q) . sum phi(k)) relative,
  below the float32 rounding of any row whose normaliser exceeds 0.1). FLA keeps the running
  key sum, the normaliser and (in the backward) its square in the input dtype, so a normalised
  float16 call is refused: float16's largest value is 65504 (see :data:`FLOAT16_NORMALISER`).
* **retention** (``chunk_retention``, ``fused_recurrent_retention``): causal only, RetNet's
  multi-scale decays gamma_h = 1 - 2^(-5 - h) (the same as attnbench's), scale 1/sqrt(d), the
  unnormalised form (attnbench's ``normalize="none"``; FLA has no ``rownorm``).
* **softmax attention** (``parallel_attn``): causal only, scale 1/sqrt(d). With ``window_size``
  a query i sees keys [i - window_size + 1, i]: attnbench's causal ``local`` window w is
  ``window_size = w + 1``.

A refusal (a bidirectional call, a normalisation FLA lacks, a float16 normaliser) is an
:class:`AttnbenchError` naming what FLA computes. The kernels are FLA's own, autotuned on first
use; they need CUDA (they do not run under Triton's CPU interpreter).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError

#: Where each FLA kernel lives (module, function): looked up on first call, so the package is
#: imported only when one of its paths runs.
KERNELS: dict[str, tuple[str, str]] = {
    "linear-chunk": ("fla.ops.linear_attn", "chunk_linear_attn"),
    "linear-recurrent": ("fla.ops.linear_attn", "fused_recurrent_linear_attn"),
    "retention-chunk": ("fla.ops.retention", "chunk_retention"),
    "retention-recurrent": ("fla.ops.retention", "fused_recurrent_retention"),
    "parallel": ("fla.ops.attn", "parallel_attn"),
}
FORMS = ("chunk", "recurrent")


def kernel(name: str) -> Callable[..., Any]:
    """FLA's function for ``name`` (a key of :data:`KERNELS`); a one-line error if it does not
    import."""
    module, function = KERNELS[name]
    try:
        return getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as e:
        raise AttnbenchError(
            f"fla-core: {module}.{function} does not import ({e}); "
            'reinstall it: pip install -U "attnbench[fla]"'
        ) from None


def _causal_only(what: str, causal: bool) -> None:
    if not causal:
        raise AttnbenchError(f"FLA's {what} is causal only; use causal=True or another path")


#: Why a normalised float16 call is refused. Measured on an H100 (fla-core 0.6.0, torch 2.11,
#: results/speed/nvidia-h100/logs/2026-11-27-evening): the normaliser
#: phi(q_t) . sum_{s<=t} phi(k_s) of the elu+1 feature map grows like t * d, so at T = 1023,
#: d = 64 it passed float16's maximum (output error 0.11, NaN gradients), and at T = 97 its
#: square in the backward did (dq error 0.18 against an allowed 0.016). bfloat16 has float32's
#: range and passed.
FLOAT16_NORMALISER = (
    "FLA's normalised linear attention keeps the running key sum and the normaliser "
    "phi(q) . sum phi(k) (which grows with position) in the input dtype; in float16 (largest "
    "value 65504) its square in the backward overflowed by 97 tokens and the normaliser itself "
    "by 1023 (wrong gradients, then NaN); use bfloat16, normalize=False, or the triton path"
)


def _bthd(x: Tensor) -> Tensor:
    """[B, H, T, D] <-> [B, T, H, D] (a view)."""
    return x.transpose(1, 2)


def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, normalize: bool, form: str = "chunk"
) -> Tensor:
    """Causal linear attention of features ``q``, ``k`` (phi already applied): [B, H, T, D] ->
    [B, H, T, Dv]; ``form`` ``chunk`` or ``recurrent``."""
    _causal_only("linear attention", causal)
    if normalize and q.dtype == torch.float16:
        raise AttnbenchError(FLOAT16_NORMALISER)
    fn = kernel(f"linear-{form}")
    o, _ = fn(_bthd(q), _bthd(k), _bthd(v), scale=1.0, normalize=normalize)
    return _bthd(o)


def retention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, form: str = "chunk") -> Tensor:
    """RetNet retention, unnormalised, multi-scale decays: [B, H, T, D] -> [B, H, T, Dv]."""
    _causal_only("retention", causal)
    fn = kernel(f"retention-{form}")
    o, _ = fn(_bthd(q), _bthd(k), _bthd(v), scale=q.shape[-1] ** -0.5)
    return _bthd(o)


def softmax_attention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, window: int | None = None
) -> Tensor:
    """Causal softmax attention, scale 1/sqrt(d); ``window`` w: keys i - w .. i only."""
    _causal_only("parallel softmax attention", causal)
    fn = kernel("parallel")
    o = fn(
        _bthd(q),
        _bthd(k),
        _bthd(v),
        scale=q.shape[-1] ** -0.5,
        window_size=None if window is None else window + 1,
    )
    return _bthd(o)
