"""The CI speed gate, ``attnbench gate`` (:mod:`attnbench.bench.gate`): its command line, and its
decisions on synthetic runs in a throw-away git repository (the grid itself runs in .ci/run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnbench.bench import gate
from attnbench.bench.compare import compare
from attnbench.cli import app
from tests.helpers.gate import fake_grid, git, make_repo
from tests.helpers.results import grid, write_run

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_machine_class_from_the_cpu_signature():
    intel = "GenuineIntel 6/143/8 avx2,avx512f,amx_tile; torch AVX512"
    assert gate.machine_slug(intel) == "genuineintel-6-143-avx2-avx512f-amx_tile"
    assert gate.machine_slug("AuthenticAMD 25/1/1 avx2; torch AVX2") == "authenticamd-25-1-avx2"
    assert gate.machine_slug("AuthenticAMD 25/1/2 avx2; torch AVX2") == "authenticamd-25-1-avx2"
    assert gate.machine_slug("aarch64; torch NO AVX") == "aarch64"


def test_a_base_that_names_no_commit_is_a_usage_error():
    done = subprocess.run(
        [sys.executable, "-m", "attnbench", "gate", "--base", "no-such-revision-xyz"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: --base no-such-revision-xyz: no such revision in this repository"
    )


def test_print_class_and_help():
    done = runner.invoke(app, ["gate", "--print-class"])
    assert done.exit_code == 0 and done.stdout.strip() == gate.machine_slug()
    shown = runner.invoke(app, ["gate", "--help"])
    assert shown.exit_code == 0 and "Example" in shown.output and "--base" in shown.output


# --------------------------------------------------------------------------------------------
# The decisions, on synthetic runs: the grid is replaced by runs written from a random model
# --------------------------------------------------------------------------------------------


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository of two commits holding suites/ci.toml (what the gate checks out)."""
    return make_repo(tmp_path / "repo")


def test_the_measured_mode_fails_on_a_slowdown_in_both_pairs(repo, tmp_path, monkeypatch):
    """A 1.5x slowdown of one path in both pairs fails with the verdict format of the last
    line; base and current alternate."""
    ran = fake_grid(monkeypatch, repo, {"gau": 1.5})
    said: list[str] = []
    out = tmp_path / "runs" / "ci-speed"
    found = gate.run_gate(out, tmp_path / "none", base="HEAD~1", root=repo, say=said.append)
    assert ran == ["ci-speed-base1", "ci-speed-current1", "ci-speed-base2", "ci-speed-current2"]
    sha = git(repo, "rev-parse", "HEAD~1")[:10]
    assert found.code == 1
    head = f"speed gate: baseline measured from revision HEAD~1 ({sha}): FAILED, regression in "
    assert found.line.startswith(head + "both pairs: gau:efficient")
    assert "worse: gau:efficient" in "\n".join(said)
    assert (out / "compare.md").read_text().count("## attnbench compare") == 2
    assert git(repo, "worktree", "list").count("\n") == 0  # the base's worktree is gone


def test_an_aa_check_passes(repo, tmp_path, monkeypatch):
    """--base HEAD with a clean tree: the code against itself, nothing worse."""
    fake_grid(monkeypatch, repo, None)
    found = gate.run_gate(tmp_path / "aa", tmp_path / "none", base="HEAD", root=repo, say=print)
    assert found.code == 0 and ": passed, nothing worse (" in found.line
    assert found.line.startswith("speed gate: baseline measured from revision HEAD (")


def test_a_saved_baseline_and_its_regressions_checked_against_the_previous_commit(
    repo, tmp_path, monkeypatch
):
    """Against a saved baseline of this machine class (no samples: the threshold rule), an A/A
    run passes; a slowdown that repeats in the re-run fails only when HEAD~1, measured now, shows
    it too."""
    saved = tmp_path / "baselines" / gate.machine_slug()
    write_run(saved, grid(np.random.default_rng(3)), samples=False)
    for suffix in (".csv", ".json"):  # saved as ci.csv, its sidecar ci.json
        (saved / f"results{suffix}").rename(saved / f"ci{suffix}")
    out = tmp_path / "runs" / "ci-speed"
    fake_grid(monkeypatch, repo, None)
    found = gate.run_gate(out, tmp_path / "baselines", root=repo, say=print)
    assert found.code == 0 and found.line.startswith("speed gate: baseline saved for class ")
    assert ": passed, nothing worse (" in found.line
    ran = fake_grid(monkeypatch, repo, {"gau": 1.5})
    found = gate.run_gate(out, tmp_path / "baselines", root=repo, say=print)
    assert ran[:2] == ["ci-speed", "ci-speed-rerun"] and len(ran) == 6
    assert found.code == 1 and ", confirmed against measured from revision HEAD~1 (" in found.line
    assert ": FAILED, regression against both: gau:efficient" in found.line


def test_no_baseline_at_all_is_skipped(tmp_path, monkeypatch):
    """No saved baseline and no previous commit (a shallow clone, no git): skipped, exit 0."""
    fake_grid(monkeypatch, tmp_path, None)
    found = gate.run_gate(tmp_path / "out", tmp_path / "none", root=tmp_path, say=print)
    assert found.code == 0 and found.line.endswith(
        "no previous commit here to measure one from): skipped"
    )


def test_a_base_without_the_grid_is_skipped(repo, tmp_path, monkeypatch):
    fake_grid(monkeypatch, repo, None)
    (repo / "README").write_text("x\n")
    git(repo, "add", "README")
    git(repo, "rm", "-q", "suites/ci.toml")
    git(repo, "commit", "-q", "-m", "no grid")
    (repo / "suites").mkdir(exist_ok=True)
    found = gate.run_gate(tmp_path / "out", tmp_path / "none", base="HEAD", root=repo, say=print)
    assert found.code == 0 and found.line.endswith("skipped: revision HEAD has no suites/ci.toml")


def test_the_verdict_of_one_comparison(tmp_path):
    rng = np.random.default_rng(12)
    base = write_run(tmp_path / "base", grid(rng))
    same = compare(write_run(tmp_path / "same", grid(rng)), base)
    assert gate.verdict_of(same.exit_code, same.headline()) == (0, f"passed, {same.headline()}")
    assert gate.verdict_of(3, "nothing comparable") == (
        0,
        "skipped, nothing comparable (nothing comparable)",
    )
    assert gate.verdict_of(1, "1 regression")[1] == "FAILED, 1 regression"
