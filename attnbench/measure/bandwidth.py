"""Bytes per second, and the memory roofline of decoding: a copy timed in the same rounds.

Decoding one token is memory-bound: softmax reads its whole K/V cache, a recurrent mechanism
its state, and does a few FLOPs per byte. Its rate is bytes moved per second (the cache or state
read plus what is written, as each decode form declares: :mod:`attnbench.core.decode`), and its
ceiling is the memory system's bandwidth. As the matmul anchors FLOP/s
(:class:`attnbench.measure.flops.MatmulAnchor`), a copy anchors bytes/s: ``dst.copy_(src)`` of
``size`` bytes, which reads and writes them (2 x size bytes moved), timed as one more member of
every decoding group's interleaved rounds, so a case's fraction of it is a per-round ratio under
the same load. The copy is sized well beyond the caches (default 256 MiB), so it measures the
memory: a small cache or state that stays in the CPU's caches or a GPU's L2 can move its bytes
faster than the copy, and its fraction then passes 1 (that is a finding, not an error).
"""

from __future__ import annotations

import torch

MiB = 2**20


class CopyAnchor:
    """``dst.copy_(src)`` of ``size`` bytes (float32 elements) on ``device``: 2 x size bytes
    moved per call (read and written)."""

    def __init__(self, device: torch.device, size: int) -> None:
        count = max(1, size // 4)
        self.src = torch.ones(count, dtype=torch.float32, device=device)
        self.dst = torch.empty_like(self.src)
        self.size = count * 4
        self.bytes = 2 * self.size

    def __call__(self) -> torch.Tensor:
        return self.dst.copy_(self.src)


def copy_anchor(device: torch.device, mib: int) -> CopyAnchor:
    return CopyAnchor(device, mib * MiB)
