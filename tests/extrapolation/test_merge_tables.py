"""``attnbench merge LABEL=RUN ...``: rows of extrapolation runs in one table, a contrast across
runs paired by seed (checked against the differences computed here by hand), and a one-line stop
on a missing row, on speed folders mixed in, and on a contrast not written A - B."""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

from typer.testing import CliRunner

from attnbench.cli import app

COLUMNS = ["variant", "kind", "seed", "eval_len", "accuracy", "status"]
runner = CliRunner()


def merge(*args: str) -> str:
    """``attnbench merge ARGS``; what it printed on stdout."""
    result = runner.invoke(app, ["merge", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def refused(*args: str, match: str) -> None:
    """``attnbench merge ARGS`` exits 2 with one line that matches ``match``."""
    result = runner.invoke(app, ["merge", *args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert re.search(match, lines[0]), lines[0]


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
    args = [f"L=64={a}", f"vary={b}", "--seeds", "0,1,2", "--rows", "O"]
    merge(*args, "--contrast", "O [vary] - O [L=64]", "--out", str(out))
    text = out.read_text()
    assert "| O [L=64] | trained |" in text and "| O [vary] | trained |" in text
    assert "count-baseline" not in text and "Su 2021" not in text and "| E " not in text
    diffs = [1.0 + 0.5 * seed for seed in (0, 1, 2)]  # per seed, the same at both lengths
    mean = statistics.mean(diffs)
    row = next(line for line in text.splitlines() if line.startswith("| (O [vary]) − (O [L=64])"))
    assert row.count(f"+{mean:.1f} [") == 2 and "3/3 seeds positive" in row


def test_a_missing_row_stops_with_its_name(tmp_path):
    a = write_run(tmp_path / "a.csv", run_rows(0.0))
    refused(
        f"x={a}",
        "--seeds",
        "0",
        "--rows",
        "O,O+logn",
        "--out",
        str(tmp_path / "o.md"),
        match=r"no rows \['O\+logn'\]",
    )


CELL_COLUMNS = ["variant", "kind", "seed", "train_len", "eval_len", "distance", "copy_length",
                "scored", "correct", "no_copy_correct", "accuracy", "no_copy_accuracy"]  # fmt: skip


def write_cells(folder: Path, seeds: tuple[int, ...], bonus: int) -> None:
    """longrange.csv of O and O+w: at d = 32 (< L) every byte right; at d = 64 and 96 (>= L)
    O+w gets ``bonus`` + seed more of 100 right than O's 40 + seed and 30."""
    with (folder / "longrange.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CELL_COLUMNS)
        for seed in seeds:
            for variant, extra in (("O", 0), ("O+w", bonus + seed)):
                for d, correct in ((32, 100), (64, 40 + seed), (96, 30)):
                    hits = correct if d < 64 else correct + extra
                    writer.writerow([variant, "trained", seed, 64, 128, d, 16, 100, hits, 10,
                                     hits / 100, 0.1])  # fmt: skip


def test_runs_of_one_label_pool_their_seeds_and_the_long_range_span_pools_beyond_l(tmp_path):
    parts = []
    for part, seeds in (("a", (0, 1)), ("b", (2,))):
        folder = tmp_path / part
        folder.mkdir()
        rows = [r for r in run_rows(0.0) if r[2] in seeds or r[2] == ""]
        rows += [("O+w", "trained", s, n, 70.0 + s, "ok") for s in seeds for n in (64, 128)]
        parts.append(write_run(folder / "extrapolate.csv", rows))
        write_cells(folder, seeds, bonus=5)
    out = tmp_path / "joined.md"
    merge(
        f"c={parts[0]}",
        f"c={parts[1]}",
        "--seeds",
        "0,1,2",
        "--rows",
        "O,O+w",
        "--contrast",
        "O+w [c] - O [c]",
        "--long-range",
        "--out",
        str(out),
    )
    text = out.read_text()
    standard, beyond = text.split("Long-range span")
    diffs = [70.0 + s - (60.0 + s + 1) for s in (0, 1, 2)]  # at n = 64: 9.0 on every seed
    assert f"+{statistics.mean(diffs):.1f} [" in standard and "3/3 seeds positive" in standard
    # beyond L: (2 * 5 + 2 * seed) more right of 200 scored = 5 + seed points
    gain = statistics.mean(5.0 + s for s in (0, 1, 2))
    row = next(line for line in beyond.splitlines() if line.startswith("| (O+w [c]) − (O [c])"))
    assert f"+{gain:.1f} [" in row and "3/3 seeds positive" in row
    o_seed0 = 100 * (40 + 30) / 200  # O's pooled accuracy, seed 0, d >= 64 only
    assert o_seed0 == 35.0 and "| O [c] | trained |" in beyond


def test_a_seed_in_two_runs_of_one_label_stops(tmp_path):
    a = write_run(tmp_path / "a.csv", run_rows(0.0))
    refused(
        f"x={a}",
        f"x={a}",
        "--seeds",
        "0,1",
        "--rows",
        "O",
        "--out",
        str(tmp_path / "o.md"),
        match=r"O \[x\] seed 0 at n = 64 is in two runs",
    )


def test_rows_of_one_label_may_come_from_different_runs(tmp_path):
    """O from one run, E from another (a row trained later beside the committed table)."""
    a = write_run(tmp_path / "a.csv", [r for r in run_rows(0.0) if r[0] != "E"])
    b = write_run(tmp_path / "b.csv", [r for r in run_rows(0.0) if r[0] != "O"])
    out = tmp_path / "joined.md"
    merge(
        f"t={a}",
        f"t={b}",
        "--seeds",
        "0,1,2",
        "--rows",
        "O,E",
        "--contrast",
        "E [t] - O [t]",
        "--out",
        str(out),
    )
    row = next(line for line in out.read_text().splitlines() if line.startswith("| (E [t])"))
    assert "+0.0 [" in row and "-1.0 [" in row  # E − O = 61 − (60 + n/64) at n = 64, 128


def test_a_seed_without_every_row_stops(tmp_path):
    """Seed 2 has O but not E (its evaluation was cut short): stop, not a table whose means
    hold seed 2 and whose contrast leaves it out."""
    a = write_run(tmp_path / "a.csv", [r for r in run_rows(0.0) if r[0] != "E" or r[2] != 2])
    refused(
        f"t={a}",
        "--seeds",
        "0,1,2",
        "--rows",
        "O,E",
        "--out",
        str(tmp_path / "o.md"),
        match=r"seed 2 has no rows \['E'\]",
    )


def test_a_folder_stands_for_its_table_and_bad_arguments_are_one_line(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_run(folder / "extrapolate.csv", run_rows(0.0))
    text = merge(f"r={folder}", "--seeds", "0,1", "--rows", "O,E", "--out", str(tmp_path / "j.md"))
    assert "| O [r] | trained |" in text and (tmp_path / "j.md").read_text() == text
    assert text.startswith("Made by: `")
    (tmp_path / "speed").mkdir()
    common = ["--seeds", "0", "--rows", "O", "--out", str(tmp_path / "x.md")]
    refused(f"r={folder}", str(tmp_path / "speed"), *common, match="merge one kind")
    refused(f"r={folder}", *common, "--contrast", "O [r]", match="accepted: 'A - B'")
    refused(f"r={folder}", "--out", str(tmp_path / "x.md"), match="needs --rows")
    refused(f"r={tmp_path / 'nothing'}", *common, match="no extrapolate.csv there")
    refused(
        str(tmp_path / "speed"),
        "--rows",
        "O",
        "--out",
        str(tmp_path / "m"),
        match="join extrapolation runs",
    )
