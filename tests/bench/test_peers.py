"""``attnbench compare RESULTS --peer PATH=PEER --n N`` (attnbench.bench.peers): a path read
against the machine, dense SDPA and its peers in one run, checked by hand on a made-up run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app

runner = CliRunner()
COLUMNS = ["mechanism", "path", "direction", "causal", "seq_len", "status", "time_median_ms",
           "ref_ratio", "roofline"]  # fmt: skip


def write_run(tmp_path: Path) -> Path:
    rows = [
        ("local", "efficient", "fwd", False, 8192, "ok", 10.0, 0.05, 0.40),
        ("local", "efficient", "fwdbwd", False, 8192, "ok", 30.0, 0.04, 0.35),
        ("local", "flex", "fwd", False, 8192, "ok", 25.0, 0.125, 0.16),
        ("local", "flex", "fwdbwd", False, 8192, "unsupported", "", "", ""),
        ("local", "local-attention", "fwd", False, 8192, "ok", 20.0, 0.1, 0.2),
        ("linear", "chunkwise", "fwd", False, 8192, "ok", 4.0, 0.01, 0.3),
        ("local", "efficient", "fwd", True, 8192, "ok", 99.0, 0.5, 0.1),  # causal: not read
        ("local", "efficient", "fwd", False, 4096, "ok", 5.0, 0.1, 0.3),  # other n: not read
    ]
    path = tmp_path / "results.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    return path


def test_ratios_are_the_peers_time_over_the_paths_in_the_same_run(tmp_path):
    results = write_run(tmp_path)
    args = ["compare", str(results), "--n", "8192", "--peer", "local:efficient=:flex",
            "--peer", "local:efficient=local:local-attention", "--peer", "linear:chunkwise",
            "--markdown", str(tmp_path / "t.md")]  # fmt: skip
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    out = done.stdout.splitlines()
    assert out[0].startswith("| path | direction | matmul rate | vs dense SDPA | vs `flex` |")
    fwd, fwdbwd, linear = out[2], out[3], out[4]
    # fwd: 40 % of the matmul rate, 1 / 0.05 = 20x SDPA, flex 25 / 10 = 2.5x (16 %),
    # local-attention 20 / 10 = 2x (20 %)
    assert fwd == "| `local:efficient` | fwd | 40.0 % | 20.00x | 2.50x | 16.0 % | 2.00x | 20.0 % |"
    # fwd+bwd: flex did not run (forward only), local-attention has no such row
    assert fwdbwd == (
        "| `local:efficient` | fwd+bwd | 35.0 % | 25.00x | - (unsupported) | - | "
        "- (not in the run) | - |"
    )
    assert linear == "| `linear:chunkwise` | fwd | 30.0 % | 100.00x |  | - |  | - |"  # no peer
    assert (tmp_path / "t.md").read_text() == done.stdout
    causal = runner.invoke(app, [*args[:6], "--causal", "--format", "json"])
    assert json.loads(causal.stdout) == [
        {"path": "local:efficient", "direction": "fwd", "status": "ok",
         "matmul_fraction": 0.1, "vs_sdpa": 2.0, "vs flex": "not in the run"}
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--peer", "x"], "--peer 'x': accepted: PATH=PEER or PATH"),
        (["--peer", "local:efficient=", "--n", "8"], "--peer 'local:efficient=': accepted"),
        (["--peer", "local:efficient"], "--peer needs --n"),
        (["--peer", "local:efficient", "--n", "5"], "--n 5: none of local:efficient has a row"),
        (["other.csv", "--peer", "local:efficient", "--n", "8"], "--peer reads one run"),
        ([], "BASELINE is missing; accepted: CURRENT BASELINE, or CURRENT --peer"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, extra, message):
    done = runner.invoke(app, ["compare", str(write_run(tmp_path)), *extra])
    assert done.exit_code == 2
    assert done.output.count("\n") == 1 and message in done.output, done.output


def test_a_missing_run_is_one_line(tmp_path):
    done = runner.invoke(app, ["compare", str(tmp_path / "nope.csv"), "--peer", "a:b", "--n", "5"])
    assert done.exit_code == 2 and "nope.csv: not a file; accepted: a speed run's results.csv" in (
        done.output
    )
