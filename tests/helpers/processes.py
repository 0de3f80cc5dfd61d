"""The real executable started as a user starts it (``python -m attnbench``), for the tests that
stop runs from outside, and a wait for what such a run writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def start(args: list[str], cwd: Path, err: Path) -> subprocess.Popen:
    """``python -m attnbench ARGS`` with standard error into ``err`` (read while it runs), and
    Ctrl-C handled as a terminal would deliver it: a test session started in the background of a
    non-interactive shell (``bash -c 'pytest' &``) has SIGINT ignored, which its children would
    inherit, and a SIGINT sent to them would then do nothing."""
    return subprocess.Popen([sys.executable, "-m", "attnbench", *args], cwd=cwd, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=err.open("w"),
                            preexec_fn=_default_sigint)  # fmt: skip


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(found, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := found():
            return result
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout} s")
