"""No path of the machine in a result file: sidecars and tables record paths relative to the
working directory or to their own folder, and the committed results hold none."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.runtime.portable import portable
from tests.helpers.extrapolation import TINY, make_corpus

ROOT = Path(__file__).resolve().parents[2]
#: An absolute path where a result file could have picked one up: a home, the checkout, a
#: scratch folder, a virtual environment's interpreter.
MACHINE_PATH = re.compile(r"(?<![\w:/.~])/(?:work|root|home|Users|tmp|var|private|opt|usr)/")


def test_portable_rewrites_absolute_paths_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "x"
    value = {
        "command": f"attnbench run speed --suite {tmp_path}/suites/ci.toml --out {out}",
        "argv": ["/opt/venv/bin/attnbench", f"--checkpoints={out}/ck", "--lr", "3e-4"],
        "corpus": "/data/books/shakespeare.txt",
        "link": "https://arxiv.org/abs/2202.10447",
        "relative": ["suites/ci.toml", "./a/b", "~/x"],
        "numbers": [1, 2.5, None, True],
    }
    got = portable(value, out)
    assert got["command"] == "attnbench run speed --suite suites/ci.toml --out runs/x"
    assert got["argv"] == ["attnbench", "--checkpoints=runs/x/ck", "--lr", "3e-4"]
    assert got["corpus"] == os.path.relpath("/data/books/shakespeare.txt", out)
    assert not got["corpus"].startswith("/")
    assert got["link"] == value["link"] and got["relative"] == value["relative"]
    assert got["numbers"] == value["numbers"]


def _text_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.suffix in (".json", ".md", ".csv", ".jsonl")]


def _no_machine_path(folder: Path, *roots: Path) -> None:
    for path in _text_files(folder):
        text = path.read_text(encoding="utf-8")
        for root in roots:
            assert str(root) not in text, f"{path} holds {root}"
        assert not MACHINE_PATH.search(text), f"{path}: {MACHINE_PATH.search(text).group(0)}"


def _attnbench(args: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "attnbench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_new_result_files_hold_no_path_of_the_machine(tmp_path):
    """Runs given absolute paths, inside and outside the working directory, write none."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    speed = elsewhere / "speed"
    _attnbench(["run", "speed", "--impl", "softmax", "--no-causal", "--direction", "fwd",
                "--lengths", "16", "--rounds", "2", "--device", "cpu", "--threads", "1",
                "--no-plot", "--out", str(speed)], work)  # fmt: skip
    corpus = make_corpus(work / "corpus.txt")
    _attnbench(["run", "extrapolate", "--preset", "cpu", "--variants", "O", "--seeds", "1", *TINY,
                "--eval-time", "none", "--corpus", str(corpus), "--out", str(work / "ex"),
                "--checkpoints", str(elsewhere / "ck")], work)  # fmt: skip
    _no_machine_path(speed, tmp_path, ROOT)
    _no_machine_path(work / "ex", tmp_path, ROOT)
    sidecar = (work / "ex" / "extrapolate.json").read_text()
    assert '"corpus.txt' in sidecar or "corpus.txt" in sidecar


def test_committed_results_hold_no_path_of_the_machine():
    _no_machine_path(ROOT / "results")
