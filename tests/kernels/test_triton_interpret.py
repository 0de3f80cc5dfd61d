"""The Triton kernels on a CPU: tests/kernels/interpreted_triton.py run under Triton's interpreter.

It runs in a fresh process with ``TRITON_INTERPRET=1`` set before anything imports triton (see
that file's docstring for why a subprocess). Its summary, skips included, is shown on failure and
with ``-rP``.
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
    target = str(HERE / "interpreted_triton.py")
    args = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-rs", "-p", "no:cacheprovider"]
    args.append(target)
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 10 and "failed" not in summary, summary
