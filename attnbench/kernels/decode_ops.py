"""The Triton decode kernels (:mod:`attnbench.kernels.triton_decode`) as checked functions,
without importing Triton: a call the kernels cannot take raises one line; only then is the
kernel module imported.

* :func:`recurrent_step`: Tq new tokens through a recurrent state, read and written once
  (linear attention's S = sum phi(K)^T [V, 1]; retention's decayed state).
* :func:`split_softmax`: softmax decoding over a K/V cache split along the keys
  (Flash-Decoding), K/V heads shared by groups of query heads (MQA, GQA).

On a CPU they run only under Triton's interpreter (``TRITON_INTERPRET=1``), as the tests do.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError
from attnbench.kernels.triton_ops import MAX_HEAD_DIM, check_call

#: The finishes of a recurrent step (see triton_decode): none, linear attention's normaliser
#: (z in the state's last column), retention's rownorm (likewise).
FINISHES = ("none", "normalize", "rownorm")
#: Feature maps the step applies in registers (the names of attnbench.variants.linear's maps).
FEATURE_MAPS = ("identity", "relu", "elu+1")


def _last_dim_contiguous(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def recurrent_step(
    state: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str = "identity",
    finish: str = "none",
    ln_gamma: Tensor | None = None,
    scale: float = 1.0,
    eps: float = 0.0,
    start: int = 0,
) -> tuple[Tensor, Tensor]:
    """Tq new tokens through the state S (and z): per token, S <- gamma S + phi(k)^T v,
    z <- gamma z + phi(k), o = scale phi(q) S, then ``finish`` ("none"; "normalize": o /
    (phi(q) . z + eps); "rownorm": RetNet's row normalisation at the absolute positions
    ``start`` + 1 ..). q, k ``[B, H, Tq, D]`` (D <= 128), v ``[B, H, Tq, Dv]``, ``state`` ``[B, H,
    D, Dv (+1: z, unless finish is "none")]`` float32; ``ln_gamma`` ``[H]`` float32 ln(gamma_h)
    or None (gamma = 1). Returns (o ``[B, H, Tq, Dv]`` in q's dtype, the new state); ``state``
    is left as it was."""
    check_call("recurrent decode step", q, k, v, max_v=None, same_heads=False)
    if feature_map not in FEATURE_MAPS:
        raise AttnbenchError(
            f"invalid feature_map={feature_map!r}; accepted: {', '.join(FEATURE_MAPS)}"
        )
    if finish not in FINISHES:
        raise AttnbenchError(f"invalid finish={finish!r}; accepted: {', '.join(FINISHES)}")
    if finish == "rownorm" and ln_gamma is None:
        raise AttnbenchError("rownorm needs the decays (ln_gamma); accepted: a [H] tensor")
    b, h, tq, d = q.shape
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise AttnbenchError(
            f"recurrent decode step: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
            f"accepted: k as q, v ({b}, {h}, {tq}, Dv)"
        )
    if ln_gamma is not None and (
        tuple(ln_gamma.shape) != (h,)
        or ln_gamma.dtype != torch.float32
        or ln_gamma.device != q.device
    ):
        raise AttnbenchError(
            f"recurrent decode step: ln_gamma {tuple(ln_gamma.shape)} {ln_gamma.dtype} on "
            f"{ln_gamma.device}; accepted: ({h},) float32 on {q.device}"
        )
    width = v.shape[-1] + (finish != "none")
    if tuple(state.shape) != (b, h, d, width) or state.dtype != torch.float32:
        raise AttnbenchError(
            f"recurrent decode step: state {tuple(state.shape)} {state.dtype}; "
            f"accepted: ({b}, {h}, {d}, {width}) float32"
        )
    from attnbench.kernels import triton_decode

    q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))
    return triton_decode.recurrent_step(
        state.contiguous(), q, k, v, feature_map=feature_map, finish=finish,
        ln_gamma=ln_gamma, scale=float(scale), eps=float(eps), start=int(start),
    )  # fmt: skip


def split_softmax(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    start: int,
    scale: float,
    block: int | None = None,
    splits: int | None = None,
) -> Tensor:
    """softmax(scale q K^T) V for Tq new rows at positions start .. (each sees the keys up to
    its own position) against a cache's keys ``[B, Hkv, n, D]`` and values ``[B, Hkv, n, Dv]``
    (views of its buffers; Hkv divides H; D, Dv <= 128), split along the keys and combined
    (Flash-Decoding). q ``[B, H, Tq, D]`` -> ``[B, H, Tq, Dv]``. ``block``: keys a tile (a power
    of two >= 16); ``splits``: splits of the cache (default: enough to fill the GPU); tests
    set both small."""
    check_call("split-K softmax decode", q, keys, values, max_v=MAX_HEAD_DIM, same_heads=False)
    b, h, tq, _ = q.shape
    hkv, n = keys.shape[1], keys.shape[2]
    if (
        h % hkv
        or keys.shape[0] != b
        or keys.shape[-1] != q.shape[-1]
        or values.shape[:3] != keys.shape[:3]
    ):
        raise AttnbenchError(
            f"split-K softmax decode: q {tuple(q.shape)}, keys {tuple(keys.shape)}, values "
            f"{tuple(values.shape)}; accepted: one batch, K/V heads dividing the query heads, "
            "keys as wide as q"
        )
    if not 0 <= start <= n - tq:
        raise AttnbenchError(
            f"split-K softmax decode: new rows at {start}.. with {n} keys cached; accepted: "
            f"0 <= start <= {n - tq} (the new tokens are in the cache)"
        )
    if block is not None and (block < 16 or block & (block - 1)):
        raise AttnbenchError(f"invalid block={block}; accepted: a power of two >= 16")
    if splits is not None and splits < 1:
        raise AttnbenchError(f"invalid splits={splits}; accepted: >= 1")
    from attnbench.kernels import triton_decode

    q, keys, values = (_last_dim_contiguous(x) for x in (q, keys, values))
    return triton_decode.split_softmax(
        q, keys, values, start=int(start), scale=float(scale), block=block, splits=splits
    )
