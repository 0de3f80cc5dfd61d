"""A full disk, command by command: the error names the file that could not be written (the OS
says ``No space left on device`` alone), exit code 2, no traceback; what was being written is
removed (no truncated image, no half CSV, no temporary file), what was written whole stays.

The disk is simulated in this process (a real small file system needs root): every file opened
for writing under the test's folder goes through :class:`FullDisk`, which lets the file named
``fills_at`` take a few bytes and then fails as a full disk does (ENOSPC, no file name), and
fails every write after it. That is what ``open`` gives the atomic writes, matplotlib's savefig,
pandas and torch.save alike."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench.bench.run import run_speed
from attnbench.bench.sweep import run_sweep
from attnbench.cli import app
from tests.helpers.extrapolation import TINY, make_corpus
from tests.helpers.speed import tiny

runner = CliRunner()
REAL_OPEN = builtins.open
#: A private temporary name of runtime.outputs: ``.NAME.HOST.PID.RANDOM.tmp``.
TEMPORARY = re.compile(r"^\..+\.\d+\.[0-9a-f]{8}\.tmp$")


class FullDisk:
    """Files opened for writing under ``root``: the ``nth`` one named ``fills_at`` (or a
    temporary name of it) takes ``keeps`` bytes, then the disk is full: that write and every
    later one under ``root`` raise ENOSPC."""

    def __init__(self, root: Path, fills_at: str, nth: int = 1, keeps: int = 64) -> None:
        self.root, self.fills_at, self.nth, self.keeps = root.resolve(), fills_at, nth, keeps
        self.seen = 0
        self.full = False

    def open(self, file, mode="r", *args, **kwargs):
        f = REAL_OPEN(file, mode, *args, **kwargs)
        if isinstance(file, int) or not set(mode) & set("wax+"):
            return f
        path = Path(file).resolve()
        if not path.is_relative_to(self.root):
            return f
        name = path.name
        if name == self.fills_at or (
            name.startswith(f".{self.fills_at}.") and name.endswith(".tmp")
        ):
            self.seen += 1
            if self.seen == self.nth:
                return _Filling(f, self, self.keeps)
        return _Filling(f, self, None)


class _Filling:
    """An open file on the FullDisk: ``room`` bytes left for it (None: until the disk is full)."""

    def __init__(self, f, disk: FullDisk, room: int | None) -> None:
        self._f, self._disk, self._room = f, disk, room

    def write(self, data):
        size = len(data.encode() if isinstance(data, str) else data)
        if self._room is not None and not self._disk.full:
            self._disk.full = True
            fits = data[: self._room]
            self._f.write(fits)
            self._f.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self._disk.full and size:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


@pytest.fixture
def full_disk(monkeypatch, tmp_path):
    """``full_disk(fills_at, nth=1)``: the FullDisk of ``tmp_path`` in place of ``open``."""

    def install(fills_at: str, nth: int = 1) -> FullDisk:
        disk = FullDisk(tmp_path, fills_at, nth)
        monkeypatch.setattr(builtins, "open", disk.open)
        monkeypatch.setattr(io, "open", disk.open)
        return disk

    monkeypatch.chdir(tmp_path)
    return install


def whole(folder: Path) -> list[str]:
    """The files under ``folder``, each checked whole (no temporary names; PNGs decode, JSON
    parses, CSVs end with a line end and parse)."""
    names = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        assert not TEMPORARY.match(path.name), f"a temporary file was left: {path}"
        assert not any(TEMPORARY.match(p.name) for p in path.parents), f"staging left: {path}"
        if path.suffix == ".png":
            import matplotlib.image

            matplotlib.image.imread(path)
        elif path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".csv":
            assert path.read_text().endswith("\n"), path
            pd.read_csv(path)
        names.append(path.relative_to(folder).as_posix())
    return names


def one_error_line(result) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert lines[-1].startswith("error: "), result.output
    return lines[-1]


@pytest.fixture(scope="module")
def speed_run(tmp_path_factory):
    """A unit-wise speed run's folder (two units) and a results CSV: what plot, merge and
    export read."""
    root = tmp_path_factory.mktemp("speed")
    run_sweep(tiny(mechanisms=("softmax",)), root / "units", log=lambda _: None)
    run_speed(tiny(mechanisms=("softmax",)), root / "single")
    return root


@pytest.mark.parametrize(
    ("args", "fills_at", "named", "kept"),
    [
        (["plot", "{src}/single/results.csv", "--out", "fig"], "memory-fwd-bidir.png",
         "figure fig/memory-fwd-bidir.png", ["fig/time-fwd-bidir.png"]),
        (["merge", "{src}/units", "--out", "m", "--no-plot"], "results.csv",
         "m/results.csv", ["m/plan.json"]),
        (["export", "{src}/single/results.csv", "--to", "bencher", "--out", "x/x.json"],
         "x.json", "x/x.json", []),
        (["show", "softmax", "--out", "p.png"], "p.png", "figure p.png", []),
    ],
)  # fmt: skip
def test_a_full_disk_names_the_file_and_keeps_what_was_whole(
    full_disk, speed_run, tmp_path, args, fills_at, named, kept
):
    args = [a.format(src=speed_run) for a in args]
    full_disk(fills_at)
    line = one_error_line(runner.invoke(app, args))
    assert line == f"error: cannot write {named}: No space left on device"
    assert whole(tmp_path) == kept


def test_run_speed_on_a_full_disk(full_disk, tmp_path):
    full_disk("complexity.csv")
    result = runner.invoke(
        app, ["run", "speed", "--impl", "softmax", "--lengths", "16,32", "--device", "cpu",
              "--threads", "1", "--rounds", "2", "--no-plot", "--out", "out"],
    )  # fmt: skip
    line = one_error_line(result)
    assert line == "error: cannot write out/complexity.csv: No space left on device"
    assert whole(tmp_path / "out") == ["results.csv", "results.json", "samples.jsonl"]
    assert len(pd.read_csv(tmp_path / "out/results.csv")) > 0  # every row measured is kept


def test_run_extrapolate_on_a_full_disk_keeps_the_previous_checkpoint(full_disk, tmp_path):
    corpus = make_corpus(tmp_path / "c.txt")
    full_disk("E-seed0.pt", nth=2)  # the checkpoint of step 5 is written, that of step 10 not
    result = runner.invoke(
        app, ["run", "extrapolate", *TINY, "--corpus", str(corpus), "--variants", "E",
              "--eval-time", "none", "--out", "x"],
    )  # fmt: skip
    line = one_error_line(result)
    checkpoint = Path("x/checkpoints/E-seed0.pt")
    assert line == (
        f"error: cannot write checkpoint {checkpoint}: No space left on device; the one there "
        "before is kept"
    )
    assert "inline_container" not in result.output
    assert torch.load(tmp_path / checkpoint, weights_only=True)["step"] == 5
    assert "checkpoints/E-seed0.pt" in whole(tmp_path / "x")


def test_run_extrapolate_results_on_a_full_disk(full_disk, tmp_path):
    corpus = make_corpus(tmp_path / "c.txt")
    full_disk("accuracy_vs_length.png")
    result = runner.invoke(
        app, ["run", "extrapolate", *TINY, "--corpus", str(corpus), "--variants", "E",
              "--eval-time", "none", "--out", "x"],
    )  # fmt: skip
    line = one_error_line(result)
    assert line == ("error: cannot write figure x/accuracy_vs_length.png: No space left on device")
    assert {"extrapolate.csv", "table.md"} <= set(whole(tmp_path / "x"))


def test_run_entropy_on_a_full_disk(full_disk, tmp_path):
    full_disk("entropy.png")
    result = runner.invoke(app, ["run", "entropy", "--max-n", "32", "--trials", "1", "--out", "e"])
    line = one_error_line(result)
    assert line == "error: cannot write figure e/entropy.png: No space left on device"
    assert whole(tmp_path / "e") == ["entropy.csv"]


SPEED = ["run", "speed", "--impl", "softmax", "--lengths", "16,32", "--device", "cpu",
         "--threads", "1", "--rounds", "2", "--no-plot", "--out", "out"]  # fmt: skip


def test_run_speed_with_no_room_for_its_header_leaves_no_results_file(full_disk, tmp_path):
    """Issue 63: the disk fills as the results file starts; before, an empty results.csv was
    left (its header cut off again) beside a sidecar of a run with no row."""
    full_disk("results.csv")
    line = one_error_line(runner.invoke(app, SPEED))
    assert line == "error: cannot write out/results.csv: No space left on device"
    assert whole(tmp_path / "out") == []


def test_run_speed_with_no_room_for_its_first_row_leaves_no_results_file(monkeypatch, tmp_path):
    """The first row cannot be written (a fake writer fails as a full disk does): the header
    alone, the empty samples file and the sidecar are removed; a run with rows keeps them
    (test_run_speed_on_a_full_disk)."""
    from attnbench.bench import results
    from attnbench.core.errors import AttnbenchError

    def full(self, line):
        raise AttnbenchError(f"cannot write {self.path}: {os.strerror(errno.ENOSPC)}")

    monkeypatch.setattr(results.LineFile, "write", full)
    monkeypatch.chdir(tmp_path)
    line = one_error_line(runner.invoke(app, SPEED))
    assert line == "error: cannot write out/results.csv: No space left on device"
    assert whole(tmp_path / "out") == []


def test_an_overwrite_that_finds_no_room_keeps_the_results_there(full_disk, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.csv").write_text("kept,\n1,\n")
    full_disk("results.csv")
    line = one_error_line(runner.invoke(app, [*SPEED, "--overwrite"]))
    assert line == (
        "error: cannot write out/results.csv: No space left on device; the one there before is kept"
    )
    assert (tmp_path / "out" / "results.csv").read_text() == "kept,\n1,\n"
