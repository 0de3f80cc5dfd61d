"""The Triton kernels on a CPU: every tests/kernels/interpreted_*.py run under Triton's interpreter.

They run in one fresh process with ``TRITON_INTERPRET=1`` set before anything imports triton (see
interpreted_triton.py's docstring for why a subprocess). The summary, skips included, is shown on
failure and with ``-rP``.
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


def test_triton_kernels_under_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    targets = sorted(str(path) for path in HERE.glob("interpreted_*.py"))
    args = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-rs", "-p", "no:cacheprovider"]
    args.extend(targets)
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 10 and "failed" not in summary, summary
