"""``attnbench report`` end to end on tiny synthetic folders: the files it writes (joined CSV,
figure, report.md with the mapping and the not-joined list), and bad input: one line, exit 2,
nothing written."""

from __future__ import annotations

import csv

import matplotlib.image
import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.costreport.figure import panel_title
from attnbench.costreport.mapping import EVAL_TIME, TRAINED
from tests.helpers.costreport import (
    TABLE_HEADER,
    speed_row,
    table_row,
    write_extrapolation,
    write_speed,
)

runner = CliRunner()


def folders(tmp_path):
    rows = []
    for n in (64, 256):
        for seed in range(3):
            rows.append(table_row("O", n, 60.0 - n / 64 + seed, seed))
            rows.append(table_row("O+chunk", n, 58.0 + seed, seed))
            rows.append(table_row("O+hwfa", n, 57.0, seed))
        rows.append(table_row("count-baseline", n, 55.0, seed=None, kind="baseline"))
    speed = [speed_row("softmax", "efficient", n, time_median_ms=n / 64) for n in (64, 256)]
    speed += [
        speed_row("longnet", "efficient", n, params="segments=((64, 1),)", time_median_ms=0.5)
        for n in (64, 256)
    ]
    return write_extrapolation(tmp_path / "ex", rows), write_speed(tmp_path / "sp", speed)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_the_report_writes_its_csv_figure_and_markdown(tmp_path):
    ex, sp = folders(tmp_path)
    out = tmp_path / "out"
    done = invoke("report", ex, sp, "--out", out)
    assert done.exit_code == 0, done.output
    assert f"wrote {out / 'report.md'}" in done.stdout.replace("\n", "")  # rich wraps paths
    assert "not joined: O+hwfa (n = 64, 256) because the speed CSV has no bidirectional " in (
        done.stderr
    )
    image = matplotlib.image.imread(out / "accuracy_vs_cost.png")
    assert image.shape[0] > 400 and image.shape[1] > 800

    with (out / "accuracy_vs_cost.csv").open(newline="", encoding="utf-8") as f:
        lines = list(csv.DictReader(f))
    points = [(r["variant"], r["eval_len"], r["pareto"]) for r in lines if r["role"] == "point"]
    assert points == [("O", "64", "true"), ("O", "256", "false"), ("O+chunk", "64", "true"),
                      ("O+chunk", "256", "true")]  # fmt: skip
    floors = [(r["variant"], r["eval_len"], r["accuracy_mean"]) for r in lines[4:]]
    assert {r["role"] for r in lines[4:]} == {"floor"}
    assert floors == [("count-baseline", "64", "55"), ("count-baseline", "256", "55")]

    text = (out / "report.md").read_text(encoding="utf-8")
    assert "## n = 64 = L (training length)" in text and "## n = 256 (4 L)" in text
    assert "| O+chunk | eval-time | 59.00 [56.52, 61.48] | 3 | longnet:efficient |" in text
    assert "Floor (no model): count-baseline 55.00." in text
    assert "- O+hwfa (n = 64, 256) because the speed CSV has no bidirectional local" in text
    assert "(local_window = 32, rerope_window = 32 here)" in text
    mapping = text.split("## The mapping", 1)[1]
    assert mapping.count("\n| ") == 1 + len(EVAL_TIME) + len(TRAINED)  # header + one per entry
    assert "| O+chunk | longnet:efficient | segments={train_len}:1 | 1 |" in mapping
    assert "/tmp" not in text and str(tmp_path) not in text  # no path of this machine


def test_the_figure_marks_the_training_length():
    assert panel_title(64, 64) == "n = 64 = L (training length)"
    assert panel_title(512, 64) == "n = 512 (8 L)"


def header_only(folder):
    folder.mkdir()
    (folder / "extrapolate.csv").write_text(",".join(TABLE_HEADER) + "\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda tmp, ex, sp: (tmp / "nope", sp), "nope: no such folder; give the --out folder of "
         "`attnbench run extrapolate`"),
        (lambda tmp, ex, sp: (ex, tmp / "nope"), "nope: no such folder; give the --out folder of "
         "`attnbench run speed`"),
        (lambda tmp, ex, sp: (sp, sp), "sp has no extrapolate.csv"),
        (lambda tmp, ex, sp: (ex, ex), "ex has no results.csv"),
        (lambda tmp, ex, sp: (ex / "extrapolate.csv", sp), "extrapolate.csv is not a folder"),
        (lambda tmp, ex, sp: (header_only(tmp / "empty"), sp), "extrapolate.csv has no rows: "
         "nothing to report"),
        (lambda tmp, ex, sp: ((ex / "extrapolate.json").unlink() or ex, sp), "ex has no "
         "extrapolate.json beside extrapolate.csv"),
        (lambda tmp, ex, sp: (ex, write_speed(tmp / "sp0", [])), "results.csv has no rows"),
        (lambda tmp, ex, sp: (write_extrapolation(tmp / "odd", [table_row("O+nosuch", 64, 1.0)]),
                              sp), "joins a case of"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, make, words):
    ex, sp = make(tmp_path, *folders(tmp_path))
    out = tmp_path / "out"
    done = invoke("report", ex, sp, "--out", out)
    assert done.exit_code == 2, done.output
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], done.stderr
    assert not out.exists()
