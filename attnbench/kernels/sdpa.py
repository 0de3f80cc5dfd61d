"""torch SDPA with one named backend: flash, memory-efficient or cuDNN.

``F.scaled_dot_product_attention`` picks a backend on its own; these paths pin exactly one with
``torch.nn.attention.sdpa_kernel`` so a user can ask for each by name and time them side by side.
An explicit request never falls back: when torch refuses the backend for this call (dtype, head
dim, GPU architecture, a build without it), the refusal becomes one :class:`AttnbenchError` line
carrying torch's own reason, taken from its ``can_use_*`` checks.

Layout: q ``[B, H, T, D]``, k ``[B, Hkv, T, D]``, v ``[B, Hkv, T, Dv]`` -> ``[B, H, T, Dv]``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.core.capabilities import CUDA
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import PathSpec

#: Backend names as users write them (path ``sdpa-<name>``) -> torch's enum.
BACKENDS: dict[str, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}

_CHECKS: dict[str, Callable[..., bool]] = {
    "flash": torch.backends.cuda.can_use_flash_attention,
    "efficient": torch.backends.cuda.can_use_efficient_attention,
    "cudnn": torch.backends.cuda.can_use_cudnn_attention,
}

#: Messages torch raises when no allowed backend can run a call (older and newer wording).
_NO_KERNEL = ("No available kernel", "No viable backend")


def backend_reasons(
    backend: str, q: Tensor, k: Tensor, v: Tensor, causal: bool, enable_gqa: bool
) -> list[str]:
    """torch's own reasons why ``backend`` cannot run this call (empty when it can, or when
    torch gives none). Runs the ``can_use_*`` check with ``debug=True`` and collects its warnings.
    """
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal, enable_gqa)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = _CHECKS[backend](params, True)
    if ok:
        return []
    return [" ".join(str(w.message).split()) for w in caught]


def sdpa_with_backend(
    backend: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """SDPA restricted to one backend (``flash``, ``efficient`` or ``cudnn``).

    q ``[B, H, T, D]``, k ``[B, Hkv, T, D]``, v ``[B, Hkv, T, Dv]`` -> ``[B, H, T, Dv]``.
    ``scale`` None means 1/sqrt(D). Raises AttnbenchError with torch's reason when the backend
    cannot run this call; out-of-memory and every other error pass through untouched.
    """
    if backend not in BACKENDS:
        raise AttnbenchError(f"unknown SDPA backend {backend!r}; accepted: {', '.join(BACKENDS)}")
    try:
        with sdpa_kernel([BACKENDS[backend]]):
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale, enable_gqa=enable_gqa
            )
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as e:
        if not any(text in str(e) for text in _NO_KERNEL):
            raise
        reasons = backend_reasons(backend, q, k, v, causal, enable_gqa)
        if reasons:
            why = "; ".join(reasons)
        elif q.device.type != "cuda":
            why = f"this torch build has no {backend} kernel for {q.device.type} tensors"
        else:
            why = " ".join(str(e).split())
        dtype = str(q.dtype).removeprefix("torch.")
        raise AttnbenchError(
            f"SDPA {backend} backend cannot run this call ({dtype}, head dim {q.shape[-1]}, "
            f"{q.device.type}): {why}"
        ) from None


def backend_path(backend: str, *, enable_gqa: bool = False) -> Callable[..., Tensor]:
    """A path function ``fn(q, k, v, *, causal)`` running SDPA on ``backend`` alone
    (dense softmax attention; ``enable_gqa`` for MQA/GQA, where K/V have fewer heads)."""
    if backend not in BACKENDS:
        raise AttnbenchError(f"unknown SDPA backend {backend!r}; accepted: {', '.join(BACKENDS)}")

    def fn(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
        return sdpa_with_backend(backend, q, k, v, causal=causal, enable_gqa=enable_gqa)

    fn.__name__ = fn.__qualname__ = f"sdpa_{backend}"
    fn.__doc__ = f"SDPA pinned to its {backend} backend. q, k, v: [B, H, T, D] -> [B, H, T, Dv]."
    return fn


def backend_paths(
    fn_for: Callable[[str], Callable[..., Tensor]], note: str = ""
) -> tuple[PathSpec, ...]:
    """One fused PathSpec per backend (``sdpa-flash``, ``sdpa-efficient``, ``sdpa-cudnn``), each
    needing CUDA; ``fn_for(backend)`` returns that backend's path function."""
    return tuple(
        PathSpec(
            f"sdpa-{backend}",
            "fused",
            fn_for(backend),
            memory="O(n) (fused kernel, scores never stored)",
            requires=(CUDA,),
            note=f"SDPA pinned to its {backend} backend, no fallback{'; ' + note if note else ''}",
        )
        for backend in BACKENDS
    )


def default_backend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> str:
    """The kernel ``F.scaled_dot_product_attention`` picks by itself for this call (what the
    softmax mechanism's ``efficient`` path runs), read from the profiler's kernel names:
    ``cudnn``, ``flash``, ``efficient`` or ``math``; ``unknown`` when no name matches."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if q.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch.no_grad(), profile(activities=activities) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if q.device.type == "cuda":
            torch.cuda.synchronize(q.device)
    names = " ".join(e.name for e in prof.events()).lower()
    for needle, name in (
        ("cudnn", "cudnn"),
        ("flash", "flash"),
        ("efficient_attention", "efficient"),
        ("fmha", "efficient"),
        ("math", "math"),
    ):
        if needle in names:
            return name
    return "unknown"
