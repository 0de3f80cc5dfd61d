"""Every interrupted command says, in one line on stderr, what Ctrl-C stopped and what is kept,
and exits 130 with no traceback: through the real executable during an evaluation, and for
each of `run speed`, `run extrapolate` and `run entropy` wherever the interrupt lands."""

from __future__ import annotations

import csv
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.runtime.interrupts import Stopped
from tests.helpers.extrapolation import make_corpus
from tests.helpers.processes import ENV, start, wait_for

runner = CliRunner()

#: Two small models (trained in seconds) whose evaluation takes several seconds each (idle: about
#: 6 s; the signal must land inside E's, however slow the start of its line on a loaded machine;
#: with half the tokens, about 3 s, one clean-clone CI run saw E's evaluation end first).
SLOW_EVALUATION = [
    "--d-model", "256", "--layers", "2", "--heads", "2", "--train-len", "16", "--batch", "8",
    "--steps", "12", "--warmup", "2", "--threads", "1", "--ckpt-every", "5",
    "--variants", "O,E", "--eval-time", "none", "--eval-lengths", "16,32,64,128,256,512",
    "--eval-tokens", "60000",
]  # fmt: skip


def test_ctrl_c_during_evaluation_is_one_line_with_the_rows_kept(tmp_path):
    corpus = make_corpus(tmp_path / "c.txt", words=160000)  # held-out text for 60,000 tokens
    out, err = tmp_path / "x", tmp_path / "err.txt"
    args = ["run", "extrapolate", "--corpus", str(corpus), *SLOW_EVALUATION, "--out", str(out)]
    trained = subprocess.run([sys.executable, "-m", "attnbench", *args, "--train-only"],
                             cwd=tmp_path, env=ENV, capture_output=True, text=True,
                             timeout=300)  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    driver = start([*args, "--resume"], tmp_path, err)
    # O is evaluated and its rows written; E is loaded, then evaluated for several seconds.
    wait_for(lambda: "E seed 0: trained (12 steps), loading" in err.read_text(), "E's evaluation")
    time.sleep(0.3)
    driver.send_signal(signal.SIGINT)
    assert driver.wait(timeout=60) == 130, err.read_text()
    said = err.read_text()
    assert "Traceback" not in said and "Aborted" not in said, said
    last = said.rstrip().splitlines()[-1]
    assert [line for line in said.splitlines() if "interrupted" in line] == [last], said
    found = re.fullmatch(
        rf"interrupted during evaluation; (\d+) finished rows are in "
        rf"{re.escape(str(out / 'extrapolate.csv'))}; continue with --resume",
        last,
    )
    assert found, last
    with (out / "extrapolate.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert int(found[1]) == len(rows) > 0
    assert {row["variant"] for row in rows} == {"O"}  # O's rows, whole; E's never began


# --------------------------------------------------------------------------------------------
# One line for each command, wherever the interrupt lands (the library stood in for)
# --------------------------------------------------------------------------------------------


def interrupted(args: list[str]) -> str:
    """Run the command; check that it exits 130 with one line on stderr and no traceback;
    return that line."""
    result = runner.invoke(app, args, prog_name="attnbench")
    assert result.exit_code == 130, result.output
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("command", "target"),
    [
        (["run", "speed", "--impl", "softmax"], "attnbench.bench.config.load_suite"),
        (["run", "entropy"], "attnbench.extrapolation.experiment.entropy.run_entropy"),
        (["run", "extrapolate"], "attnbench.extrapolation.experiment.run.run_extrapolate"),
    ],
)
def test_an_interrupt_nothing_reported_names_the_command(monkeypatch, tmp_path, command, target):
    monkeypatch.setattr(target, ctrl_c)
    line = interrupted([*command, "--out", str(tmp_path / "out")])
    assert line == (
        f"interrupted `attnbench {' '.join(command[:2])}` before it finished; the files it "
        "finished writing are kept"
    )


def test_the_librarys_own_line_is_printed_as_it_is(monkeypatch, tmp_path):
    def stopped(*args, **kwargs):
        raise Stopped("during evaluation", "3 finished rows are in x.csv; continue with --resume")

    monkeypatch.setattr("attnbench.extrapolation.experiment.run.run_extrapolate", stopped)
    line = interrupted(["run", "extrapolate", "--out", str(tmp_path / "out")])
    assert line == (
        "interrupted during evaluation; 3 finished rows are in x.csv; continue with --resume"
    )


def test_a_stopped_training_says_its_step_and_checkpoint(monkeypatch, tmp_path):
    from attnbench.extrapolation.training.loop import Interrupted

    def interrupted_training(*args, **kwargs):
        raise Interrupted(Path("ck/O-seed0.pt"), 31, 300)

    monkeypatch.setattr(
        "attnbench.extrapolation.experiment.run.run_extrapolate", interrupted_training
    )
    line = interrupted(["run", "extrapolate", "--out", str(tmp_path / "out")])
    assert line == "interrupted at step 31/300; checkpoint ck/O-seed0.pt; continue with --resume"


def test_ctrl_c_while_the_command_modules_import_is_one_line(monkeypatch, capsys):
    """The executable imports the command modules (torch among them, a second or two) inside
    the one place that turns a Ctrl-C into a line: no traceback, exit 130."""
    import builtins

    from attnbench import launch

    real_import = builtins.__import__

    def interrupted_import(name, *args, **kwargs):
        if name == "attnbench.cli.app":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted_import)
    with pytest.raises(SystemExit) as stop:
        launch.main()
    assert stop.value.code == 130
    said = capsys.readouterr().err
    assert said == "stopped while starting; nothing was run\n"
