"""The CI speed gate's plumbing (scripts/speed_gate.py); the gate itself runs in .ci/run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from attnbench.bench.compare import compare
from tests.test_compare_stats import grid, write_run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from speed_gate import _verdict, machine_slug, report, worse_cases  # noqa: E402


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


def test_the_gate_fails_on_a_slowdown_in_both_pairs_and_passes_on_noise(tmp_path):
    """The measured mode's decision on synthetic runs with samples: a 1.5x slowdown of one path
    in both pairs fails with the verdict format of the last line; an A/A pair passes."""
    rng = np.random.default_rng(12)
    base1, base2 = (write_run(tmp_path / f"base{i}", grid(rng)) for i in (1, 2))
    slow1, slow2 = (write_run(tmp_path / f"cur{i}", grid(rng, {"gau": 1.5})) for i in (1, 2))
    first = compare(slow1, base1, confirm=[slow2])
    second = compare(slow2, base2, confirm=[slow1])
    worse = worse_cases(first) & worse_cases(second)
    assert worse and all(case.startswith("gau:efficient") for case in worse)
    code, verdict = _verdict(1, "regression in both pairs: " + ", ".join(sorted(worse)), [first])
    assert code == 1 and verdict.startswith("FAILED, regression in both pairs: gau:efficient")
    assert "worse: gau:efficient" in report(first)
    same1, same2 = (write_run(tmp_path / f"same{i}", grid(rng)) for i in (1, 2))
    clean = compare(same1, base1, confirm=[same2])
    assert not worse_cases(clean)
    code, verdict = _verdict(clean.exit_code, clean.headline(), [clean])
    assert code == 0 and verdict == f"passed, {clean.headline()}"
