"""Synthetic speed runs along a line of commits, for the tests of the results history: each run
a results folder with its samples and a sidecar naming its commit, start time, CPU and
versions. Synthetic data only."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

import numpy as np

from tests.helpers.results import sampled_reference, sampled_row, write_run

SIGNATURE = "AuthenticAMD 25/1/1 avx2; torch AVX2"
START = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)


def sha(i: int) -> str:
    """A 40-hex commit id for commit number ``i``."""
    return hashlib.sha1(f"commit {i}".encode()).hexdigest()


def commit_run(
    folder: Path,
    commit: int,
    levels: dict[str, float],
    rng,
    rounds: int = 3,
    noise: float = 0.02,
    torch: str = "2.13.0+cpu",
    dirty: bool = False,
    signature: str = SIGNATURE,
    matmul: int | None = None,
) -> Path:
    """One run of commit number ``commit`` in ``folder``: the reference, and per mechanism in
    ``levels`` one fwd case at n = 1024 and one at n = 256 whose ratio to the reference is the
    level times a lognormal move between runs (``noise``) and a smaller scatter per round."""
    cases = [sampled_reference(rounds, torch_version=torch)]
    for mech, level in levels.items():
        for n in (256, 1024):
            run_level = level * np.exp(rng.normal(0, noise))
            ratios = list(run_level * np.exp(rng.normal(0, 0.01, rounds)))
            cases.append(
                sampled_row(ratios, mechanism=mech, params="", seq_len=n, torch_version=torch)
            )
    csv = write_run(folder, cases)
    side = {
        "files": {"rows": "results.csv", "samples": "samples.jsonl"},
        "git": {"sha": sha(commit), "branch": "main", "dirty": dirty},
        "started": (START + dt.timedelta(hours=commit)).isoformat(timespec="seconds"),
        "command": "attnbench run speed --suite ci",
        "machine": {"cpu_signature": signature},
        "versions": {"python": "3.11.7", "torch": torch, "cuda": None, "triton": "3.9.0"},
    }
    if matmul is not None:  # the roofline's matmul, sized by time
        side["calibration"] = {"float32": {"matmul_size": matmul}}
    (folder / "results.json").write_text(json.dumps(side))
    return csv


def commit_line(
    root: Path, levels_by_commit: list[dict[str, float]], seed: int = 0, **over
) -> list[Path]:
    """One run per commit, commit i with ``levels_by_commit[i]``; the run folders."""
    rng = np.random.default_rng(seed)
    folders = []
    for i, levels in enumerate(levels_by_commit):
        folder = root / f"run{i:03d}"
        commit_run(folder, i, levels, rng, **over)
        folders.append(folder)
    return folders
