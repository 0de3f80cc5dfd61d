"""Deterministic memory accounting: the peak bytes of tensor storage alive during a call.

``tracemalloc`` does not see torch tensors and RSS never goes down, so on the CPU attnbench counts
storage itself: a dispatch mode sees every tensor an operator returns (forward and, on the CPU,
backward too, since autograd runs CPU backward on the calling thread), adds its storage's bytes
when first seen and subtracts them when the storage is freed. Tensors that existed before the
measured region (the inputs) are not counted, nor are views of them (an output that shares an
argument's storage allocates nothing). Scratch buffers that a fused kernel allocates
internally without returning them are not seen either; they are small for the kernels here
(per-thread tiles), but the method's name travels with every number so a reader knows.

On CUDA, :func:`cuda_peak` uses the allocator's own peak statistic instead.

Code compiled by ``torch.compile`` (FlexAttention on the CPU) refuses to run under a dispatch
mode, and a refused call leaves dynamo unable to run it again in the process. Its CPU memory is
therefore not measured: :func:`peak_memory` of a compiled CPU call records why, in the method
column, with no bytes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

METHOD_CPU = "dispatch-live-bytes"
METHOD_CUDA = "cuda-max-allocated"
METHOD_COMPILED_CPU = "not measured: compiled CPU code runs under no dispatch mode"


class LiveBytes(TorchDispatchMode):
    """Context manager counting the live and peak bytes of storages created inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # A view or an in-place result shares an argument's storage: it allocates nothing.
        shared = {_storage_ptr(t) for t in tree_flatten((args, kwargs))[0]}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and _storage_ptr(t) not in shared:
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = id(storage)
        nbytes = storage.nbytes()
        if key in self._seen or nbytes == 0:
            return
        self._seen.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        if key in self._seen:
            self._seen.discard(key)
            self.live -= nbytes


def _storage_ptr(t: object) -> int | None:
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


@dataclass(frozen=True)
class PeakMemory:
    bytes: int | None  # None: not measured (the method says why)
    method: str


def cpu_peak(fn: Callable[[], object]) -> PeakMemory:
    """Peak bytes of tensor storage created while ``fn()`` runs (what it returns included)."""
    with LiveBytes() as counter:
        result = fn()
        del result
    return PeakMemory(counter.peak, METHOD_CPU)


def cuda_peak(fn: Callable[[], object], device: torch.device) -> PeakMemory:
    """Peak bytes above what was allocated before ``fn()`` ran, from the CUDA allocator."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    del result
    return PeakMemory(torch.cuda.max_memory_allocated(device) - base, METHOD_CUDA)


def peak_memory(
    fn: Callable[[], object], device: torch.device | str = "cpu", *, compiled: bool = False
) -> PeakMemory:
    """The peak of ``fn()`` on ``device``; ``compiled`` (``fn`` runs under torch.compile): on the
    CPU not measured, and never run here (see the module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        return cuda_peak(fn, device)
    return PeakMemory(None, METHOD_COMPILED_CPU) if compiled else cpu_peak(fn)
