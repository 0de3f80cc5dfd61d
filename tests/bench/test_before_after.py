"""attnbench.bench.before_after (the gate's OUT/before-after.md): each side read through what
its own runs measured (the matmul anchor, dense SDPA, the peer in the same run), medians over
the runs, checked by hand."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from attnbench.bench import before_after

COLUMNS = ["mechanism", "path", "params", "direction", "causal", "seq_len", "dtype", "status",
           "time_median_ms", "matmul_flop_per_s", "ref_ratio", "flops"]  # fmt: skip


def write_run(folder: Path, local_ms: float, peer_ms: float, matmul: float, flops: int) -> Path:
    folder.mkdir()
    rows = [
        ("local", "efficient", "window=64", "fwd", False, 8192, "float32", "ok", local_ms,
         matmul, local_ms / 100.0, flops),
        ("local", "local-attention", "window=64", "fwd", False, 8192, "float32", "ok", peer_ms,
         matmul, peer_ms / 100.0, flops),
        ("linear", "chunkwise", "", "fwd", False, 8192, "float32", "error", "", "", "", ""),
    ]  # fmt: skip
    with (folder / "results.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    return folder / "results.csv"


def test_each_side_is_read_through_its_own_runs(tmp_path):
    # before: 20 and 30 ms at anchors of 1e11 and 5e10 FLOP/s (2e9 and 1.5e9 matmul FLOPs of
    # time); after: 10 ms at 1e11 twice. FLOPs counted by the current code: 1e9.
    base = [write_run(tmp_path / "b1", 20.0, 40.0, 1e11, 999),
            write_run(tmp_path / "b2", 30.0, 30.0, 5e10, 999)]  # fmt: skip
    current = [write_run(tmp_path / "c1", 10.0, 40.0, 1e11, 10**9),
               write_run(tmp_path / "c2", 10.0, 30.0, 1e11, 10**9)]  # fmt: skip
    peers = {"local:efficient": "local:local-attention"}
    df = before_after.table(base, current, peers)
    row = df[df["impl"] == "local:efficient"].iloc[0]
    assert row["matmul_fraction_before"] == pytest.approx(1e9 / 1.75e9)  # median of 2e9, 1.5e9
    assert row["matmul_fraction_after"] == pytest.approx(1.0)
    assert row["after_over_before"] == pytest.approx(1.75)
    assert row["vs_sdpa_before"] == pytest.approx(100 / 25.0)  # median ref_ratio 0.25
    assert row["vs_peer_before"] == pytest.approx((2.0 + 1.0) / 2)  # 40/20 and 30/30
    assert row["vs_peer_after"] == pytest.approx((4.0 + 3.0) / 2)
    assert "linear:chunkwise" not in set(df["impl"])  # failed rows are not read
    written = before_after.write(tmp_path, base, current, peers, "abc")
    text = written.read_text()
    assert "| `local:efficient` | fwd | no | 8192 | 57.1 % | 100.0 % |" in text
    assert "matmul rate, before (abc)" in text
    assert (tmp_path / "before-after.csv").read_text().count("\n") == 3  # header, two paths
