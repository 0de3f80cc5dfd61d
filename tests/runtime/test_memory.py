"""Peak memory, counted deterministically (tensor storage bytes, not RSS)."""

from __future__ import annotations

import torch

from attnbench.api import attention
from attnbench.measure.memory import cpu_peak

B, H, D = 1, 2, 32


def fwd_bwd_peak(name: str, n: int, path: str, **params) -> int:
    q, k, v = (torch.randn(B, H, n, D, requires_grad=True) for _ in range(3))

    def step():
        attention(name, q, k, v, causal=True, path=path, **params).sum().backward()

    return cpu_peak(step).bytes


def test_counter_sees_allocations_and_frees():
    def alloc():
        a = torch.empty(1000, dtype=torch.float32)  # 4000 bytes
        b = torch.empty(500, dtype=torch.float64)  # 4000 bytes, both alive
        del a, b
        return torch.empty(10)

    assert cpu_peak(alloc).bytes == 8000


def test_views_of_existing_tensors_cost_nothing():
    x = torch.randn(1000, 1000)

    def views():
        a = x.view(-1)[:10]
        b = x.t()
        return a.sum() + b[0, 0]

    assert cpu_peak(views).bytes < 64  # two scalars, not x's 4 MB


def test_flash_tiled_memory_grows_like_n_times_tile():
    """At n = 4096 the tiled path's fwd+bwd peak stays under a bound proportional to n * tile,
    doubles (not quadruples) with n, and is far below the dense reference's n^2."""
    tile = 128
    itemsize = 4
    per_tile = B * H * 4096 * tile * itemsize  # one [B, H, n, tile] fp32 tensor
    peak = fwd_bwd_peak("flash-tiled", 4096, "efficient", tile=tile)
    assert peak <= 8 * per_tile, peak
    half = fwd_bwd_peak("flash-tiled", 2048, "efficient", tile=tile)
    assert 1.6 < peak / half < 2.5, (peak, half)
    dense = fwd_bwd_peak("softmax", 4096, "reference")
    assert dense >= B * H * 4096 * 4096 * itemsize  # at least one n x n matrix
    assert dense > 4 * peak
