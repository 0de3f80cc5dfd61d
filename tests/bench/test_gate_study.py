"""``attnbench gate --base REV`` as the revision runner (attnbench.bench.gate_study and
gate_report): repeated trials (the A/A study), an injected slowdown (the sensitivity check),
any number of pairs, the report drawn from the trials' records, the options' errors, and one
real study on a tiny grid."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.bench import gate, gate_report, gate_study
from attnbench.bench.slowdown import Slowdown
from attnbench.cli import app
from tests.helpers.gate import fake_grid, make_repo

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture
def repo(tmp_path) -> Path:
    return make_repo(tmp_path / "repo")


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_an_aa_study_and_a_caught_slowdown_on_synthetic_runs(repo, tmp_path, monkeypatch):
    """Two A/A trials pass and are kept (a second command runs nothing again); a 1.5x slowdown
    of gau's forward in the current runs is caught, and nothing else is flagged."""
    ran = fake_grid(monkeypatch, repo, None)
    out = tmp_path / "study"
    study = gate_study.Study(base="HEAD", trials=2, command="attnbench gate --base HEAD")
    found = gate_study.run_study(repo, out, study, gate.Grid(), print, print)
    assert found.code == 0
    assert found.line.startswith("gate study: 0 false alarms in 2 trials")
    assert len(ran) == 8 and ran[:2] == ["gate-base1", "gate-current1"]
    trial = out / "aa-quiet" / "trial-01"
    assert (trial / "gate" / "compare.md").is_file() and (trial / "gate.txt").is_file()
    assert (trial / "gate" / "before-after.md").is_file()
    gate_study.run_study(repo, out, study, gate.Grid(), print, print)
    assert len(ran) == 8  # resumed: both trials kept

    slow = gate.Grid(slow=Slowdown("gau:efficient", 1.5))
    once = gate_study.Study(base="HEAD", trials=1)
    found = gate_study.run_study(repo, out, once, slow, print, print)
    assert found.line.startswith("gate study: 0 false alarms in 2 trials; slowdown caught in 1")
    record = json.loads((out / "slow-gau-efficient-x1.5-quiet/trial-01/trial.json").read_text())
    assert record["caught"] and record["other_worse"] == [] and record["gate_exit"] == 1
    assert record["slowed_cases"] == 4 and record["slowed_change_min"] > 1.3
    assert [p["exit_code"] for p in record["pairs"]] == [1, 1]  # compare alone says so too

    columns, rows = read_csv(out / "trials.csv")
    assert columns == list(gate_report.COLUMNS) and len(rows) == 3
    summary = (out / "summary.md").read_text()
    assert "the same code (A/A), so anything worse is a false alarm" in summary
    assert "| aa-quiet | 2 | 2 | 0 | 4 | 0 | 0 |" in summary
    slowed = "| slow-gau-efficient-x1.5-quiet | gau:efficient x1.5 | 1 | 1 | 100% | 0 | 0 | 4..4 |"
    assert slowed in summary
    assert json.loads((out / "study.json").read_text())["same_code"] is True


@pytest.mark.parametrize(("pairs", "every"), [(1, "the pair"), (3, "all 3 pairs")])
def test_any_number_of_pairs_must_all_show_a_regression(repo, tmp_path, monkeypatch, pairs, every):
    ran = fake_grid(monkeypatch, repo, {"gau": 1.5})
    out = tmp_path / "runs" / "ci-speed"
    found = gate.run_gate(
        out, tmp_path / "none", "HEAD~1", repo, print, print, gate.Grid(pairs=pairs)
    )
    assert ran == [f"ci-speed-{label}" for label in gate.run_labels(pairs)]
    assert found.code == 1 and f"FAILED, regression in {every}: gau:efficient" in found.line
    assert (out / "compare.md").read_text().count("## attnbench compare") == pairs


def record(**given) -> dict:
    """A trial's record as run_trial writes it, ``given`` changed."""
    pair = {"exit_code": 0, "compared": 300, "worse": 0, "suspect": 0, "unconfirmed": 0,
            "not_judged": 0, "better": 0, "noise_sigma": 0.02, "worse_cases": []}  # fmt: skip
    base = {"trial": 1, "started_utc": "t", "slow": "", "load": "quiet", "gate_exit": 0,
            "verdict": "passed", "caught": None, "other_worse": [], "slowed_cases": None,
            "slowed_change_min": None, "slowed_change_max": None, "pairs": [pair, pair],
            "loadavg_before_1min": 1.0, "loadavg_after_1min": 2.0, "wall_s": 300.0,
            "run_wall_s": [80.0, 90.0, 80.0, 90.0], "neighbours": "none",
            "neighbour_cpu_s": None, "cpu_signature": "cpu x"}  # fmt: skip
    return base | given


def test_the_report_counts_trials_from_their_records(tmp_path):
    study = {"command": "attnbench gate --base HEAD --trials 3", "base": "HEAD",
             "base_sha": "a" * 40, "same_code": True, "suite": "suites/ci.toml", "run_args": [],
             "pairs": 2, "gate_class": "x", "saved_baseline": False,
             "machine": {"cpu_model": "CPU", "cpu_signature": "cpu x", "logical_cores": 2,
                         "memory_bytes": 2**34, "platform": "Linux", "torch": "2.x"}}  # fmt: skip
    (tmp_path / "study.json").write_text(json.dumps(study))
    worse_pair = {**record()["pairs"][0], "exit_code": 1, "worse": 2, "suspect": 1}
    trials = {
        "aa-quiet/trial-01": record(),
        "aa-quiet/trial-02": record(trial=2, pairs=[worse_pair, record()["pairs"][0]]),
        "aa-quiet/trial-03": record(trial=3, gate_exit=1, other_worse=["u", "v"]),
        "slow-gqa-efficient-x1.3-quiet/trial-01": record(
            slow="gqa:efficient x1.3", caught=True, slowed_cases=3, slowed_change_min=1.2,
            slowed_change_max=1.4),
        "slow-gqa-efficient-x1.3-quiet/trial-02": record(
            trial=2, slow="gqa:efficient x1.3", caught=False, slowed_cases=3, other_worse=["w"],
            slowed_change_min=1.0, slowed_change_max=1.1),
    }  # fmt: skip
    for where, r in trials.items():
        (tmp_path / where).mkdir(parents=True)
        (tmp_path / where / "trial.json").write_text(json.dumps(r))

    line = gate_report.write_report(tmp_path)

    assert line.startswith("gate study: 1 false alarms in 3 trials; slowdown caught in 1 of 2")
    _, rows = read_csv(tmp_path / "trials.csv")
    assert [r["other_worse"] for r in rows] == ["", "", "u; v", "", "w"]
    assert rows[1]["pair_exit_codes"] == "1; 0" and rows[1]["pair_worse"] == "2"
    summary = (tmp_path / "summary.md").read_text()
    aa = next(ln for ln in summary.splitlines() if ln.startswith("| aa-quiet |"))
    # trials, gate passed, false alarms, pairs, pairs exit 1, cases worse, suspect, not judged
    assert aa.startswith("| aa-quiet | 3 | 2 | 1 | 6 | 1 | 2 | 1 | 0 | 300..300 | 0.02..0.02 |")
    assert aa.endswith("| 85 | none | only 3 of 10 |")
    slow = next(ln for ln in summary.splitlines() if ln.startswith("| slow-"))
    # trials, caught, rate, trials with another case worse, other cases, slowed cases, moved
    assert "| gqa:efficient x1.3 | 2 | 1 | 50% | 1 | 1 | 3..3 | x1..1.4 |" in slow
    assert "signature `cpu x`; 2 logical cores; 16 GiB" in summary


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slow", "gqa:efficient"], "--slow needs --base REV (the measured mode)"),
        (["--pairs", "3"], "--pairs needs --base REV"),
        (["--trials", "2"], "--trials needs --base REV (e.g. --base HEAD: the A/A study)"),
        (["--load", "loaded"], "--load needs --trials K"),
        (["--base", "HEAD", "--slow", "gqa"], "--slow gqa: accepted: NAME:PATH"),
        (["--base", "HEAD", "--slow", "gqa:efficient", "--factor", "0.9"], "a slowdown factor > 1"),
        (["--base", "HEAD", "--peer", "local:efficient"], "--peer 'local:efficient': accepted"),
    ],
)
def test_the_options_errors_are_one_line(args, message):
    done = runner.invoke(app, ["gate", *args])
    assert done.exit_code == 2 and done.output.count("\n") == 1, done.output
    assert message in done.output


@pytest.mark.slow
def test_a_real_study_on_a_tiny_grid_catches_a_tripled_path_beside_a_neighbour(tmp_path):
    """The executable in this checkout: one trial, one pair, beside the neighbour, with
    gqa:efficient's forward tripled in the current run's process only (two cases, n = 256)."""
    tiny = "--impl gqa:efficient --lengths 256 --direction fwd"
    cmd = [sys.executable, "-m", "attnbench", "gate", "--base", "HEAD", "--trials", "1",
           "--pairs", "1", "--load", "loaded", "--slow", "gqa:efficient", "--factor", "3",
           "--speed-args", tiny, "--out", str(tmp_path / "study")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("gate study: slowdown caught in 1 of 1")
    (trial,) = (tmp_path / "study").glob("slow-gqa-efficient-x3-loaded/trial-01")
    rec = json.loads((trial / "trial.json").read_text())
    assert rec["caught"] and rec["other_worse"] == [] and rec["slowed_cases"] == 2
    assert rec["slowed_change_min"] > 2  # x3 of the forward, on the CPU-time clock
    assert rec["neighbours"] != "none" and rec["neighbour_cpu_s"] > 0
    for kept in ("gate-base1/results.csv", "gate-current1/samples.jsonl", "gate-base1.log"):
        assert (trial / kept).is_file(), kept
    assert str(tmp_path) not in (trial / "gate" / "compare.md").read_text()
