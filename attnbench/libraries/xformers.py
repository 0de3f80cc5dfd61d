"""xFormers' ``memory_efficient_attention`` (Lefaudeux et al. 2022,
github.com/facebookresearch/xformers) as paths of ``softmax`` and ``local``.

It dispatches to the fastest kernel it has for the call (its own CUTLASS or Flash kernels) and
takes [B, T, H, D] (a transposed view of attnbench's [B, H, T, D]; it needs only the last
dimension contiguous). Mapping: ``scale`` 1/sqrt(d) (its default, passed explicitly); causal:
``LowerTriangularMask``; the local window w (query i sees keys i - w .. i + w, causal
i - w .. i): ``LocalAttentionFromBottomRightMask(window_left=w, window_right=w or 0)``, which for
as many queries as keys is exactly that band. No dropout. CUDA only.

A call xFormers has no kernel for (its dispatcher's NotImplementedError, e.g. a head dim or
dtype none of its kernels takes) is refused with xFormers' first reason, not a traceback.
"""

from __future__ import annotations

from torch import Tensor

from attnbench.core.errors import AttnbenchError


def _fmha():
    try:
        from xformers.ops import fmha
    except ImportError as e:
        raise AttnbenchError(
            f"xformers does not import ({e}); it needs a CUDA build of torch it was built for: "
            'pip install -U "attnbench[xformers]"'
        ) from None
    return fmha


def memory_efficient(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, window: int | None = None
) -> Tensor:
    """Softmax attention (within ``window`` when given): [B, H, T, D] -> [B, H, T, Dv]."""
    fmha = _fmha()
    if window is not None:
        bias = fmha.attn_bias.LocalAttentionFromBottomRightMask(
            window_left=window, window_right=0 if causal else window
        )
    else:
        bias = fmha.attn_bias.LowerTriangularMask() if causal else None
    try:
        o = fmha.memory_efficient_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias,
            scale=q.shape[-1] ** -0.5,
        )  # fmt: skip
    except NotImplementedError as e:
        raise AttnbenchError(
            f"xFormers has no kernel for this call ({q.dtype}, head dim {q.shape[-1]}, "
            f"{type(bias).__name__ if bias is not None else 'no mask'}): {first_reason(str(e))}"
        ) from None
    return o.transpose(1, 2)


def first_reason(message: str) -> str:
    """The first of xFormers' dispatcher's reasons ("`op` is not supported because:" and its
    indented lines), on one line; the message's first line when it has none."""
    lines = [line.strip() for line in message.splitlines()]
    for i, line in enumerate(lines):
        if line.endswith("is not supported because:") and i + 1 < len(lines):
            return f"{line[: -len(' because:')]}: {lines[i + 1]}"
    return next((line for line in lines if line), "no reason given")
