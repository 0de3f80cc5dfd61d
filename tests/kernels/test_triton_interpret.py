"""The Triton kernels on a CPU: every tests/kernels/interpreted_*.py run under Triton's interpreter.

Each file runs in a fresh process with ``TRITON_INTERPRET=1`` set before anything imports triton
(see interpreted_triton.py's docstring for why a subprocess). The summary, skips included, is
shown on failure and with ``-rP``.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

if importlib.util.find_spec("triton") is None:  # find, do not import: the kernels run elsewhere
    pytest.skip("Triton is not installed: the Triton kernels are untested", allow_module_level=True)

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository


TARGETS = sorted(HERE.glob("interpreted_*.py"))


@pytest.mark.parametrize("target", TARGETS, ids=[p.stem for p in TARGETS])
def test_triton_kernels_under_interpreter(target):
    """One interpreted file per test: the files run side by side on the test workers."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-rs", "-p", "no:cacheprovider"]
    args.append(str(target))
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 2 and "failed" not in summary, summary


def test_every_interpreted_file_is_run():
    assert len(TARGETS) >= 2 and all(p.read_text().count("def test_") >= 2 for p in TARGETS)
