"""Loaded into each test worker of ``attnbench gpu-check`` (``pytest -p
attnbench.gpucheck.pytest_plugin``): each test's start and end as a JSON line of the file named by
``ATTNBENCH_GPUCHECK_EVENTS`` (flushed at once, so a worker killed mid-test leaves what it had
done), and a per-test time limit of ``ATTNBENCH_GPUCHECK_TIMEOUT`` seconds.

The limit ends the worker: :func:`faulthandler.dump_traceback_later` writes every thread's stack
to the worker's log (``ATTNBENCH_GPUCHECK_LOG``) and exits the process. A compile or an
autotuning that hangs, or a kernel that never returns, cannot be interrupted from Python anyway;
the driver sees a test that started and never ended, records it as ``timeout``, and gives the
worker's other tests to a new process. No pytest-timeout or pytest-xdist is needed on the GPU
machine.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
from typing import Any

import pytest

EVENTS_VAR = "ATTNBENCH_GPUCHECK_EVENTS"
TIMEOUT_VAR = "ATTNBENCH_GPUCHECK_TIMEOUT"
#: The worker's log, where a stuck test's stacks go (pytest's output capture would swallow
#: them on standard error: it redirects the file descriptor during each test).
LOG_VAR = "ATTNBENCH_GPUCHECK_LOG"

#: The outcome of each test of this worker so far (its phases' reports, merged).
_outcomes: dict[str, str] = {}
_started: dict[str, float] = {}
_stacks: list = []  # the open file faulthandler writes to (it must stay open)


def write_event(event: dict[str, Any]) -> None:
    """One JSON line appended to the events file (nothing when none is named)."""
    path = os.environ.get(EVENTS_VAR)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")
        f.flush()


def stacks_file():
    """Where faulthandler writes a stuck test's stacks: the worker's log, else stderr."""
    if not _stacks:
        path = os.environ.get(LOG_VAR)
        _stacks.append(open(path, "a", encoding="utf-8") if path else sys.__stderr__)  # noqa: SIM115
    return _stacks[0]


def per_test_limit() -> float:
    """The per-test limit in seconds (0: none)."""
    try:
        return max(0.0, float(os.environ.get(TIMEOUT_VAR) or 0))
    except ValueError:
        return 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around one test (setup, call, teardown): its start written, the limit armed."""
    _started[item.nodeid] = time.time()
    write_event({"event": "start", "nodeid": item.nodeid, "time": _started[item.nodeid]})
    limit = per_test_limit()
    if limit:
        faulthandler.dump_traceback_later(limit, exit=True, file=stacks_file())
    try:
        yield
    finally:
        if limit:
            faulthandler.cancel_dump_traceback_later()


def merged_outcome(previous: str | None, when: str, outcome: str) -> str:
    """A test's outcome after one more phase's report: a failure in setup or teardown is an
    ``error``, in the call ``failed``; a skip is ``skipped``; else the call's ``passed``."""
    if previous in ("failed", "error"):
        return previous
    if outcome == "failed":
        return "failed" if when == "call" else "error"
    if outcome == "skipped":
        return "skipped"
    return previous or "passed"


def pytest_runtest_logreport(report) -> None:
    """Each phase's report merged into the test's outcome; its end written after teardown."""
    outcome = merged_outcome(_outcomes.get(report.nodeid), report.when, report.outcome)
    _outcomes[report.nodeid] = outcome
    if report.when == "teardown":
        started = _started.pop(report.nodeid, time.time())
        write_event(
            {
                "event": "end",
                "nodeid": report.nodeid,
                "outcome": outcome,
                "duration": round(time.time() - started, 3),
            }
        )
        _outcomes.pop(report.nodeid, None)
