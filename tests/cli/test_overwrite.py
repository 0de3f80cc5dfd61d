"""No command writes over an input, or over results it did not make, unless told (issue 63): one
rule (:func:`attnbench.runtime.outputs.refuse_to_replace`) that every command which writes
applies before it writes anything; a refusal is one line on stderr, exit code 2, and every file
as it was. Commands run in this process (the executable's own exit path is covered by
tests/cli/test_errors.py)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.bench.sweep import run_sweep
from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.runtime.outputs import refuse_to_replace
from tests.helpers.costreport import speed_row, table_row, write_extrapolation, write_speed
from tests.helpers.extrapolation import TINY, make_corpus
from tests.helpers.results import result_row, write_results
from tests.helpers.speed import tiny

runner = CliRunner()
PRECIOUS = "precious: another run's results\n"


def snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(args: list, cwd: Path, *words: str) -> str:
    """``attnbench ARGS`` in ``cwd`` is refused in one line (exit 2) with ``words`` in it, and
    leaves every file under ``cwd`` as it was; returns the line."""
    before = snapshot(cwd)
    done = runner.invoke(app, [str(a) for a in args])
    lines = done.stderr.strip().splitlines()
    assert done.exit_code == 2, done.output
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert snapshot(cwd) == before  # nothing written, nothing replaced
    return lines[0]


def ok(args: list) -> None:
    done = runner.invoke(app, [str(a) for a in args])
    assert done.exit_code == 0, done.output


@pytest.fixture
def results(tmp_path, monkeypatch) -> Path:
    """A results CSV (two ok rows) in ``tmp_path/A``, the working folder ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "A").mkdir()
    rows = [result_row(n=n) for n in (256, 512)]
    return write_results(tmp_path / "A" / "results.csv", rows)


# --------------------------------------------------------------------------------------------
# The rule
# --------------------------------------------------------------------------------------------


def test_the_rule_refuses_an_input_even_with_overwrite_and_a_file_without_it(tmp_path):
    given = tmp_path / "in.csv"
    given.write_text("data")
    (tmp_path / "link.csv").symlink_to(given)
    for target in (given, tmp_path / "link.csv", tmp_path / "." / "in.csv"):
        for overwrite in (False, True):
            with pytest.raises(AttnbenchError, match=r"is the input .*in\.csv; writing there"):
                refuse_to_replace([target], option="--out", inputs=[given], overwrite=overwrite)
    (tmp_path / "old.md").write_text("old")
    with pytest.raises(AttnbenchError, match=r"^--markdown .*old\.md already exists; choose "):
        refuse_to_replace([tmp_path / "old.md"], option="--markdown", inputs=[given])
    refuse_to_replace([tmp_path / "old.md"], option="--markdown", inputs=[given], overwrite=True)
    refuse_to_replace([tmp_path / "new.md"], option="--markdown", inputs=[given])


def test_the_rule_names_what_a_folder_already_holds(tmp_path):
    names = ["a.csv", "b.json", "c.png", "d.png", "e.png"]
    for name in names[:4]:
        (tmp_path / name).write_text("x")
    with pytest.raises(AttnbenchError) as info:
        refuse_to_replace([tmp_path / n for n in names], option="--out", folder=tmp_path)
    assert str(info.value) == (
        f"--out {tmp_path} already holds a.csv, b.json, c.png and 1 more; choose another "
        "folder or pass --overwrite to replace them"
    )


# --------------------------------------------------------------------------------------------
# Command by command
# --------------------------------------------------------------------------------------------


def test_compare_never_writes_its_markdown_over_an_input(results, tmp_path):
    (tmp_path / "B").mkdir()
    baseline = write_results(tmp_path / "B" / "results.csv", [result_row(n=n) for n in (256, 512)])
    for target in (baseline, results, tmp_path / "B" / "results.json", "B/samples.jsonl"):
        refused(["compare", results, baseline, "--markdown", target, "--overwrite"], tmp_path,
                "is the input", "choose another file")  # fmt: skip
    (tmp_path / "cmp.md").write_text(PRECIOUS)
    refused(["compare", results, baseline, "--markdown", "cmp.md"], tmp_path,
            "--markdown cmp.md already exists", "--overwrite")  # fmt: skip
    ok(["compare", results, baseline, "--markdown", "cmp.md", "--overwrite"])
    assert (tmp_path / "cmp.md").read_text().startswith("## attnbench compare")


def test_export_never_writes_its_json_over_its_input(results, tmp_path):
    refused(["export", results, "--to", "bencher", "--out", results, "--overwrite"], tmp_path,
            f"--out {results} is the input {results}")  # fmt: skip
    (tmp_path / "x.json").write_text(PRECIOUS)
    refused(["export", results, "--to", "bencher", "--out", "x.json"], tmp_path,
            "--out x.json already exists")  # fmt: skip
    ok(["export", results, "--to", "bencher", "--out", "x.json", "--overwrite"])
    assert (tmp_path / "x.json").read_text().startswith("{")


def test_plot_redraws_its_own_figures_and_refuses_another_folders(results, tmp_path):
    ok(["plot", results])  # figures/ beside the CSV: its own, drawn again each time
    ok(["plot", results])
    drawn = sorted(p.name for p in (tmp_path / "A" / "figures").iterdir())
    figures = tmp_path / "figs"
    figures.mkdir()
    (figures / drawn[0]).write_text(PRECIOUS)
    refused(["plot", results, "--out", figures], tmp_path, f"--out {figures} already holds "
            f"{drawn[0]}")  # fmt: skip
    ok(["plot", results, "--out", figures, "--overwrite"])
    assert (figures / drawn[0]).read_bytes().startswith(b"\x89PNG")


def test_plot_of_an_extrapolation_table_refuses_another_runs_figure(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = write_extrapolation(tmp_path / "ex", [table_row("O", n, 60.0) for n in (64, 128)])
    ok(["plot", table / "extrapolate.csv"])  # beside the table: its own figure, redrawn
    ok(["plot", table / "extrapolate.csv"])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "accuracy_vs_length.png").write_text(PRECIOUS)
    refused(["plot", table / "extrapolate.csv", "--out", "other"], tmp_path,
            "--out other already holds accuracy_vs_length.png")  # fmt: skip


def test_show_refuses_to_replace_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.png").write_text(PRECIOUS)
    refused(["show", "local", "--n", "16", "--out", "p.png"], tmp_path, "--out p.png already")
    ok(["show", "local", "--n", "16", "--out", "p.png", "--overwrite"])


def test_report_refuses_an_earlier_report_unless_told(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [table_row("O", n, 60.0, seed) for n in (64, 256) for seed in range(2)]
    ex = write_extrapolation(tmp_path / "ex", rows)
    sp = write_speed(tmp_path / "sp", [speed_row("softmax", "efficient", n) for n in (64, 256)])
    out = tmp_path / "r"
    out.mkdir()
    (out / "report.md").write_text(PRECIOUS)
    refused(["report", ex, sp, "--out", out], tmp_path, f"--out {out} already holds report.md")
    ok(["report", ex, sp, "--out", out, "--overwrite"])
    assert "## The mapping" in (out / "report.md").read_text()


def test_entropy_refuses_an_earlier_run_unless_told(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "entropy.json").write_text(PRECIOUS)
    args = ["run", "entropy", "--out", "e", "--max-n", "32", "--queries", "4", "--trials", "1"]
    refused(args, tmp_path, "--out e already holds entropy.json", "--overwrite")
    ok([*args, "--overwrite"])
    assert (tmp_path / "e" / "entropy.json").read_text().startswith("{")


def test_extrapolate_refuses_another_runs_table_before_training(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus = make_corpus(tmp_path / "c.txt")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "extrapolate.csv").write_text(PRECIOUS)
    args = ["run", "extrapolate", *TINY, "--corpus", corpus, "--variants", "E", "--out", "x"]
    refused(args, tmp_path, "--out x already holds extrapolate.csv", "--overwrite")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """The folder of a unit-wise speed run (one mechanism, every unit finished), merged."""
    root = tmp_path_factory.mktemp("sweep")
    run_sweep(tiny(mechanisms=("softmax",)), root / "units", log=lambda _: None)
    return root / "units"


def test_merge_replaces_its_own_sweeps_results_and_refuses_another_run(sweep, tmp_path):
    ok(["merge", sweep, "--out", sweep, "--no-plot"])  # the shards' folder: merged again
    ok(["merge", sweep, "--out", sweep, "--no-plot"])
    ok(["merge", sweep, "--out", tmp_path / "m", "--no-plot"])  # its plan travels with it
    ok(["merge", sweep, "--out", tmp_path / "m", "--no-plot"])
    other = tmp_path / "single"
    other.mkdir()
    write_results(other / "results.csv", [result_row(n=256)])
    (other / "samples.jsonl").write_text(PRECIOUS)
    refused(["merge", sweep, "--out", other, "--no-plot"], tmp_path,
            f"--out {other} already holds results.csv, samples.jsonl", "--overwrite")  # fmt: skip
    ok(["merge", sweep, "--out", other, "--no-plot", "--overwrite"])


def test_run_speed_refuses_a_folder_that_holds_results(results, tmp_path):
    refused(["run", "speed", "--impl", "softmax", "--lengths", "16", "--out", "A"], tmp_path,
            "--out A already holds results.csv", "--overwrite")  # fmt: skip


def test_gate_refuses_another_grids_results_and_an_empty_base(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "speed-run"
    out.mkdir()
    write_results(out / "results.csv", [result_row(n=256)])
    (out / "results.json").write_text('{"suite": {"name": "speed"}}')
    refused(["gate", "--out", out], tmp_path, f"--out {out} already holds results.csv")
    refused(["gate", "--base", "", "--out", "g"], tmp_path,
            "--base '': accepted: a git revision")  # fmt: skip
    refused(["gate", "--base", "  ", "--out", "g"], tmp_path, "a git revision")


def test_every_command_that_writes_has_overwrite():
    """The commands that write a file a user names: each takes --overwrite (the rule's way
    out), and its help says so."""
    for args in (["compare"], ["export"], ["merge"], ["plot"], ["report"], ["show"], ["gate"],
                 ["run", "speed"], ["run", "extrapolate"], ["run", "entropy"]):  # fmt: skip
        done = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
        assert done.exit_code == 0 and "--overwrite" in done.stdout, (shlex.join(args), done)


@pytest.mark.skipif(os.name == "nt", reason="POSIX permissions")
def test_a_command_never_replaces_what_it_reads_through_a_link(results, tmp_path):
    (tmp_path / "alias.csv").symlink_to(results)
    refused(["export", "alias.csv", "--to", "bencher", "--out", results, "--overwrite"],
            tmp_path, "is the input alias.csv")  # fmt: skip
