"""The history rule (:mod:`attnbench.bench.compare.history_rule`): cases a pair of runs cannot
judge (3 rounds a side) judged against their results history, by ``compare`` and by the speed
gate, which then adds its runs to the history (:mod:`attnbench.bench.history.feed`)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from attnbench.bench import gate
from attnbench.bench.compare import compare
from attnbench.bench.history.feed import feed, gate_runs
from attnbench.bench.history.store import History
from tests.helpers.history import commit_line, commit_run

LEVELS = {"local": 0.5, "gau": 1.2}
SLOW = {"local": 0.5, "gau": 1.2 * 1.3}


def make_history(folder: Path, runs: Path, commits: int) -> Path:
    with History(folder, create=True) as history:
        for run in commit_line(runs, [LEVELS] * commits):
            history.add(run)
    return folder


@pytest.fixture
def pair(tmp_path):
    """A base run (commit 20) and a current one 1.3x slower on gau (commit 21), 3 rounds each;
    and an A/A current run."""
    rng = np.random.default_rng(11)
    base = commit_run(tmp_path / "base", 20, LEVELS, rng)
    slow = commit_run(tmp_path / "slow", 21, SLOW, rng)
    same = commit_run(tmp_path / "same", 21, LEVELS, rng)
    return base, slow, same


def time_lines(cmp):
    return [line for line in cmp.lines if line.metric.startswith("time")]


def test_a_pair_with_three_rounds_judges_nothing(pair):
    base, slow, _ = pair
    cmp = compare(slow, base)
    assert cmp.exit_code == 0 and {ln.verdict for ln in time_lines(cmp)} == {"not judged"}


def test_the_history_judges_what_the_pair_cannot(pair, tmp_path):
    base, slow, same = pair
    history = make_history(tmp_path / "history", tmp_path / "runs", 12)
    cmp = compare(slow, base, history=history)
    assert cmp.exit_code == 1
    worse = [ln for ln in time_lines(cmp) if ln.verdict == "worse"]
    assert sorted(ln.case.split()[0] for ln in worse) == ["gau:efficient"] * 2
    for line in worse:
        assert line.test == "history rule, 12 commits" and line.ratio == pytest.approx(1.3, rel=0.1)
        assert line.note.startswith("history rule: x1.") and "with 1 other case" in line.note
    assert all(ln.test.startswith("history rule") for ln in time_lines(cmp))
    assert "5 judged by the history rule" in cmp.headline()
    assert any("judged by the history rule" in note for note in cmp.notes)
    aa = compare(same, base, history=history)
    assert aa.exit_code == 0 and aa.count("worse") == aa.count("suspect") == 0
    with History(history) as store:  # the current run in the history too: not its own baseline
        store.add(slow.parent)
    assert compare(slow, base, history=history).exit_code == 1


def test_a_history_that_scatters_widely_shows_no_regression(tmp_path):
    """Runs on a machine that moves cases 1.5x between processes (sigma 0.4, as default-suite
    runs on a busy machine): a case 3x slower is at most suspect, as a pair that noisy says."""
    history = tmp_path / "history"
    with History(history, create=True) as store:
        for run in commit_line(tmp_path / "runs", [LEVELS] * 12, noise=0.4):
            store.add(run)
    rng = np.random.default_rng(13)
    base = commit_run(tmp_path / "base", 20, LEVELS, rng)
    slow = commit_run(tmp_path / "slow", 21, {"local": 0.5, "gau": 3.6}, rng)
    cmp = compare(slow, base, history=history)
    assert cmp.exit_code == 0 and cmp.count("worse") == 0
    gau = [ln for ln in time_lines(cmp) if ln.case.startswith("gau")]
    assert {ln.verdict for ln in gau} <= {"suspect", "same"} and "suspect" in {
        ln.verdict for ln in gau
    }
    assert all("scatters too widely" in ln.note for ln in gau if ln.verdict == "suspect")


def test_a_short_or_missing_history_leaves_the_cases_unjudged(pair, tmp_path):
    base, slow, _ = pair
    short = make_history(tmp_path / "short", tmp_path / "runs", 4)
    cmp = compare(slow, base, history=short)
    assert cmp.exit_code == 0 and {ln.verdict for ln in time_lines(cmp)} == {"not judged"}
    assert any("fewer than 5 commits of history" in note for note in cmp.notes)
    cmp = compare(slow, base, history=tmp_path / "empty")
    assert cmp.exit_code == 0
    assert any(note.startswith("no results history in") for note in cmp.notes)


# --------------------------------------------------------------------------------------------
# The gate: a throw-away repository, the grid replaced by synthetic 3-round runs
# --------------------------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository of two commits holding suites/ci.toml (what the gate checks out)."""
    root = tmp_path / "repo"
    (root / "suites").mkdir(parents=True)
    git(root, "init", "-q")
    for text in ("# the grid\n", "# the grid, again\n"):
        (root / "suites" / "ci.toml").write_text(text)
        git(root, "add", "suites")
        git(root, "commit", "-q", "-m", text.strip())
    return root


def test_the_gate_judges_by_history_and_feeds_it(repo, tmp_path, monkeypatch):
    """Measured mode, 3 rounds a side: nothing judged without a history; with one, the 1.3x
    slowdown of gau fails in both pairs, its lines saying the history rule decided; then the
    gate's four runs join the history, the current code's run of uncommitted changes aside."""
    rng = np.random.default_rng(12)

    def run_grid(out: Path, code_root: Path, grid=None, slow=None) -> tuple[bool, str]:
        current = code_root == repo
        commit_run(out, 21 if current else 20, SLOW if current else LEVELS, rng)
        return True, ""

    monkeypatch.setattr(gate, "run_grid", run_grid)
    out = tmp_path / "runs" / "ci-speed"
    found = gate.run_gate(out, tmp_path / "none", base="HEAD~1", root=repo, say=print)
    assert found.code == 0 and "not judged" in found.line
    history = make_history(tmp_path / "history", tmp_path / "past", 12)
    said: list[str] = []
    started = time.time()
    found = gate.run_gate(out, tmp_path / "none", "HEAD~1", repo, said.append, history=history)
    assert found.code == 1 and ": FAILED, regression in both pairs: gau:efficient" in found.line
    lines = "\n".join(said).splitlines()
    worse = [s for s in lines if s.startswith("  worse: ")]
    assert len(worse) == 4 and all(s.startswith("  worse: gau:efficient") for s in worse)
    assert all(" history rule: x1." in s for s in worse)
    assert (
        sum("2 regressions (5 cases compared, 5 judged by the history rule)" in s for s in lines)
        == 2
    )
    folders = gate_runs(out, started)
    assert [f.name for f in folders] == [f"ci-speed-{x}" for x in ("base1", "base2", "current1",
                                                                 "current2")]  # fmt: skip
    warned: list[str] = []
    commit_run(out.with_name("ci-speed-current2"), 21, SLOW, rng, dirty=True)
    assert feed(history, folders, print, warned.append) == 3
    assert warned and "uncommitted changes" in warned[0]
    with History(history) as store:
        assert store.runs() == 15
