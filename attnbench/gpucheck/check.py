"""``attnbench gpu-check`` put together: the environment record, the GPU tests, the speed
suites, within one time budget, into one folder that the next run continues.

Order matters, and is kept here: the tests first (they check the kernels the suites then time,
and they compile and autotune into the on-disk caches as they go); the suites only once every
test worker has exited, so that nothing else runs on the GPU while it is timed (H100 round 4: a
sweep started while pytest workers still loaded the machine spent its whole budget in FLA's
autotuning). The tests get the budget less what the suites need (``speed_s``); tests left
undone at their deadline wait for the next run.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from attnbench.core.errors import AttnbenchError
from attnbench.gpucheck import environment as env_record
from attnbench.gpucheck import speedstage, testrun
from attnbench.gpucheck.testrun import STAGES, TestStage, TestState
from attnbench.runtime.caches import CompileCaches
from attnbench.runtime.outputs import write_text

#: Exit codes: every check done and passed; a failure (a test, a suite); something left for the
#: next run (the budget ran out first: run the same command again to continue).
OK, FAILED, UNFINISHED = 0, 1, 75
#: The default budget keeps the command under ten minutes, the machine's start aside.
BUDGET_S = 540.0
#: What the default GPU suite needs (about 3 minutes from cold caches), kept from the tests.
SPEED_S = 210.0
#: Outcomes that fail the check.
BAD = ("failed", "error", "timeout", "crashed")


@dataclass
class Options:
    """What ``attnbench gpu-check`` was asked to do."""

    out: Path
    suites: tuple[str, ...]
    tests: Path | None  # the test folder of a checkout (None: no tests here)
    budget_s: float = BUDGET_S
    speed_s: float = SPEED_S
    workers: int | None = None
    fresh: bool = False
    stages: tuple[TestStage, ...] = STAGES


@dataclass
class Result:
    env: Path | None = None
    tests: dict[str, int] = field(default_factory=dict)  # outcome -> count, every run so far
    junit: Path | None = None
    speeds: list[speedstage.SpeedOutcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def code(self) -> int:
        failed = any(self.tests.get(k) for k in BAD) or any(
            s.code not in (0, speedstage.INTERRUPTED) for s in self.speeds
        )
        unfinished = bool(self.tests.get("not run")) or any(
            s.code == speedstage.INTERRUPTED for s in self.speeds
        )
        return FAILED if failed else UNFINISHED if unfinished else OK


def find_tests(given: Path | None, package_root: Path, cwd: Path) -> Path | None:
    """The tests folder: ``--tests``, else ``tests/`` here, else the one beside the package (a
    checkout); None when there is none (an installed package has no tests)."""
    if given is not None:
        if not given.is_dir():
            raise AttnbenchError(f"--tests {given}: not a folder; give the checkout's tests/")
        return given
    for candidate in (cwd / "tests", package_root / "tests"):
        if (candidate / "kernels").is_dir():
            return candidate
    return None


def start_over(folder: Path) -> Path | None:
    """``--fresh``: the earlier record moved aside (``tests-<time>``), never deleted."""
    if not folder.exists():
        return None
    aside = folder.with_name(f"{folder.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    shutil.move(str(folder), str(aside))
    return aside


def run_tests(
    opts: Options,
    env: dict[str, str],
    deadline: float,
    note: Callable[[str], None],
    collector: Callable[..., list[str]],
    launcher: testrun.Launcher,
    result: Result,
) -> None:
    """Every stage's tests until ``deadline``; the merged JUnit record and the counts."""
    folder = opts.out / "tests"
    if opts.fresh and (aside := start_over(folder)):
        note(f"--fresh: the earlier test record is kept in {aside}")
    state = TestState(folder)
    root = opts.tests.parent
    every: list[str] = []
    for stage in opts.stages:  # collected even when no time is left: the record counts them
        collected = collector(stage, root, opts.tests, env)
        every += collected
        workers = testrun.stage_workers(stage, opts.workers, os.cpu_count())
        testrun.run_stage(
            stage, collected, state, launcher, workers=workers, deadline=deadline, note=note
        )
    result.tests = state.counts(every)
    result.junit = folder / "junit.xml"
    testrun.merge_junit(folder / "junit", state, result.junit)
    write_text(folder / "summary.json", json.dumps(result.tests, indent=2) + "\n")
    note(f"tests: {summary_text(result.tests)}; JUnit record {result.junit}")


def summary_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in counts.items()) or "none collected"


def run_speed_suites(
    opts: Options,
    here: dict[str, Any],
    deadline: float,
    spawn: speedstage.Spawn,
    note: Callable[[str], None],
    result: Result,
) -> None:
    """The suites, one after the other, until ``deadline``."""
    for suite in opts.suites:
        if deadline - time.monotonic() < speedstage.MIN_LEFT_S:
            note(f"speed {suite}: not started, the budget is spent (run gpu-check again)")
            result.speeds.append(
                speedstage.SpeedOutcome(
                    suite,
                    opts.out / "speed" / speedstage.suite_folder(suite),
                    speedstage.INTERRUPTED,
                    False,
                    0.0,
                )
            )
            continue
        sha = suite_sha256(suite)
        outcome = speedstage.run_suite(
            suite, opts.out, deadline, {**here, "suite": {"sha256": sha}}, spawn, note
        )
        result.speeds.append(outcome)
        how = "continued" if outcome.resumed else "started"
        note(
            f"speed {suite} ({how}): {outcome.status} in {outcome.wall_s:.0f} s -> {outcome.folder}"
        )


def suite_sha256(suite: str) -> str | None:
    from attnbench.runtime.tomlconfig import find_suite, load

    return load(find_suite(suite)).sha256


def gpu_check(
    opts: Options,
    caches: CompileCaches,
    note: Callable[[str], None],
    *,
    collector: Callable[..., list[str]] = testrun.collect,
    launcher: testrun.Launcher | None = None,
    spawn: speedstage.Spawn | None = None,
    record: Callable[..., dict] = env_record.environment,
    here: Callable[[], dict] | None = None,
) -> Result:
    """The whole check (see the module docstring). The process-starting parts can be replaced
    (``collector``, ``launcher``, ``spawn``, ``record``, ``here``) to test the logic here."""
    started = time.monotonic()
    deadline = started + opts.budget_s
    opts.out.mkdir(parents=True, exist_ok=True)
    package_root = Path(__file__).resolve().parent.parent.parent
    env = speedstage.child_environment(caches.environment(), package_root)
    result = Result()
    info = record(caches.describe())
    result.env = env_record.write_environment(opts.out / "env.json", info)
    gpu = (info.get("gpu") or {}).get("name", "no GPU")
    note(f"environment: {gpu}, torch {info['versions'].get('torch')} -> {result.env}")
    if opts.tests is None:
        note(
            "tests: no tests folder here (an installed attnbench has none); run gpu-check "
            "from a checkout to run them"
        )
    else:
        launcher = launcher or testrun.PytestLauncher(opts.tests.parent, env)
        run_tests(opts, env, deadline - opts.speed_s, note, collector, launcher, result)
    # The GPU to itself while timing: every test worker has exited by now; say if anything
    # else still holds the GPU.
    others = env_record.gpu_processes() if info.get("cuda_available") else []
    if others:
        note(f"warning: other processes use the GPU while the suites are timed: {others}")
    spawn = spawn or partial(_spawn, env=env, cwd=Path.cwd())
    run_speed_suites(opts, (here or _here)(), deadline, spawn, note, result)
    write_text(
        opts.out / "gpu-check.json",
        json.dumps(_record(opts, result, started), indent=2, default=str) + "\n",
    )
    return result


def _spawn(
    cmd: Sequence[str],
    log: Path,
    deadline: float,
    echo: Callable[[str], None],
    *,
    env: dict[str, str],
    cwd: Path,
) -> int:
    return speedstage.run_logged(cmd, log, deadline, echo, env=env, cwd=cwd)


def _here() -> dict:
    return speedstage.here_now(None)


def _record(opts: Options, result: Result, started: float) -> dict[str, Any]:
    return {
        "wall_s": round(time.monotonic() - started, 1),
        "budget_s": opts.budget_s,
        "exit_code": result.code,
        "env": str(result.env),
        "tests": result.tests,
        "junit": str(result.junit) if result.junit else None,
        "speed": [
            {
                "suite": s.suite,
                "folder": str(s.folder),
                "status": s.status,
                "resumed": s.resumed,
                "wall_s": round(s.wall_s, 1),
            }
            for s in result.speeds
        ],
    }


def plan_lines(
    opts: Options, env: dict[str, str], collector: Callable[..., list[str]] | None = None
) -> list[str]:
    """``--dry-run``: what a run would do here, nothing run (the tests are collected, which
    needs no GPU)."""
    collector = collector or testrun.collect
    lines = [f"environment record -> {opts.out / 'env.json'}"]
    if opts.tests is None:
        lines.append("tests: no tests folder here (run from a checkout)")
    else:
        state = TestState(opts.out / "tests")
        for stage in opts.stages:
            collected = collector(stage, opts.tests.parent, opts.tests, env)
            todo = len(collected) if opts.fresh else len(state.remaining(collected))
            workers = testrun.stage_workers(stage, opts.workers, os.cpu_count())
            lines.append(
                f"tests ({stage.name}, -m '{stage.marker}'): {len(collected)} collected, "
                f"{todo} to run; {workers} workers, {stage.timeout_s:.0f} s a test"
            )
    for suite in opts.suites:
        folder = opts.out / "speed" / speedstage.suite_folder(suite)
        how = "continued if unfinished" if (folder / "results.csv").exists() else "started"
        lines.append(f"speed {suite} -> {folder} ({how})")
    lines.append(
        f"budget: {opts.budget_s:.0f} s in all, the last {opts.speed_s:.0f} s kept for the suites"
    )
    return lines
