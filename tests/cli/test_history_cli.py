"""``attnbench history add|steps|report`` as typed (in process): what each prints, and bad input
as one line and exit code 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from tests.helpers.history import commit_line, sha

runner = CliRunner()


@pytest.fixture
def runs(tmp_path):
    """20 commits; gau 1.3x slower from commit 10 on."""
    levels = [{"local": 0.5, "gau": 1.2 * (1.3 if i >= 10 else 1.0)} for i in range(20)]
    return commit_line(tmp_path / "runs", levels)


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_add_steps_and_report(runs, tmp_path):
    history = str(tmp_path / "history")
    done = invoke("history", "add", *map(str, runs), "--history", history)
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0].startswith(f"{runs[0]}: added, commit {sha(0)[:10]}, 5 rows (cpu|")
    assert lines[-1] == f"history {history}: 20 runs"
    again = invoke("history", "add", str(runs[3]), "--history", history)
    assert f"already in the history (commit {sha(3)[:10]})" in again.output
    steps = invoke("history", "steps", "--history", history, "--format", "json")
    assert steps.exit_code == 0
    found = json.loads(steps.output)
    assert found["series"] == 5 and len(found["changes"]) == 2
    assert {c["first_commit_after"] for c in found["changes"]} == {sha(10)}
    table = invoke("history", "steps", "--history", history)
    assert "step, slower" in table.output
    assert table.output.splitlines()[-1] == (
        "history steps: 5 series, 2 changes beyond x1.1 (2 slower, 0 faster)"
    )
    page = invoke("history", "report", "--history", history, "--out", str(tmp_path / "page"))
    assert page.exit_code == 0
    assert page.output.strip() == (
        f"wrote {tmp_path / 'page' / 'index.html'}: 2 plots, 5 series, 2 steps and drifts "
        "beyond x1.1"
    )
    html = (tmp_path / "page" / "index.html").read_text()
    assert html.count('<circle class="point"') == 100 and html.count('<g class="step">') == 2
    # --last 8: commits 12..19 plotted, the step at commit 10 only in the table
    invoke("history", "report", "--history", history, "--out", str(tmp_path / "p8"), "--last", "8")
    html = (tmp_path / "p8" / "index.html").read_text()
    assert html.count('<circle class="point"') == 40 and html.count('<g class="step">') == 0
    assert "the last 8 of 20 commits" in html and html.count("step, slower") == 2


def test_the_history_folder_from_the_environment(runs, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_HISTORY", str(tmp_path / "from-env"))
    assert invoke("history", "add", str(runs[0])).exit_code == 0
    assert (tmp_path / "from-env" / "history.sqlite").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["steps", "--history", "{tmp}/none"], "no results history there (history.sqlite)"),
        (["add", "{tmp}/nothing", "--history", "{tmp}/h"], "no such results file"),
        (["add", "{run0}", "{run1}", "--commit", "abc", "--history", "{tmp}/h"],
         "--commit names the commit of one run"),
        (["steps", "--history", "{tmp}/h", "--threshold", "0.9"],
         "--threshold 0.9: accepted: a factor > 1"),
        (["steps", "--history", "{tmp}/h", "--metric", "memory"],
         "--metric 'memory': accepted: auto, time"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(runs, tmp_path, args, message):
    invoke("history", "add", str(runs[0]), "--history", str(tmp_path / "h"))
    filled = [a.format(tmp=tmp_path, run0=runs[0], run1=runs[1]) for a in args]
    done = invoke("history", *filled)
    assert done.exit_code == 2, done.output
    (line,) = done.output.strip().splitlines()
    assert line.startswith("error: ") and message in line, line


@pytest.mark.parametrize("name", ["add", "steps", "report"])
def test_help_has_an_example(name):
    done = invoke("history", name, "--help")
    assert done.exit_code == 0 and "Example" in done.output
