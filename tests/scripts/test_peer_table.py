"""scripts/peer_table.py: a path read against the machine, dense SDPA and its peers in one run,
checked by hand on a made-up run."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from scripts import peer_table

COLUMNS = ["mechanism", "path", "direction", "causal", "seq_len", "status", "time_median_ms",
           "ref_ratio", "roofline"]  # fmt: skip


def write_run(tmp_path: Path) -> Path:
    rows = [
        ("local", "efficient", "fwd", False, 8192, "ok", 10.0, 0.05, 0.40),
        ("local", "efficient", "fwdbwd", False, 8192, "ok", 30.0, 0.04, 0.35),
        ("local", "flex", "fwd", False, 8192, "ok", 25.0, 0.125, 0.16),
        ("local", "flex", "fwdbwd", False, 8192, "unsupported", "", "", ""),
        ("local", "local-attention", "fwd", False, 8192, "ok", 20.0, 0.1, 0.2),
        ("local", "efficient", "fwd", True, 8192, "ok", 99.0, 0.5, 0.1),  # causal: not read
        ("local", "efficient", "fwd", False, 4096, "ok", 5.0, 0.1, 0.3),  # other n: not read
    ]
    path = tmp_path / "results.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    return path


def test_ratios_are_the_peers_time_over_the_paths_in_the_same_run(tmp_path, capsys):
    results = write_run(tmp_path)
    peer_table.main([str(results), "--n", "8192", "--impl", "local:efficient",
                     "--peer", "local:efficient=:flex",
                     "--peer", "local:efficient=local:local-attention",
                     "--csv", str(tmp_path / "t.csv")])  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| path | direction | matmul rate | vs dense SDPA | vs `flex` |")
    fwd, fwdbwd = out[2], out[3]
    # fwd: 40 % of the matmul rate, 1 / 0.05 = 20x SDPA, flex 25 / 10 = 2.5x (16 %),
    # local-attention 20 / 10 = 2x (20 %)
    assert fwd == "| `local:efficient` | fwd | 40.0 % | 20.00x | 2.50x | 16.0 % | 2.00x | 20.0 % |"
    # fwd+bwd: flex did not run (forward only), local-attention has no such row
    assert fwdbwd == (
        "| `local:efficient` | fwd+bwd | 35.0 % | 25.00x | - (unsupported) | - | "
        "- (not in the run) | - |"
    )
    assert (tmp_path / "t.csv").read_text().count("\n") == 3


def test_bad_arguments_are_one_line(tmp_path):
    results = write_run(tmp_path)
    with pytest.raises(SystemExit, match="expected PATH=PEER"):
        peer_table.main([str(results), "--n", "8192", "--impl", "local:efficient", "--peer", "x"])
    with pytest.raises(SystemExit, match="has a row at n = 5"):
        peer_table.main([str(results), "--n", "5", "--impl", "local:efficient"])
    with pytest.raises(SystemExit, match="is not a file"):
        peer_table.main([str(tmp_path / "nope.csv"), "--n", "5", "--impl", "local:efficient"])
