"""The GPU figure: TFLOP/s against n, a panel per family with cuDNN and flash in each, and the
speed-up over the best dense kernel at the longest n; drawn for CUDA results only."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from attnbench.bench import plot as plot_module
from attnbench.bench.gpu_figure import DENSE_GID, gpu_figure, speedups, wants_gpu_figure
from attnbench.bench.results import COLUMNS, read_results
from tests.helpers.results import write_results

FAMILY = {"softmax": "softmax", "linear": "linear", "local": "sparse", "retention": "retnet"}


def gpu_row(impl: str, n: int, ms: float, status: str = "ok") -> dict:
    mech, path = impl.split(":")
    flops = 4 * 16 * n * n * 128  # a dense forward's, at 16 heads and B = 1
    row = {c: None for c in COLUMNS}
    row.update(
        suite="speed-gpu", mechanism=mech, family=FAMILY[mech], path=path,
        path_kind="efficient" if path == "efficient" else "fused", params="", device="cuda",
        device_name="NVIDIA H200", torch_version="2.11", threads=16, clock="cuda-events",
        l2="warm", graph=False, dtype="bfloat16", batch=1, heads=16, kv_heads=16, seq_len=n,
        head_dim=128, value_dim=128, causal=True, direction="fwd", status=status,
        reason="" if status == "ok" else "unsupported (test)",
        time_median_ms=ms if status == "ok" else None, flops=flops,
        flops_fa=flops, flop_per_s_fa=flops / (ms * 1e-3) if status == "ok" else None,
        matmul_flop_per_s=800e12, mem_fwd_bytes=2**20 if status == "ok" else None,
    )  # fmt: skip
    return row


@pytest.fixture
def gpu_rows() -> list[dict]:
    rows = []
    for n, scale in ((1024, 1), (4096, 16), (16384, 256)):
        rows += [
            gpu_row("softmax:sdpa-cudnn", n, 0.01 * scale),
            gpu_row("softmax:sdpa-flash", n, 0.02 * scale),
            gpu_row("softmax:efficient", n, 0.011 * scale),
            gpu_row("linear:triton", n, 0.5 * n / 1024),
            gpu_row("retention:triton", n, 0.1 * n / 1024),
        ]
    rows += [gpu_row("local:flex", 1024, 0.02), gpu_row("local:flex", 4096, 0.05)]
    rows.append(gpu_row("local:flex", 16384, 0, status="unsupported"))
    return rows


def test_a_panel_per_family_with_cudnn_and_flash_in_each(gpu_rows):
    df = pd.DataFrame(gpu_rows)
    fig = gpu_figure(df)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title(loc="left") for ax in axes] == ["softmax", "sparse", "linear", "retnet"]
    for ax in axes:
        gids = {line.get_gid() for line in ax.get_lines()}
        assert {DENSE_GID.format(path="sdpa-cudnn"), DENSE_GID.format(path="sdpa-flash")} <= gids
    labels = {t.get_text() for ax in axes for t in ax.texts}
    # At 16k: cuDNN 2.56 ms; linear 8 ms (0.32x), retention 1.6 ms (1.6x); flex stopped at 4k.
    assert {"0.32×", "1.6×", "3.2× @4k"} <= labels
    plt.close(fig)


def test_speedups_are_over_the_best_dense_kernel_at_that_n(gpu_rows):
    table = speedups(pd.DataFrame(gpu_rows)).set_index("impl")
    assert table.loc["retention:triton", "speedup"] == pytest.approx(2.56 / 1.6)
    assert table.loc["local:flex", "n"] == 4096
    assert table.loc["softmax:efficient", "speedup"] == pytest.approx(1 / 1.1)
    assert "softmax:sdpa-cudnn" not in table.index  # the dense lines are the scale, not a bar


def test_drawn_for_cuda_results_only(tmp_path, gpu_rows):
    csv = write_results(tmp_path / "results.csv", gpu_rows)
    figures = plot_module.plot_results(csv)
    assert any(p.name == "tflops-fwd-causal.png" for p in figures.paths)
    cpu = pd.DataFrame(gpu_rows).assign(device="cpu")
    assert not wants_gpu_figure(cpu) and gpu_figure(cpu) is None
    assert wants_gpu_figure(read_results(csv))
