"""The CI speed gate's plumbing (scripts/speed_gate.py); the gate itself runs in .ci/run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from speed_gate import machine_slug  # noqa: E402


def test_machine_class_from_the_cpu_signature():
    intel = "GenuineIntel 6/143/8 avx2,avx512f,amx_tile; torch AVX512"
    assert machine_slug(intel) == "genuineintel-6-143-avx2-avx512f-amx_tile"
    assert machine_slug("AuthenticAMD 25/1/1 avx2; torch AVX2") == "authenticamd-25-1-avx2"
    assert machine_slug("AuthenticAMD 25/1/2 avx2; torch AVX2") == "authenticamd-25-1-avx2"
    assert machine_slug("aarch64; torch NO AVX") == "aarch64"


def gate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/speed_gate.py", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_base_that_names_no_commit_is_a_usage_error():
    done = gate("--base", "no-such-revision-xyz")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: --base no-such-revision-xyz: no such revision in this repository"
    )


def test_print_class():
    done = gate("--print-class")
    assert done.returncode == 0 and done.stdout.strip() == machine_slug()
