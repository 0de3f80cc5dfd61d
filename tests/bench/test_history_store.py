"""The results history (:mod:`attnbench.bench.history.store`): what a run adds, the series it
feeds, and that series never mix machine classes or library versions."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from attnbench.bench.history.analysis import analyse, change_records
from attnbench.bench.history.store import DB_NAME, History
from attnbench.core.errors import AttnbenchError
from tests.helpers.history import commit_line, commit_run, sha

LEVELS = {"local": 0.5, "gau": 1.2}


@pytest.fixture
def history(tmp_path):
    with History(tmp_path / "history", create=True) as h:
        yield h


def test_a_run_adds_its_rows_under_its_commit(history, tmp_path):
    (run,) = commit_line(tmp_path / "runs", [LEVELS])
    added = history.add(run)
    assert added.commit == sha(0) and added.rows == 5 and not added.already
    (env,) = added.envs
    assert env.machine_class == "cpu|authenticamd-25-1-avx2|Test CPU|threads=1|clock=process-cpu"
    assert env.versions == "python=3.11.7 torch=2.13.0+cpu triton=3.9.0" and env.suite == "ci"
    assert history.add(run / "results.csv").already  # the same run again: recorded once
    assert history.runs() == 1
    series = {s.label: s for s in history.series()}
    assert len(series) == 5
    gau = series["gau:efficient fwd bidir n=1024 float32 B=1 H=4 D=32"]
    assert gau.metric == "time / softmax:efficient" and gau.commits == (sha(0),)
    reference = series["softmax:efficient fwd bidir n=1024 float32 B=1 H=4 D=32"]
    assert reference.metric == "time x matmul rate" and reference.values == pytest.approx((0.2,))
    times = {s.label: s for s in history.series("time")}
    assert times[gau.label].metric == "time (ms)"


def test_series_follow_the_commits_in_the_order_they_were_measured(history, tmp_path):
    runs = commit_line(tmp_path / "runs", [LEVELS] * 4)
    for run in (runs[2], runs[0], runs[3], runs[1]):  # added out of order
        history.add(run)
    rng = np.random.default_rng(5)
    history.add(commit_run(tmp_path / "again", 1, LEVELS, rng))  # a second run of commit 1
    (series,) = [s for s in history.series() if s.label.startswith("gau") and "n=256" in s.label]
    assert series.commits == tuple(sha(i) for i in range(4)) and series.runs == (1, 2, 1, 1)
    assert [c for c, _ in history.commits(series.env)] == list(series.commits)


def test_machine_classes_and_versions_are_never_mixed(history, tmp_path):
    rng = np.random.default_rng(1)
    history.add(commit_run(tmp_path / "a", 0, LEVELS, rng))
    history.add(commit_run(tmp_path / "b", 1, LEVELS, rng, torch="2.14.0+cpu"))
    intel = "GenuineIntel 6/143/8 avx2,avx512f; torch AVX512"
    history.add(commit_run(tmp_path / "c", 2, LEVELS, rng, signature=intel))
    gau = [s for s in history.series() if s.label.startswith("gau:efficient fwd bidir n=256")]
    assert len(gau) == 3 and all(len(s.commits) == 1 for s in gau)
    assert {s.env.versions.split()[1] for s in gau} == {"torch=2.13.0+cpu", "torch=2.14.0+cpu"}
    assert any("genuineintel-6-143-avx2-avx512f" in s.env.machine_class for s in gau)


def test_the_references_time_in_matmul_work_is_kept_apart_per_matmul_size(history, tmp_path):
    """A run sizes the roofline's matmul by time; its time in units of matmul work compares only
    at one size, so each size is a series of its own (the ratios to the reference are one)."""
    rng = np.random.default_rng(3)
    for commit, size in ((0, 512), (1, 1024), (2, 512)):
        history.add(commit_run(tmp_path / f"r{commit}", commit, LEVELS, rng, matmul=size))
    found = {(s.label.split()[0], s.metric): len(s.commits) for s in history.series()}
    assert found[("softmax:efficient", "time x matmul rate (matmul 512)")] == 2
    assert found[("softmax:efficient", "time x matmul rate (matmul 1024)")] == 1
    assert found[("gau:efficient", "time / softmax:efficient")] == 3


def test_runs_of_uncommitted_changes_and_without_a_commit(history, tmp_path):
    rng = np.random.default_rng(2)
    dirty = commit_run(tmp_path / "dirty", 0, LEVELS, rng, dirty=True)
    with pytest.raises(AttnbenchError, match="uncommitted changes .* or --allow-dirty"):
        history.add(dirty)
    assert history.add(dirty, allow_dirty=True).commit == sha(0) + "-dirty"
    bare = commit_run(tmp_path / "bare", 1, LEVELS, rng)
    (bare.parent / "results.json").write_text(json.dumps({"files": {"rows": "results.csv"}}))
    with pytest.raises(AttnbenchError, match="no commit recorded .* --commit SHA"):
        history.add(bare)
    assert history.add(bare, commit="abc1234").commit == "abc1234"


def test_bad_histories_are_one_line_errors(tmp_path):
    with pytest.raises(AttnbenchError, match="no results history there"):
        History(tmp_path / "none")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / DB_NAME).write_text("not a database\n" * 100)
    with pytest.raises(AttnbenchError, match="not a readable results history"):
        History(tmp_path / "junk")
    with History(tmp_path / "old", create=True):
        pass
    with sqlite3.connect(tmp_path / "old" / DB_NAME) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    with pytest.raises(AttnbenchError, match="schema 99; this attnbench reads schema 1"):
        History(tmp_path / "old")
    with (
        History(tmp_path / "h", create=True) as h,
        pytest.raises(AttnbenchError, match="no such results file"),
    ):
        h.add(tmp_path / "missing")


def test_a_step_in_the_history_is_found_at_its_commit(history, tmp_path):
    """gau 1.3x slower from commit 15 of 30: both its cases step there, nothing else moves."""
    levels = [{"local": 0.5, "gau": 1.2 * (1.3 if i >= 15 else 1.0)} for i in range(30)]
    for run in commit_line(tmp_path / "runs", levels):
        history.add(run)
    records = change_records(analyse(history))
    assert {r["case"].split()[0] for r in records} == {"gau:efficient"} and len(records) == 2
    for r in records:
        assert (r["kind"], r["slower"], r["commits"]) == ("step", True, 1)
        assert (r["last_commit_before"], r["first_commit_after"]) == (sha(14), sha(15))
        assert r["size"] == pytest.approx(1.3, rel=0.04) and r["confidence"] == "high"
    with pytest.raises(AttnbenchError, match="--threshold 1.0: accepted: a factor > 1"):
        analyse(history, threshold=1.0)
