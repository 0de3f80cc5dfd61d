"""CSVs saved by a spreadsheet start with a UTF-8 byte-order mark (issue 35): every CSV reader of
attnbench reads them as the same file without it (before, the first column was ``\\ufeffsuite``
and every command refused the file: "schema differs (unexpected \\ufeffsuite)")."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from attnbench.bench.results import ADDED_COLUMNS, COLUMNS, ResultsWriter, cell, read_results
from attnbench.extrapolation.analysis.figures import TABLE_COLUMNS, is_table_csv
from attnbench.extrapolation.training.curves import is_curves_csv, read_curves
from tests.helpers.results import reference_row, row, write_results

ROOT = Path(__file__).resolve().parents[2]
BOM = "\ufeff".encode()


def with_bom(path: Path, target: Path) -> Path:
    """``path``'s bytes behind a byte-order mark, as a spreadsheet saves the file."""
    target.write_bytes(BOM + path.read_bytes())
    return target


def results_pair(tmp_path: Path) -> tuple[Path, Path]:
    plain = write_results(tmp_path / "plain.csv", [reference_row(), row()])
    return plain, with_bom(plain, tmp_path / "bom.csv")


def test_a_results_csv_with_a_bom_reads_as_without(tmp_path):
    plain, bom = results_pair(tmp_path)
    pd.testing.assert_frame_equal(read_results(bom), read_results(plain))


def test_resuming_into_an_older_results_csv_with_a_bom_widens_its_header(tmp_path):
    """A resumed run appends today's rows: the older header is widened first, BOM or not."""
    older = [c for c in COLUMNS if c not in ADDED_COLUMNS]
    path = tmp_path / "results.csv"
    with path.open("w", newline="", encoding="utf-8-sig") as f:
        writer = csv.writer(f)
        writer.writerow(older)
        writer.writerow([cell(row()[c]) for c in older])
    ResultsWriter(path, append=True).close()
    header = next(csv.reader(path.open(newline="", encoding="utf-8-sig")))
    assert tuple(header) == COLUMNS
    assert len(read_results(path)) == 1


def test_the_extrapolation_tables_with_a_bom_are_recognised(tmp_path):
    table = tmp_path / "extrapolate.csv"
    table.write_text(
        "\ufeff" + ",".join(TABLE_COLUMNS) + "\nO,trained,0,64,128,0.5,ok\n", encoding="utf-8"
    )
    assert is_table_csv(table)
    curves = tmp_path / "curves.csv"
    curves.write_text("\ufeffvariant,seed,step,loss\nO,0,1,2.5\nO,0,2,2.4\n", encoding="utf-8")
    assert is_curves_csv(curves)
    assert list(read_curves(curves)["loss"]) == [2.5, 2.4]


def attnbench(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnbench", *args], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
    )  # fmt: skip


def test_the_commands_read_a_results_csv_with_a_bom(tmp_path):
    """Through the real executable: export gives the same JSON as for the file without the
    mark, and compare takes it on either side."""
    plain, bom = results_pair(tmp_path)
    exported = [attnbench(["export", p.name, "--to", "bencher"], tmp_path) for p in (bom, plain)]
    assert [e.returncode for e in exported] == [0, 0], exported[0].stderr
    assert json.loads(exported[0].stdout) == json.loads(exported[1].stdout)
    compared = attnbench(["compare", "bom.csv", "plain.csv"], tmp_path)
    assert compared.returncode == 0, compared.stderr
    assert "ufeff" not in compared.stdout + compared.stderr
