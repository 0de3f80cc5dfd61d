"""What went wrong in a case of the speed suite, told apart by the exception: out of memory (an
``oom`` row; the series' longer lengths are skipped), out of a GPU's kernel resources (an
``unsupported`` row), a sticky CUDA error (its row, then the sweep stops: ``--resume`` in a fresh
process), anything else (an ``error`` row). And the one line a row's reason gives."""

from __future__ import annotations

import torch


def _oom_error_types() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = [MemoryError]
    for holder, name in ((torch, "OutOfMemoryError"), (torch.cuda, "OutOfMemoryError")):
        kind = getattr(holder, name, None)
        if isinstance(kind, type):
            kinds.append(kind)
    return tuple(kinds)


OOM_TYPES = _oom_error_types()


def is_oom(e: BaseException) -> bool:
    """torch's OutOfMemoryError, MemoryError, or the CPU allocator's RuntimeError when it cannot
    get memory. Triton's OutOfResources is not one: see :func:`is_out_of_resources`."""
    if isinstance(e, OOM_TYPES):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text
    )


def is_out_of_resources(e: BaseException) -> bool:
    """Triton's OutOfResources: a kernel configuration that does not fit this GPU's shared
    memory or registers. A property of the kernel and the GPU, not of the length: the case is
    ``unsupported`` with the reason, and longer lengths are still tried."""
    return type(e).__name__ == "OutOfResources"


#: Messages of CUDA errors that leave the process's CUDA context unusable: every later call
#: fails too, so the sweep stops and the rest is run in a fresh process (``--resume``).
STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "illegal instruction",
    "misaligned address",
    "unspecified launch failure",
    "device-side assert",
    "cudaErrorLaunchFailure",
)


def is_sticky_cuda_error(e: BaseException) -> bool:
    text = str(e)
    return isinstance(e, RuntimeError) and any(m in text for m in STICKY_CUDA_ERRORS)


class StickyDeviceError(Exception):
    """Raised inside the runner after a sticky CUDA error's row is written: the sweep stops."""


def one_line(e: BaseException, limit: int = 240) -> str:
    """``TypeName: first line of the message`` (what an error row's reason says)."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    text = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
