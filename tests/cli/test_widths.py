"""What the command line prints at 80 and 200 columns (issue 35): the help shows every command's
one-sentence summary and every paragraph whole, nothing is cut ("…"), the progress bars keep
their numbers, and a run that measured nothing says so instead of squeezing its summary into an
8-character table."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from attnbench.cli import app
from attnbench.cli.common import command_help
from attnbench.cli.progress import RichProgress
from attnbench.cli.speed_report import SweepBar

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (80, 200)


def attnbench(args: list[str], columns: int, cwd: Path | None = None) -> str:
    """stdout of the real executable on a terminal ``columns`` wide (exit code 0 asserted)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)}
    done = subprocess.run(
        [sys.executable, "-m", "attnbench", *args], cwd=cwd, capture_output=True, text=True,
        env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def commands() -> dict[str, object]:
    """Every command (``run speed`` as "run speed") -> its function."""
    found = {}
    for info in app.registered_commands:
        found[info.name] = info.callback
    for group in app.registered_groups:
        for info in group.typer_instance.registered_commands:
            found[f"{group.name} {info.name}"] = info.callback
    return found


def plain(text: str) -> str:
    """Help text without the panels' borders, whitespace collapsed: what a reader reads."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_every_command_has_a_one_sentence_summary():
    for name, fn in commands().items():
        summary = command_help(fn)["short_help"]
        first = command_help(fn)["help"].split("\n\n")[0]
        assert summary == first and summary.endswith("."), (name, first)
        assert len(summary) <= 100, (name, summary)  # a line of the list at 120 columns


@pytest.mark.parametrize("columns", WIDTHS)
def test_the_command_list_shows_each_summary_whole(columns):
    for group, names in (([], ("list", "check", "plot", "merge")), (["run"], ("speed",))):
        text = attnbench([*group, "--help"], columns)
        assert "…" not in text
        for name in names:
            summary = command_help(commands()[" ".join([*group, name])])["short_help"]
            assert summary in plain(text), (name, text)
            if columns == 200:  # room for the whole sentence: one line
                assert any(summary in line for line in text.splitlines()), (name, text)


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize(
    "name", ["check", "compare", "run speed", "run extrapolate", "gate", "gpu-check"]
)
def test_a_commands_help_is_whole_at_any_width(name, columns):
    """No hard line break inside a paragraph (at 200 columns each one is one line), and no
    option name or help text cut with an ellipsis (at 80 columns the option table is tight)."""
    text = attnbench([*name.split(), "--help"], columns)
    assert "…" not in text, text
    assert "--mem-tolerance-other" in text or name != "compare"
    for paragraph in command_help(commands()[name])["help"].split("\n\n"):
        shown = re.sub(r"\[/?bold\]", "", paragraph)
        assert shown in plain(text), (shown, text)
        if columns == 200 and len(shown) < 190:
            assert any(shown in line for line in text.splitlines()), (shown, text)


@pytest.mark.parametrize("columns", WIDTHS)
def test_a_run_that_measured_nothing_says_so_in_one_line(columns, tmp_path):
    """Every case unsupported here (a CUDA path on a CPU, no reference): before, the summary
    table had one empty 8-character column, and its title and caption were folded into it."""
    args = ["run", "speed", "--impl", "softmax:sdpa-flash", "--device", "cpu", "--reference"]
    args += ["none", "--lengths", "16", "--direction", "fwd", "--no-causal", "--out", "o"]
    text = attnbench([*args, "--no-plot"], columns, cwd=tmp_path)
    lines = text.splitlines()
    assert lines[0] == "speed summary (0 s): no case was measured", text
    assert "not run here, 1 paths (needs CUDA): softmax:sdpa-flash" in lines
    assert "┏" not in text and "more columns" not in text
    assert all(len(line) <= columns for line in lines)


def bar_line(draw, columns: int) -> str:
    """The last state of a progress bar drawn on a terminal ``columns`` wide."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=columns, force_terminal=True, color_system=None)
    draw(console)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buffer.getvalue().split("\r")[-1]).strip()


@pytest.mark.parametrize("columns", WIDTHS)
def test_the_sweep_bar_keeps_its_numbers(columns):
    def draw(console):
        bar = SweepBar(console)
        bar.start("speed on AMD EPYC 7B13 64-Core Processor", 240)
        bar.stage("n=2048 causal d=32 float32")
        bar.note("round 3")
        bar.advance(120, row={"status": "ok"})
        bar.progress.refresh()
        bar.finish()

    line = bar_line(draw, columns)
    assert "120/240" in line and "0:00:0" in line and "━" in line, line
    assert "n=2048 causal d=32 float32 round 3" in line, line


@pytest.mark.parametrize("columns", WIDTHS)
def test_the_training_bar_cuts_a_long_label_not_its_numbers(columns):
    label = "flash-tiled:efficient(tile=64) seed 0 (shard 1/3)"

    def draw(console):
        bar = RichProgress(console)
        bar.start(label, 3000)
        bar.advance(1200, loss=2.345, tokens_per_s=123456.0)
        bar._bar.refresh()
        bar.finish()

    line = bar_line(draw, columns)
    for part in ("1200/3000", "loss 2.345", "123,456 tok/s", "0:00:0", "━"):
        assert part in line, (part, line)
    assert len(line) <= columns
    assert (label in line) == (columns == 200), line
