"""The GPU tests' runner of ``attnbench gpu-check``, in-process with fake workers: which tests
run (markers, then what has no outcome yet), how many at once, what a worker that died in a
test leaves, stopping at the deadline, resuming, the JUnit record, and the worker plugin."""

from __future__ import annotations

import json
import os
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from attnbench.gpucheck import pytest_plugin, testrun
from attnbench.gpucheck.testrun import TestStage, TestState
from tests.helpers.gpucheck import FakeLauncher, ids

STAGE = TestStage("kernels", "gpu and not library", workers=2, timeout_s=60.0)


def run(state, launcher, collected, deadline_s=600.0, workers=2):
    deadline = time.monotonic() + deadline_s
    return testrun.run_stage(STAGE, collected, state, launcher, workers=workers,
                             deadline=deadline, sleep=lambda s: None)  # fmt: skip


def test_every_test_runs_in_chunks_at_most_workers_at_a_time(tmp_path):
    state, launcher = TestState(tmp_path), FakeLauncher({ids(8)[3]: "failed"})
    report = run(state, launcher, ids(8))
    assert sorted(n for chunk in launcher.started for n in chunk) == sorted(ids(8))
    assert len(launcher.started) == 4 and launcher.most <= 2  # 2 workers x 2 chunks
    assert report.ran == {"passed": 7, "failed": 1} and not report.stopped
    assert state.counts(ids(8)) == {"passed": 7, "failed": 1}


def test_a_worker_that_died_in_a_test_leaves_a_timeout_and_its_rest_runs_again(tmp_path):
    collected = ids(6)
    state, launcher = TestState(tmp_path), FakeLauncher({collected[1]: "hang"})
    report = run(state, launcher, collected, workers=1)
    ended = state.ended()
    assert ended[collected[1]]["outcome"] == "timeout" and ended[collected[1]]["limit_s"] == 60.0
    assert all(ended[n]["outcome"] == "passed" for n in collected if n != collected[1])
    assert [collected[2]] in launcher.started  # the hung worker's untried test: a new process
    assert report.ran["timeout"] == 1


def test_a_quick_death_is_a_crash_not_a_timeout(tmp_path):
    collected = ids(2)
    state = TestState(tmp_path)

    class Crash(FakeLauncher):
        def start(self, stage, chunk, events, junit, log):
            worker = super().start(stage, chunk, events, junit, log)
            worker.script = {chunk[0]: "busy"}
            worker.interrupted = True  # starts it, then "dies" at once
            return worker

    run(state, Crash(), collected, workers=1)
    assert state.ended()[collected[0]]["outcome"] == "crashed"


def test_the_deadline_stops_the_workers_and_the_next_run_resumes(tmp_path):
    collected = ids(8)
    state = TestState(tmp_path)
    busy = FakeLauncher({collected[0]: "busy", collected[4]: "busy"})
    report = run(state, busy, collected, deadline_s=0.0)
    assert report.stopped
    first = state.ended()
    assert collected[0] not in first  # interrupted mid-test: no outcome, it runs next time
    again = FakeLauncher()
    report = run(state, again, collected)
    ran = {n for chunk in again.started for n in chunk}
    assert ran == set(collected) - set(first) and collected[0] in ran
    assert report.before == len(first)
    assert state.counts(collected) == {"passed": 8}


def test_a_worker_that_ends_without_some_tests_does_not_loop(tmp_path):
    """pytest ran the chunk but never started one of its ids (renamed since collection)."""

    class Skips(FakeLauncher):
        def start(self, stage, chunk, events, junit, log):
            return super().start(stage, [n for n in chunk if n != ids(3)[1]], events, junit, log)

    state = TestState(tmp_path)
    report = testrun.run_stage(STAGE, ids(3), state, Skips(), workers=1,
                               deadline=time.monotonic() + 60, sleep=lambda s: None)  # fmt: skip
    assert report.unrunnable == [ids(3)[1]]
    assert ids(3)[1] not in state.ended()


def test_workers_are_the_stages_within_the_cores():
    assert testrun.stage_workers(STAGE, None, 16) == 2
    assert testrun.stage_workers(testrun.STAGES[0], None, 16) == 14
    assert testrun.stage_workers(testrun.STAGES[0], None, 2) == 1
    assert testrun.stage_workers(STAGE, 40, 8) == 6
    assert testrun.chunks(ids(5), 2) == [ids(5)[:2], ids(5)[2:4], ids(5)[4:]]
    assert testrun.chunks([], 3) == []


def test_the_stages_are_markers_kernels_before_libraries():
    names = [s.name for s in testrun.STAGES]
    assert names == ["kernels", "libraries"]
    assert testrun.STAGES[0].marker == "gpu and not library"
    assert testrun.STAGES[1].marker == "gpu and library"
    assert testrun.STAGES[1].workers < testrun.STAGES[0].workers
    assert testrun.STAGES[1].timeout_s > testrun.STAGES[0].timeout_s


def test_collection_reads_the_node_ids_of_the_marked_modules(tmp_path):
    tests = tmp_path / "tests"
    (tests / "kernels").mkdir(parents=True)
    (tests / "kernels" / "test_gpu.py").write_text("import pytest\npytestmark = pytest.mark.gpu\n")
    (tests / "kernels" / "test_cpu.py").write_text("def test_x(): pass\n")
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        out = "tests/kernels/test_gpu.py::test_a[1]\ntests/kernels/test_gpu.py::test_b\n\n"
        return subprocess.CompletedProcess(cmd, 0, out + "2 tests collected in 1.0s\n", "")

    found = testrun.collect(STAGE, tmp_path, tests, {}, run=fake_run)
    assert found == ["tests/kernels/test_gpu.py::test_a[1]", "tests/kernels/test_gpu.py::test_b"]
    cmd = seen["cmd"]
    assert cmd[cmd.index("-m", 3) + 1] == "gpu and not library" and "addopts=" in cmd
    assert str(tests / "kernels" / "test_gpu.py") in cmd
    assert str(tests / "kernels" / "test_cpu.py") not in cmd  # not imported to collect nothing

    def broken(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 4, "", "ERROR: file or directory not found\n")

    with pytest.raises(Exception, match="could not collect the kernels tests"):
        testrun.collect(STAGE, tmp_path, tests, {}, run=broken)


def test_a_workers_command_clears_addopts_and_loads_the_plugin(tmp_path):
    cmd = testrun.pytest_command(STAGE, ids(2), tmp_path / "j.xml", python="py")
    assert cmd[:3] == ["py", "-m", "pytest"] and cmd[-2:] == ids(2)
    assert "attnbench.gpucheck.pytest_plugin" in cmd and "addopts=" in cmd
    assert f"--junitxml={tmp_path / 'j.xml'}" in cmd
    assert cmd[cmd.index("-m", 3) + 1] == STAGE.marker


def junit_file(path: Path, cases: list[tuple[str, str, str | None]]) -> None:
    suite = ET.Element("testsuite")
    for classname, name, kind in cases:
        case = ET.SubElement(suite, "testcase", classname=classname, name=name, time="0.1")
        if kind:
            ET.SubElement(case, kind, message=kind)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path)


def test_the_junit_record_merges_every_run_and_the_lost_tests(tmp_path):
    junit = tmp_path / "junit"
    junit.mkdir()
    cls = "tests.kernels.test_x"
    junit_file(junit / "a.xml", [(cls, "test_k[0]", None), (cls, "test_k[1]", "failure")])
    junit_file(junit / "b.xml", [(cls, "test_k[1]", None)])  # the rerun, later: it passed
    (junit / "c.xml").write_text("<testsuites><testsuite><testcase")  # a killed worker's
    state = TestState(tmp_path)
    own = state.new_events("kernels-driver")
    collected = ids(4)
    testrun.append_event(own, {"event": "end", "nodeid": collected[2], "outcome": "timeout",
                               "limit_s": 300.0, "duration": 300.5})  # fmt: skip
    # A test that ended in a worker whose JUnit file was lost (it died later, in another test).
    testrun.append_event(own, {"event": "end", "nodeid": collected[3], "outcome": "skipped"})
    os.utime(junit / "b.xml", (time.time() + 5, time.time() + 5))
    counts = testrun.merge_junit(junit, state, tmp_path / "junit.xml")
    assert counts == {"tests": 4, "passed": 2, "failure": 0, "error": 1, "skipped": 1}
    root = ET.parse(tmp_path / "junit.xml").getroot()
    suite = root.find("testsuite")
    assert suite.get("tests") == "4" and suite.get("errors") == "1"
    timeout = [c for c in suite.iter("testcase") if c.get("name") == "test_k[2]"][0]
    assert "per-test limit of 300.0 s" in timeout.find("error").get("message")


def test_junit_names_follow_pytests():
    assert testrun.junit_key("tests/k/test_x.py::test_y[1]") == ("tests.k.test_x", "test_y[1]")
    assert testrun.junit_key("tests/k/test_x.py::C::test_y") == ("tests.k.test_x.C", "test_y")


def test_state_ignores_a_half_written_line(tmp_path):
    state = TestState(tmp_path)
    path = state.new_events("kernels")
    path.write_text(json.dumps({"event": "end", "nodeid": "a", "outcome": "passed"}) + '\n{"ev')
    assert list(state.ended()) == ["a"] and state.remaining(["a", "b"]) == ["b"]


# -- the worker plugin ---------------------------------------------------------------------


class Report:
    def __init__(self, nodeid, when, outcome) -> None:
        self.nodeid, self.when, self.outcome = nodeid, when, outcome


def test_the_plugin_writes_each_tests_start_and_outcome(tmp_path, monkeypatch):
    events = tmp_path / "e.jsonl"
    monkeypatch.setenv(pytest_plugin.EVENTS_VAR, str(events))
    monkeypatch.setenv(pytest_plugin.TIMEOUT_VAR, "120")
    armed = []
    monkeypatch.setattr(
        pytest_plugin.faulthandler,
        "dump_traceback_later",
        lambda t, exit, file: armed.append((t, exit)),
    )
    monkeypatch.setattr(pytest_plugin.faulthandler, "cancel_dump_traceback_later",
                        lambda: armed.append("cancel"))  # fmt: skip
    item = type("Item", (), {"nodeid": "t.py::test_a"})()
    wrapper = pytest_plugin.pytest_runtest_protocol(item, None)  # a hook wrapper: a generator
    next(wrapper)
    for when, outcome in (("setup", "passed"), ("call", "failed"), ("teardown", "passed")):
        pytest_plugin.pytest_runtest_logreport(Report("t.py::test_a", when, outcome))
    with pytest.raises(StopIteration):
        next(wrapper)
    assert armed == [(120.0, True), "cancel"]  # the limit ends the process: exit=True
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["event"] for e in lines] == ["start", "end"]
    assert lines[1]["outcome"] == "failed" and lines[1]["nodeid"] == "t.py::test_a"


@pytest.mark.parametrize(
    ("phases", "outcome"),
    [([("setup", "passed"), ("call", "passed"), ("teardown", "passed")], "passed"),
     ([("setup", "skipped"), ("teardown", "passed")], "skipped"),
     ([("setup", "failed"), ("teardown", "passed")], "error"),
     ([("setup", "passed"), ("call", "passed"), ("teardown", "failed")], "error"),
     ([("setup", "passed"), ("call", "failed"), ("teardown", "failed")], "failed")],
)  # fmt: skip
def test_the_outcome_of_a_tests_phases(phases, outcome):
    merged = None
    for when, result in phases:
        merged = pytest_plugin.merged_outcome(merged, when, result)
    assert merged == outcome


def test_no_limit_without_the_variable(monkeypatch):
    monkeypatch.delenv(pytest_plugin.TIMEOUT_VAR, raising=False)
    assert pytest_plugin.per_test_limit() == 0.0
    monkeypatch.setenv(pytest_plugin.TIMEOUT_VAR, "x")
    assert pytest_plugin.per_test_limit() == 0.0


def test_real_workers_record_outcomes_and_a_timeout(tmp_path):
    """The one end-to-end run: real pytest workers with the plugin, on a tiny project of tests
    marked gpu that need no GPU. The per-test limit must end the worker process itself, which
    no in-process fake can show; the test after the stuck one runs in a new worker."""
    import sys

    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = "-m \'not gpu\'"\nmarkers = ["gpu: a GPU test"]\n'
    )
    (project / "tests" / "test_fake.py").write_text(
        "import time\nimport pytest\npytestmark = pytest.mark.gpu\n\n"
        "def test_a():\n    pass\n\n"
        "def test_b():\n    time.sleep(60)\n\n"
        "def test_c():\n    assert False\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    stage = TestStage("kernels", "gpu", workers=1, timeout_s=3.0)
    collected = testrun.collect(stage, project, project / "tests", env)
    assert [n.split("::")[1] for n in collected] == ["test_a", "test_b", "test_c"]
    state = TestState(tmp_path / "out")
    launcher = testrun.PytestLauncher(project, env, python=sys.executable)
    report = testrun.run_stage(stage, collected, state, launcher, workers=1,
                               deadline=time.monotonic() + 120)  # fmt: skip
    outcomes = {n.split("::")[1]: e["outcome"] for n, e in state.ended().items()}
    assert outcomes == {"test_a": "passed", "test_b": "timeout", "test_c": "failed"}
    assert not report.stopped
    logs = "".join(p.read_text() for p in (tmp_path / "out" / "logs").glob("*.log"))
    assert "Timeout" in logs  # faulthandler's dump of the stuck test's stack
    counts = testrun.merge_junit(tmp_path / "out" / "junit", state, tmp_path / "junit.xml")
    assert counts["tests"] == 3 and counts["failure"] == 1 and counts["error"] == 1
