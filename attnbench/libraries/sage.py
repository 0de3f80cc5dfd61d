"""SageAttention 1 (``sageattention``; Zhang et al. 2025, "SageAttention: Accurate 8-Bit
Attention for Plug-and-play Inference Acceleration", ICLR 2025, arXiv:2410.02367) as an
approximate path of ``softmax``.

Its Triton kernels quantise Q and K to int8 per block (Q K^T on 8-bit tensor cores) and run
P V in float16, forward only. It is an approximation of softmax attention, not the same
function: the path is judged by its own stated error bound
(:data:`attnbench.variants.softmax.SAGE_TOLERANCE`), never by the exact paths' rule.

Mapping: layout ``HND`` ([B, H, T, D], attnbench's), ``sm_scale`` 1/sqrt(d), ``is_causal``.
SageAttention's "smooth K" (subtracting the mean key over the sequence, which leaves softmax
unchanged) is done here on a copy, because the package subtracts it from the caller's K in place.
Head dims 64, 96 and 128 only; float16, bfloat16 and float32 in (V is cast to float16).

Non-causal calls need a key length that is a multiple of :data:`KEY_BLOCK`. The package's
non-causal kernels (``attn_qk_int8_per_block.py`` and ``attn_qk_int8_per_block_h96.py`` in
sageattention 1.0.6, the newest on PyPI) load a partial last block of keys as zeros and give
those padding keys the score 0 instead of -inf, so they take a share of every softmax row: on an
H100 the error was 4x SageAttention's bound at T = 257 and 33x at T = 1, where the one real key
keeps about 1/64 of the weight. The causal kernels add -1e6 to the padding keys' scores; their
outputs were within SageAttention's bound at every length tested (T = 1 to 1023 on an H100). The
adapter refuses every non-causal call in which the package counts padding keys, also where the
share is small enough to stay within the bound (T = 1023: one padding key in 1024).
"""

from __future__ import annotations

from torch import Tensor

from attnbench.core.capabilities import package_version
from attnbench.core.errors import AttnbenchError

HEAD_DIMS = (64, 96, 128)
#: The key block of SageAttention's non-causal kernels (BLOCK_N).
KEY_BLOCK = 64


def sage_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """Softmax attention by SageAttention's 8-bit kernels: [B, H, T, D] -> [B, H, T, D]."""
    d = q.shape[-1]
    if d not in HEAD_DIMS or v.shape[-1] != d:
        raise AttnbenchError(
            f"softmax:sage: SageAttention has kernels for head dims {HEAD_DIMS} with V as wide "
            f"as Q; got {d} (V {v.shape[-1]})"
        )
    n = k.shape[-2]
    if not causal and n % KEY_BLOCK:
        raise AttnbenchError(
            f"softmax:sage: SageAttention's non-causal kernel (sageattention "
            f"{package_version('sageattention') or '1.0'}) counts the zero padding of a partial "
            f"key block in the softmax, so it is right only for key lengths that are a multiple "
            f"of {KEY_BLOCK} (got {n}); use causal=True, such a length, or another path"
        )
    try:
        from sageattention import sageattn
    except ImportError as e:
        raise AttnbenchError(
            f"softmax:sage: the sageattention package does not import ({e}); "
            'reinstall it: pip install -U "attnbench[sage]"'
        ) from None
    smoothed = k - k.mean(dim=-2, keepdim=True)  # a new tensor: the caller's K is left alone
    return sageattn(
        q.contiguous(),
        smoothed.contiguous(),
        v.contiguous(),
        tensor_layout="HND",
        is_causal=causal,
        sm_scale=d**-0.5,
        smooth_k=False,
    )
