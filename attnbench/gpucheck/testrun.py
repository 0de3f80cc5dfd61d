"""The GPU tests of ``attnbench gpu-check``: chosen by pytest markers, run in parallel worker
processes with a per-test limit, every outcome on disk as it happens, resumed by the next run.

Stages (:data:`STAGES`) run one after the other, each the tests of one marker expression. In a
stage, the tests not yet ended in this folder are split into chunks, and up to ``workers`` pytest
processes run a chunk each (a new process takes the next chunk). Each worker writes each test's
start and end to its own events file (:mod:`attnbench.gpucheck.pytest_plugin`), its JUnit XML and
its log. A worker that died inside a test (the per-test limit ends the process) leaves that test
without an end: it is recorded here as ``timeout`` (or ``crashed``, when it died sooner) and the
tests it had not started go to a new process. At the deadline the workers are interrupted
(pytest writes what it has) and the tests they had not finished stay for the next run, which
reads every events file of the folder and runs only what has no outcome yet (:class:`TestState`).
The JUnit files of every run are merged into one record, ``junit.xml`` (:func:`merge_junit`).
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from attnbench.core.errors import AttnbenchError
from attnbench.gpucheck.pytest_plugin import EVENTS_VAR, LOG_VAR, TIMEOUT_VAR


@dataclass(frozen=True)
class TestStage:
    """The tests of one pytest marker expression, with their parallelism and time limit."""

    __test__ = False  # not a pytest test class, whatever its name

    name: str
    marker: str
    workers: int  # at most (and never more than the machine's cores less two)
    timeout_s: float  # per test


#: The stages, in order. attnbench's own kernels first: they compile in seconds, and a kernel
#: test that fails says more than anything after it. The library-backed paths after them, with
#: fewer workers and a longer limit: FLA's backward kernels autotune for minutes in every process,
#: and with 11 workers doing it at once two of its cases passed a 200 s limit inside their first
#: backward call while compiling, not testing (H100, results/speed/nvidia-h100, round 5).
STAGES: tuple[TestStage, ...] = (
    TestStage("kernels", "gpu and not library", workers=14, timeout_s=300.0),
    TestStage("libraries", "gpu and library", workers=4, timeout_s=420.0),
)

#: What a test ended as. ``timeout``: its worker was ended by the per-test limit; ``crashed``:
#: its worker died sooner (a segfault, a CUDA error that killed the process).
OUTCOMES = ("passed", "failed", "error", "skipped", "timeout", "crashed")
#: Chunks per worker: a new process for every chunk costs a start (imports, CUDA), more chunks
#: balance the workers' loads better.
CHUNKS_PER_WORKER = 2
#: How long interrupted workers get to write their JUnit files before they are killed.
STOP_GRACE_S = 20.0
POLL_S = 0.5


def stage_workers(stage: TestStage, asked: int | None, cores: int | None) -> int:
    """Workers for ``stage``: ``asked`` (``--workers``) or the stage's own number, at most the
    cores less two (one for this process, one for the GPU's driver threads), at least one."""
    want = asked if asked else stage.workers
    return max(1, min(want, (cores or 1) - 2))


def chunks(ids: Sequence[str], workers: int) -> list[list[str]]:
    """``ids`` in contiguous chunks, about CHUNKS_PER_WORKER a worker (neighbours share compiled
    kernels within a process)."""
    if not ids:
        return []
    size = math.ceil(len(ids) / (max(1, workers) * CHUNKS_PER_WORKER))
    return [list(ids[i : i + size]) for i in range(0, len(ids), size)]


class TestState:
    """The tests that ended in a run folder, read from every events file in it."""

    __test__ = False

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.events = folder / "events"

    def ended(self) -> dict[str, dict]:
        """nodeid -> its last end event (outcome, duration, and for a timeout, its limit)."""
        out: dict[str, dict] = {}
        for path in sorted(self.events.glob("*.jsonl")):
            for event in read_events(path):
                if event.get("event") == "end":
                    out[event["nodeid"]] = event
        return out

    def remaining(self, collected: Sequence[str]) -> list[str]:
        """The collected tests with no outcome yet, in collection order."""
        ended = self.ended()
        return [n for n in collected if n not in ended]

    def counts(self, collected: Sequence[str]) -> dict[str, int]:
        """How many of ``collected`` ended as each outcome, and how many have not run."""
        ended = self.ended()
        counts = Counter(ended[n]["outcome"] for n in collected if n in ended)
        counts["not run"] = sum(1 for n in collected if n not in ended)
        return {k: counts[k] for k in (*OUTCOMES, "not run") if counts[k]}

    def new_events(self, tag: str) -> Path:
        """A fresh events file for one worker (or for this driver's own records)."""
        self.events.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for i in range(10_000):
            path = self.events / f"{stamp}-{tag}-{i}.jsonl"
            if not path.exists():
                path.touch()
                return path
        raise AttnbenchError(f"{self.events}: cannot make a new events file")


def read_events(path: Path) -> list[dict]:
    """The events of one file; a half-written last line (a killed worker) is dropped."""
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def append_event(path: Path, event: dict) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")


# --------------------------------------------------------------------------------------------
# Worker processes
# --------------------------------------------------------------------------------------------


class Handle(Protocol):
    def poll(self) -> int | None: ...
    def interrupt(self) -> None: ...
    def kill(self) -> None: ...


class Launcher(Protocol):
    def start(
        self, stage: TestStage, ids: list[str], events: Path, junit: Path, log: Path
    ) -> Handle: ...


@dataclass
class PytestProcess:
    """A running pytest worker (a process group of its own: Ctrl-C in the terminal reaches the
    driver, which interrupts the workers itself)."""

    process: subprocess.Popen
    log: object

    def poll(self) -> int | None:
        code = self.process.poll()
        if code is not None:
            self.log.close()
        return code

    def interrupt(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.log.close()


def pytest_command(
    stage: TestStage, ids: Sequence[str], junit: Path, python: str = sys.executable
) -> list[str]:
    """A worker's command line: the stage's marker (the project's ``addopts``, which deselect
    the GPU tests, cleared), this package's plugin, the JUnit file, the node ids."""
    return [
        python,
        "-m",
        "pytest",
        "-p",
        "attnbench.gpucheck.pytest_plugin",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-m",
        stage.marker,
        "-q",
        "-rfEs",
        "--tb=short",
        f"--junitxml={junit}",
        *ids,
    ]


@dataclass
class PytestLauncher:
    """Starts pytest workers in ``root`` (the checkout) with ``env``."""

    root: Path
    env: Mapping[str, str]
    python: str = sys.executable

    def start(
        self, stage: TestStage, ids: list[str], events: Path, junit: Path, log: Path
    ) -> PytestProcess:
        env = {**self.env, EVENTS_VAR: str(events), TIMEOUT_VAR: str(stage.timeout_s),
               LOG_VAR: str(log)}  # fmt: skip
        cmd = pytest_command(stage, ids, junit, self.python)
        log.parent.mkdir(parents=True, exist_ok=True)
        handle = log.open("w", encoding="utf-8")
        handle.write(f"$ {' '.join(cmd[:14])} ... ({len(ids)} node ids)\n")
        handle.flush()
        process = subprocess.Popen(
            cmd,
            cwd=self.root,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return PytestProcess(process, handle)


def marked_modules(tests: Path, marker: str = "gpu") -> list[Path]:
    """The test modules under ``tests`` that use ``marker`` (``pytest.mark.gpu``): pytest
    imports every module it is given to collect (a minute for the whole suite on a busy
    2-core machine), and only these can hold the GPU tests. The whole folder when none does."""
    needle = f"mark.{marker}"
    found = [p for p in sorted(tests.rglob("test_*.py")) if needle in _text(p)]
    return found or [tests]


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def collect(
    stage: TestStage,
    root: Path,
    tests: Path,
    env: Mapping[str, str],
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    python: str = sys.executable,
) -> list[str]:
    """The node ids of the stage's tests under ``tests``, as pytest collects them (a module
    that fails to import is reported, not fatal: its tests cannot be listed)."""
    cmd = [python, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=", "-p",
           "no:cacheprovider", "--continue-on-collection-errors", "-m", stage.marker,
           *(str(p) for p in marked_modules(tests))]  # fmt: skip
    done = run(cmd, cwd=root, env=dict(env), capture_output=True, text=True, timeout=600)
    ids = [line.strip() for line in done.stdout.splitlines() if "::" in line and " " not in line]
    if done.returncode not in (0, 1, 5) and not ids:  # 5: nothing selected
        last = done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or ["?"]
        raise AttnbenchError(f"pytest could not collect the {stage.name} tests: {last[-1]}")
    return ids


# --------------------------------------------------------------------------------------------
# One stage
# --------------------------------------------------------------------------------------------


@dataclass
class StageReport:
    """What a stage did in this run."""

    stage: TestStage
    collected: int
    before: int  # tests that had an outcome from earlier runs
    ran: Counter = field(default_factory=Counter)  # outcome -> count, this run
    stopped: bool = False  # the deadline came first: some tests are left for the next run
    unrunnable: list[str] = field(default_factory=list)  # a worker ended normally without them


@dataclass
class _Running:
    handle: Handle
    chunk: list[str]
    events: Path
    started: float


def run_stage(
    stage: TestStage,
    collected: Sequence[str],
    state: TestState,
    launcher: Launcher,
    *,
    workers: int,
    deadline: float,
    note: Callable[[str], None] = lambda line: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> StageReport:
    """Run the tests of ``collected`` that have no outcome in ``state`` yet, ``workers`` at a
    time, until they are done or ``deadline`` (on ``clock``) comes."""
    todo = state.remaining(collected)
    report = StageReport(stage, len(collected), len(collected) - len(todo))
    queue = deque(chunks(todo, workers))
    running: list[_Running] = []
    own = state.new_events(f"{stage.name}-driver")
    note(
        f"tests ({stage.name}, -m '{stage.marker}'): {len(todo)} to run, "
        f"{report.before} ended before; {workers} workers, {stage.timeout_s:.0f} s a test"
    )
    try:
        while queue or running:
            if clock() >= deadline:
                report.stopped = True
                stop_workers(running, clock, sleep)
                break
            while queue and len(running) < workers:
                running.append(_start(stage, queue.popleft(), state, launcher, clock()))
            for r in [r for r in running if r.handle.poll() is not None]:
                running.remove(r)
                _ended(stage, r, report, queue, own, clock())
                note(f"tests ({stage.name}): {_progress(report)}")
            if running:
                sleep(POLL_S)
    except KeyboardInterrupt:
        stop_workers(running, clock, sleep)
        raise
    return report


def _start(
    stage: TestStage, chunk: list[str], state: TestState, launcher: Launcher, now: float
) -> _Running:
    events = state.new_events(stage.name)
    folder = state.folder
    junit = folder / "junit" / f"{events.stem}.xml"
    junit.parent.mkdir(parents=True, exist_ok=True)
    log = folder / "logs" / f"{events.stem}.log"
    return _Running(launcher.start(stage, chunk, events, junit, log), chunk, events, now)


def _ended(
    stage: TestStage, r: _Running, report: StageReport, queue: deque, own: Path, now: float
) -> None:
    """A worker has exited: count its outcomes; a test it started and never ended is a timeout
    (or a crash), and the tests after it go back to the queue, in a new process."""
    events = read_events(r.events)
    started = {e["nodeid"]: e.get("time") for e in events if e.get("event") == "start"}
    ended = {e["nodeid"]: e for e in events if e.get("event") == "end"}
    for e in ended.values():
        report.ran[e["outcome"]] += 1
    cut = [n for n in started if n not in ended]
    if cut:
        nodeid = cut[0]
        began = started[nodeid]
        took = time.time() - began if isinstance(began, (int, float)) else None
        outcome = "timeout" if took is None or took >= 0.95 * stage.timeout_s else "crashed"
        append_event(
            own,
            {
                "event": "end",
                "nodeid": nodeid,
                "outcome": outcome,
                "duration": round(took, 1) if took else None,
                "limit_s": stage.timeout_s,
            },
        )
        report.ran[outcome] += 1
    rest = [n for n in r.chunk if n not in started]
    if rest and cut:
        queue.appendleft(rest)
    elif rest:
        report.unrunnable.extend(rest)


def stop_workers(
    running: list[_Running],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    grace_s: float = STOP_GRACE_S,
) -> None:
    """Interrupt every worker (pytest stops after the test it is in and writes its JUnit file),
    then kill what is still running ``grace_s`` later. Their unfinished tests stay undone."""
    for r in running:
        r.handle.interrupt()
    until = clock() + grace_s
    while any(r.handle.poll() is None for r in running) and clock() < until:
        sleep(POLL_S)
    for r in running:
        if r.handle.poll() is None:
            r.handle.kill()
    running.clear()


def _progress(report: StageReport) -> str:
    done = sum(report.ran.values())
    parts = ", ".join(f"{n} {k}" for k, n in sorted(report.ran.items()))
    return f"{report.before + done}/{report.collected} ended ({parts})"


# --------------------------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------------------------


def merge_junit(folder: Path, state: TestState, out: Path) -> dict[str, int]:
    """Every JUnit file of ``folder`` (all runs; a test's latest result wins), and every test
    that ended without a JUnit entry (its worker died later, in another test, before writing
    its file; or it timed out), from its end event, as one JUnit file ``out``; its counts."""
    cases: dict[tuple[str, str], ET.Element] = {}
    files = sorted(folder.glob("*.xml"), key=lambda p: (p.stat().st_mtime, p.name))
    for path in files:
        try:
            root = ET.parse(path).getroot()
        except (ET.ParseError, OSError):
            continue  # a worker killed while writing it
        for case in root.iter("testcase"):
            cases[(case.get("classname", ""), case.get("name", ""))] = case
    for nodeid, event in state.ended().items():
        key = junit_key(nodeid)
        if event.get("outcome") in ("timeout", "crashed") or key not in cases:
            cases[key] = event_case(nodeid, event)
    suite = ET.Element("testsuite", name="attnbench gpu-check")
    counts = Counter()
    for case in cases.values():
        suite.append(case)
        kinds = {child.tag for child in case}
        kind = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        counts[kind] += 1
    suite.set("tests", str(len(cases)))
    for key, name in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        suite.set(name, str(counts[key]))
    root = ET.Element("testsuites")
    root.append(suite)
    out.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    kinds = ("passed", "failure", "error", "skipped")
    return {"tests": len(cases), **{k: counts[k] for k in kinds}}


def junit_key(nodeid: str) -> tuple[str, str]:
    """(classname, name) as pytest's JUnit XML names a node id's test:
    ``tests/k/test_x.py::C::test_y[1]`` -> (``tests.k.test_x.C``, ``test_y[1]``)."""
    path, _, rest = nodeid.partition("::")
    classname = path.removesuffix(".py").replace("/", ".").replace("\\", ".")
    parts = rest.split("::")
    if len(parts) > 1:  # a test in a class
        classname += "." + ".".join(parts[:-1])
    return classname, parts[-1]


#: An end event's outcome -> the JUnit child element that says it (none: passed).
JUNIT_TAGS = {"failed": "failure", "error": "error", "skipped": "skipped", "timeout": "error",
              "crashed": "error"}  # fmt: skip


def event_case(nodeid: str, event: dict) -> ET.Element:
    """A JUnit testcase from a test's end event (its worker wrote no JUnit entry for it)."""
    classname, name = junit_key(nodeid)
    case = ET.Element("testcase", classname=classname, name=name,
                      time=str(event.get("duration") or 0))  # fmt: skip
    outcome = event.get("outcome", "error")
    tag = JUNIT_TAGS.get(outcome)
    if tag is None:
        return case
    if outcome == "timeout":
        why = f"timeout: stopped by the per-test limit of {event.get('limit_s')} s"
    elif outcome == "crashed":
        why = "crashed: its worker process died in it"
    else:
        why = f"{outcome} (its worker's JUnit file was lost; see the worker's log)"
    child = ET.SubElement(case, tag, message=why)
    child.text = why
    return case
