"""``attnbench gpu-check`` put together, in-process with fakes for every process it starts: the
environment record, the tests, the suites in order within the budget, the suites continued or
started over, the exit code; the environment record on a faked CUDA; the command line."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.gpucheck import check, environment, speedstage
from attnbench.gpucheck.testrun import TestStage
from attnbench.runtime.caches import resolve_caches
from tests.helpers.gpucheck import FakeLauncher, ids

runner = CliRunner()
STAGES = (TestStage("kernels", "gpu and not library", 2, 60.0),
          TestStage("libraries", "gpu and library", 1, 90.0))  # fmt: skip
HERE = {"machine": {"gpu": "NVIDIA H200", "cpu_model": "EPYC"}, "versions": {"torch": "2.11"},
        "git": {"sha": "abc"}}  # fmt: skip


def record(caches):
    return {"versions": {"torch": "2.11"}, "gpu": {"name": "NVIDIA H200"}, "caches": caches,
            "cuda_available": False}  # fmt: skip


def collector(stage, root, tests, env):
    return ids(4) if stage.name == "kernels" else [f"tests/kernels/test_lib.py::test_l[{i}]"
                                                    for i in range(2)]  # fmt: skip


class Spawns:
    """Fake ``attnbench run speed`` processes: the exit codes to give, the commands seen."""

    def __init__(self, *codes: int) -> None:
        self.codes = list(codes)
        self.commands: list[list[str]] = []

    def __call__(self, cmd, log, deadline, echo):
        self.commands.append(list(cmd))
        echo(f"[1/1] {cmd[cmd.index('--suite') + 1]} ok")
        return self.codes.pop(0) if self.codes else 0


def options(tmp_path, **changes):
    tests = tmp_path / "repo" / "tests"
    tests.mkdir(parents=True, exist_ok=True)
    base = dict(out=tmp_path / "out", suites=("speed-gpu",), tests=tests, stages=STAGES)
    return check.Options(**{**base, **changes})


def run_check(opts, launcher=None, spawn=None, notes=None):
    return check.gpu_check(
        opts, resolve_caches(opts.out / "cache"), (notes if notes is not None else []).append,
        collector=collector, launcher=launcher or FakeLauncher(), spawn=spawn or Spawns(0),
        record=record, here=lambda: dict(HERE),
    )  # fmt: skip


def test_environment_tests_then_the_default_suite(tmp_path):
    opts, notes, spawn = options(tmp_path), [], Spawns(0)
    result = run_check(opts, spawn=spawn, notes=notes)
    assert json.loads((opts.out / "env.json").read_text())["gpu"]["name"] == "NVIDIA H200"
    assert result.tests == {"passed": 6} and result.code == check.OK
    assert (opts.out / "tests" / "junit.xml").is_file()
    assert json.loads((opts.out / "tests" / "summary.json").read_text()) == {"passed": 6}
    [cmd] = spawn.commands
    assert cmd[cmd.index("--suite") + 1] == "speed-gpu" and "--overwrite" in cmd
    assert cmd[cmd.index("--out") + 1] == str(opts.out / "speed" / "speed-gpu")
    order = [n for n in notes if n.startswith(("environment", "tests (", "speed"))]
    assert order[0].startswith("environment: NVIDIA H200")
    assert order[-1].startswith("speed speed-gpu (started): done")
    assert "[1/1] speed-gpu ok" in notes  # the suite's progress, as it runs
    summary = json.loads((opts.out / "gpu-check.json").read_text())
    assert summary["exit_code"] == 0 and summary["speed"][0]["status"] == "done"


def test_a_failed_test_fails_the_check_and_the_next_run_skips_what_ended(tmp_path):
    opts = options(tmp_path)
    first = run_check(opts, launcher=FakeLauncher({ids(4)[2]: "failed"}))
    assert first.tests == {"passed": 5, "failed": 1} and first.code == check.FAILED
    again = FakeLauncher()
    second = run_check(opts, launcher=again)
    assert again.started == [] and second.tests == first.tests  # nothing left to run


def test_fresh_runs_every_test_again_and_keeps_the_old_record(tmp_path):
    opts = options(tmp_path)
    run_check(opts)
    again = FakeLauncher()
    result = run_check(options(tmp_path, fresh=True), launcher=again)
    assert sum(len(c) for c in again.started) == 6 and result.tests == {"passed": 6}
    assert [p for p in (opts.out).iterdir() if p.name.startswith("tests-")]


def test_tests_left_at_the_deadline_make_the_check_unfinished(tmp_path):
    opts = options(tmp_path, budget_s=100.0, speed_s=100.0)  # no time left for the tests
    result = run_check(opts)
    assert result.tests == {"not run": 6} and result.code == check.UNFINISHED


def test_without_a_tests_folder_the_suites_still_run(tmp_path):
    notes, spawn = [], Spawns(0)
    result = run_check(options(tmp_path, tests=None), spawn=spawn, notes=notes)
    assert result.tests == {} and len(spawn.commands) == 1
    assert any("no tests folder here" in n for n in notes)


def test_a_suite_stopped_at_the_deadline_is_continued_by_the_next_run(tmp_path, monkeypatch):
    opts = options(tmp_path, suites=("speed-gpu", "gpu/flex"))
    spawn = Spawns(speedstage.INTERRUPTED, 0)
    result = run_check(opts, spawn=spawn)
    assert [s.code for s in result.speeds] == [130, 0] and result.code == check.UNFINISHED
    assert "--suite" in spawn.commands[1] and "gpu/flex" in spawn.commands[1]
    folder = opts.out / "speed" / "speed-gpu"
    folder.mkdir(parents=True)
    (folder / "results.csv").write_text("rows\n")
    sidecar = {**HERE, "suite": {"sha256": check.suite_sha256("speed-gpu")}}
    (folder / "results.json").write_text(json.dumps(sidecar))
    again = Spawns(0, 0)
    run_check(opts, spawn=again)
    assert "--resume" in again.commands[0] and "--overwrite" in again.commands[1]


def test_a_sticky_cuda_error_is_continued_in_a_fresh_process(tmp_path):
    spawn = Spawns(speedstage.STICKY_EXIT, 0)
    result = run_check(options(tmp_path), spawn=spawn)
    assert len(spawn.commands) == 2 and "--resume" in spawn.commands[1]
    assert result.speeds[0].code == 0


@pytest.mark.parametrize(
    ("change", "continued"),
    [({}, True), ({"machine": {"gpu": "NVIDIA H100", "cpu_model": "EPYC"}}, False),
     ({"versions": {"torch": "2.12"}}, False), ({"git": {"sha": "def"}}, False),
     ({"suite": {"sha256": "another file"}}, False)],
)  # fmt: skip
def test_rows_are_continued_only_with_the_same_machine_code_and_suite(tmp_path, change, continued):
    here = {**HERE, "suite": {"sha256": "s"}}
    (tmp_path / "results.csv").write_text("rows\n")
    (tmp_path / "results.json").write_text(json.dumps({**here, **change}))
    assert speedstage.continues(tmp_path, here) is continued
    (tmp_path / "results.csv").unlink()
    assert speedstage.continues(tmp_path, here) is False  # nothing to keep


def test_suite_folders():
    assert speedstage.suite_folder("gpu/flex") == "gpu-flex"
    assert speedstage.suite_folder("/some/where/mine.toml") == "mine"
    assert speedstage.suite_folder("speed-gpu") == "speed-gpu"


def test_the_children_run_this_attnbench_with_the_caches(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    env = speedstage.child_environment({"TRITON_CACHE_DIR": "/c/triton"}, tmp_path)
    assert env["TRITON_CACHE_DIR"] == "/c/triton" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_find_tests(tmp_path):
    (tmp_path / "tests" / "kernels").mkdir(parents=True)
    assert check.find_tests(None, tmp_path / "nowhere", tmp_path) == tmp_path / "tests"
    assert check.find_tests(None, tmp_path / "nowhere", tmp_path / "nowhere") is None
    with pytest.raises(Exception, match="not a folder"):
        check.find_tests(tmp_path / "missing", tmp_path, tmp_path)


# -- the environment record, on a faked CUDA -----------------------------------------------


def test_the_environment_record_on_a_gpu(monkeypatch):
    props = SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2**30, multi_processor_count=132,
                            major=9, minor=0, L2_cache_size=60 * 2**20)  # fmt: skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(environment, "sdpa_backends", lambda device: {"cudnn d=128": "available"})
    monkeypatch.setattr(environment.machine, "versions", lambda: {"torch": "2.11.0+cu130"})

    def smi(cmd, **kwargs):
        if any("compute-apps" in a for a in cmd):
            return subprocess.CompletedProcess(cmd, 0, "4242, python, 900 MiB\n1, me, 1 MiB\n", "")
        return subprocess.CompletedProcess(cmd, 0, "name, driver_version\nNVIDIA H200, 580\n", "")

    info = environment.environment({"inductor": "/c/inductor"}, run=smi)
    assert info["gpu"] == {
        "name": "NVIDIA H200",
        "memory_bytes": 141 * 2**30,
        "multiprocessors": 132,
        "capability": "9.0",
        "l2_bytes": 60 * 2**20,
    }
    assert info["nvidia_smi"].endswith("NVIDIA H200, 580")
    assert info["compile_caches"] == {"inductor": "/c/inductor"}
    assert info["sdpa"] == {"cudnn d=128": "available"}
    assert environment.gpu_processes(smi, own=1) == ["4242, python, 900 MiB"]


def test_no_nvidia_smi_is_said_not_raised():
    def missing(cmd, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    assert environment.nvidia_smi(missing).startswith("nvidia-smi not available")
    assert environment.gpu_processes(missing) == []


# -- the command line ----------------------------------------------------------------------


def test_gpu_check_without_a_gpu_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = runner.invoke(app, ["gpu-check", "--out", str(tmp_path / "o"), "--no-tests"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "needs a CUDA GPU" in lines[0]


@pytest.mark.parametrize(
    ("args", "words"),
    [(["--suite", "gpu/nope"], "gpu/nope"), (["--speed-s", "600"], "--speed-s 600")],
)
def test_gpu_check_bad_options_are_one_line(tmp_path, args, words):
    result = runner.invoke(app, ["gpu-check", "--out", str(tmp_path / "o"), *args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and words in lines[0], result.output


def test_gpu_check_dry_run_says_what_it_would_run(monkeypatch, tmp_path):
    from attnbench.gpucheck import testrun

    monkeypatch.setattr(testrun, "collect", collector)
    result = runner.invoke(app, ["gpu-check", "--dry-run", "--out", str(tmp_path / "o"),
                                 "--suite", "gpu/flex"])  # fmt: skip
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "tests (kernels, -m 'gpu and not library'): 4 collected, 4 to run" in text
    assert "tests (libraries, -m 'gpu and library'): 2 collected" in text
    assert "speed speed-gpu ->" in text and "speed gpu/flex ->" in text
    assert not (tmp_path / "o").exists()  # nothing run, nothing written


def test_the_check_real_run_path_is_used_when_cuda_is_visible(monkeypatch, tmp_path):
    """The command line hands its options to gpu_check (faked here) and exits with its code."""
    seen = {}

    def fake(opts, caches, note):
        seen["opts"] = opts
        note("environment: fake")
        return check.Result(tests={"passed": 3})

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(check, "gpu_check", fake)
    result = runner.invoke(
        app,
        [
            "gpu-check",
            "--out",
            str(tmp_path / "o"),
            "--workers",
            "3",
            "--suite",
            "gpu/flex",
            "--budget-s",
            "300",
            "--speed-s",
            "100",
        ],
    )
    assert result.exit_code == 0, result.output
    opts = seen["opts"]
    assert opts.suites == ("speed-gpu", "gpu/flex") and opts.workers == 3
    assert (opts.budget_s, opts.speed_s) == (300.0, 100.0)
    assert "tests 3 passed" in result.stdout
    assert "environment: fake" in (tmp_path / "o" / "gpu-check.log").read_text()
