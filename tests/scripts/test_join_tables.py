"""scripts/join_tables.py: rows of two runs in one table, a contrast across runs paired by seed
(checked against the differences computed here by hand), and a clear stop on a missing row."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from scripts import join_tables

COLUMNS = ["variant", "kind", "seed", "eval_len", "accuracy", "status"]


def write_run(path: Path, rows: list[tuple]) -> str:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    return str(path)


def run_rows(offset: float) -> list[tuple]:
    rows = []
    for seed in (0, 1, 2):
        for n in (64, 128):
            rows.append(("O", "trained", seed, n, 60.0 + seed + n / 64 + offset, "ok"))
            rows.append(("E", "trained", seed, n, 61.0 + seed, "ok"))
    rows.append(("count-baseline", "baseline", "", 64, 66.0, "ok"))
    return rows


def test_a_contrast_across_runs_is_paired_by_seed(tmp_path):
    a = write_run(tmp_path / "a.csv", run_rows(0.0))
    b = write_run(tmp_path / "b.csv", [(*r[:4], r[4] + (0.5 * r[2] if r[0] == "O" else 0), r[5])
                                       for r in run_rows(1.0)])  # fmt: skip
    out = tmp_path / "joined.md"
    args = ["--run", f"L=64={a}", "--run", f"vary={b}", "--seeds", "0,1,2", "--rows", "O"]
    join_tables.main([*args, "--contrast", "O [vary]", "O [L=64]", "--out", str(out)])
    text = out.read_text()
    assert "| O [L=64] | trained |" in text and "| O [vary] | trained |" in text
    assert "count-baseline" not in text and "Su 2021" not in text and "| E " not in text
    diffs = [1.0 + 0.5 * seed for seed in (0, 1, 2)]  # per seed, the same at both lengths
    mean = statistics.mean(diffs)
    row = next(line for line in text.splitlines() if line.startswith("| (O [vary]) − (O [L=64])"))
    assert row.count(f"+{mean:.1f} [") == 2 and "3/3 seeds positive" in row


def test_a_missing_row_stops_with_its_name(tmp_path):
    a = write_run(tmp_path / "a.csv", run_rows(0.0))
    with pytest.raises(SystemExit, match=r"no rows \['O\+logn'\]"):
        join_tables.main(["--run", f"x={a}", "--seeds", "0", "--rows", "O,O+logn",
                          "--out", str(tmp_path / "o.md")])  # fmt: skip
