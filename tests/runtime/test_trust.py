"""Trust under faults and bad input (the executable as a user runs it): one line, exit 2, no
traceback; SIGTERM stops like Ctrl-C; writes are whole or not at all; exponents carry their fit
quality."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbench.bench.complexity import MIN_POINTS, fit_exponents, time_verdict
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Shape
from attnbench.data.corpus import load_corpus
from attnbench.runtime.outputs import atomic_open, ensure_dir

ROOT = Path(__file__).resolve().parents[2]


def attnbench(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real entry point (``main()``), as a user's shell runs it."""
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "attnbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "afile").write_text("not a folder\n")
    (tmp_path / "latin.txt").write_bytes("caf\xe9 et cr\xe8me\n".encode("latin-1") * 40)
    return tmp_path


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["list", "--nosuch"], ["No such option: --nosuch", "attnbench list --help"]),
        (["run", "speed", "--n", "abc"], ["No such option: --n"]),
        (["check", "softmax", "--n", "abc"], ["Invalid value for '--n'"]),
        (["nosuchcmd"], ["No such command 'nosuchcmd'"]),
        (["run", "speed", "--out", "afile/x"], ["afile/x", "under afile, which is a file"]),
        (["run", "entropy", "--out", "afile/x"], ["under afile, which is a file"]),
        (["run", "extrapolate", "--out", "afile/x"], ["under afile, which is a file"]),
        (["run", "entropy", "--checkpoints", "nowhere"], ["--checkpoints nowhere", "no such"]),
        (["run", "extrapolate", "--set", "train.steps"], ["--set 'train.steps'", "FIELD=VALUE"]),
        (["check", "softmax", "--n", "1000000"], ["--n 1000000", "GiB", "accepted here: --n"]),
        (
            ["run", "extrapolate", "--corpus", "latin.txt", "--out", "x"],
            ["latin.txt is text but not UTF-8", "0xe9", "iconv"],
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(workdir, args, words):
    done = attnbench(*args, cwd=workdir)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_sigterm_stops_a_sweep_like_ctrl_c(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnbench", "run", "speed", "--impl", "softmax", "--lengths",
         "64,128,256,512,1024,2048", "--rounds", "50", "--out", str(out)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 90
    csv = out / "results.csv"
    while time.monotonic() < deadline and not (csv.exists() and csv.read_text().count("\n") > 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted" in stderr  # the same report as Ctrl-C: what was not run
    rows = pd.read_csv(csv)
    assert len(rows) >= 2 and rows["status"].notna().all()


def test_ensure_dir_says_why_it_cannot(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(AttnbenchError, match="it is a file"):
        ensure_dir(tmp_path / "f")
    with pytest.raises(AttnbenchError, match="under .*f, which is a file"):
        ensure_dir(tmp_path / "f" / "a" / "b")
    assert ensure_dir(tmp_path / "a" / "b").is_dir()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "table.md"
    target.write_text("old\n")
    with pytest.raises(OSError), atomic_open(target) as f:
        f.write("half of the new")
        raise OSError(28, "No space left on device")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["table.md"]


def test_corpus_in_latin_1_is_named_not_called_binary(tmp_path):
    path = tmp_path / "old.txt"
    path.write_bytes("déjà vu\n".encode("latin-1") * 20)
    with pytest.raises(AttnbenchError, match="not UTF-8"):
        load_corpus(path)
    (tmp_path / "bin.dat").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(AttnbenchError, match="looks binary"):
        load_corpus(tmp_path / "bin.dat")


def _series(times: list[float], noisy: list[bool] | None = None) -> pd.DataFrame:
    n = [256 * 2**i for i in range(len(times))]
    return pd.DataFrame(
        {
            "mechanism": "m", "family": "f", "path": "p", "path_kind": "efficient", "params": "",
            "device": "cpu", "dtype": "float32", "heads": 4, "head_dim": 32, "causal": False,
            "direction": "fwd", "status": "ok", "seq_len": n, "batch": 1,
            "time_median_ms": times, "mem_fwd_bytes": [x * 1000 for x in n],
            "mem_fwdbwd_bytes": np.nan, "noisy": noisy or [False] * len(times),
        }
    )  # fmt: skip


def test_a_clean_quadratic_series_gives_a_reliable_exponent():
    fit = fit_exponents(_series([1.0, 4.1, 15.8, 64.5])).iloc[0]
    assert abs(fit["time_exponent"] - 2) < 0.05 and fit["time_r2"] > 0.99
    assert fit["time_reliable"] and fit["time_note"] == ""
    assert abs(fit["mem_fwd_exponent"] - 1) < 1e-9


@pytest.mark.parametrize(
    ("times", "noisy", "note"),
    [
        ([1.0, 4.0], None, f"a trend needs {MIN_POINTS}"),
        ([8.0, 4.0, 3.0, 1.0], None, "time fell as n grew"),
        ([1.0, 4.0, 16.0, 64.0], [True, True, False, False], "noisy"),
        ([1.0, 9.0, 2.0, 30.0], None, "poor log-log fit"),
    ],
)
def test_unreliable_exponents_say_why(times, noisy, note):
    fit = fit_exponents(_series(times, noisy)).iloc[0]
    assert not fit["time_reliable"]
    assert note in fit["time_note"]


def test_time_verdict_never_passes_a_negative_exponent():
    assert time_verdict(-0.46, 0.99, 5, 0.0) != ""
    assert time_verdict(math.nan, math.nan, 5, 0.0) == "no fit"
    assert time_verdict(1.9, 0.99, 5, 0.0) == ""


def test_check_refuses_a_reference_that_cannot_fit(monkeypatch):
    from attnbench import registry
    from attnbench.cli import check_cmd
    from attnbench.measure import machine

    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 2**30)
    softmax = registry.get("softmax")
    check_cmd.refuse_if_too_big(softmax, Shape(1, 1, 2000, 32), {})  # 128 MB: fits
    # 32 n^2 bytes of scores and 8 x 3 x 3 x 32 n of inputs within 80 % of 1 GiB: n <= 5145
    with pytest.raises(AttnbenchError, match="up to about 5145$"):
        check_cmd.refuse_if_too_big(softmax, Shape(1, 1, 20000, 32), {})


# ------------------------------------------------------------------------------------------------
# Full disk while rows are written; the machine's load and thread count
# ------------------------------------------------------------------------------------------------


def test_a_full_disk_leaves_no_half_row(tmp_path, monkeypatch):
    """A row the disk cannot take is cut off again: the file ends with the last whole row, and
    the error names the file and the cause."""
    import errno

    from attnbench.bench import results
    from attnbench.bench.results import ResultsWriter, read_results
    from tests.helpers.results import result_row

    path = tmp_path / "results.csv"
    writer = ResultsWriter(path)
    writer.write(result_row())
    real_write = os.write

    def half_then_full(fd, data):
        if len(data) > 20:
            real_write(fd, bytes(data[:20]))  # the disk takes part of the row, then is full
            return 20
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(results.os, "write", half_then_full)
    with pytest.raises(AttnbenchError, match=r"cannot write .*results.csv: No space left"):
        writer.write(result_row(n=512))
    monkeypatch.setattr(results.os, "write", real_write)
    writer.close()
    text = path.read_text()
    assert text.endswith("\n") and len(read_results(path)) == 1


def test_busy_and_oversubscribed_machines_are_named():
    from attnbench.measure.machine import busy_reason, oversubscribed

    assert busy_reason(0.2, threads=2, cores=2) is None
    assert busy_reason(1.4, threads=1, cores=2) is None  # the run's own core is free
    said = busy_reason(2.5, threads=2, cores=2)
    assert said and "load 2.5 on 2 cores" in said and "noisy" in said
    assert busy_reason(None, threads=2, cores=2) is None  # no load average on this OS
    assert oversubscribed(2, cores=2) is None
    said = oversubscribed(1000, cores=2)
    assert said and "1000 threads on 2 usable cores" in said and "at most 2" in said


def test_the_load_is_recorded_before_and_during_a_run():
    from attnbench.measure.machine import LoadWatch

    watch = LoadWatch(threads=1, every=0.05).start()
    time.sleep(0.3)
    load = watch.stop()
    if load is None:
        pytest.skip("this OS has no load average")
    assert load["samples"] >= 2 and len(load["before_1_5_15min"]) == 3
    assert load["during_1min_max"] >= load["during_1min_median"] >= 0
    assert load["others_before"] == load["before_1_5_15min"][0]
    expected = max(0.0, load["during_1min_median"] - 1)
    assert load["others_during"] == pytest.approx(expected, abs=0.02)


def test_the_sidecar_keeps_the_load(tmp_path):
    """(Threads beyond the cores, a warning before, are refused since issue 63, with the core
    count: tests/cli/test_errors.py.)"""
    import json

    done = attnbench(
        "run", "speed", "--suite", "ci", "--impl", "softmax:efficient", "--lengths", "64",
        "--direction", "fwd", "--rounds", "3", "--threads", "1", "--no-plot",
        "--out", "run", cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    side = json.loads((tmp_path / "run" / "results.json").read_text())
    if hasattr(os, "getloadavg"):
        assert side["load"]["samples"] >= 1 and side["load"]["cores"] >= 1
