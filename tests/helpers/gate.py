"""The speed gate on synthetic runs: a throw-away git repository of two commits holding
suites/ci.toml (what the gate checks out), and the grid replaced by runs written from a random
model. For the tests of ``attnbench gate`` and its study; synthetic data only."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

from attnbench.bench import gate
from tests.helpers.results import grid, write_run


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=repo, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def make_repo(root: Path) -> Path:
    """A git repository of two commits at ``root`` holding suites/ci.toml."""
    (root / "suites").mkdir(parents=True)
    git(root, "init", "-q")
    (root / "suites" / "ci.toml").write_text("# the grid\n")
    git(root, "add", "suites")
    git(root, "commit", "-q", "-m", "first")
    (root / "suites" / "ci.toml").write_text("# the grid, again\n")
    git(root, "commit", "-q", "-am", "second")
    return root


def fake_grid(monkeypatch, root: Path, slow: dict[str, float] | None) -> list[str]:
    """Replace the CI grid by synthetic runs: the current code (at ``root``) ``slow``, any
    other checkout as it was; a run the gate slows down (``--slow``) slowed by its factor.
    Returns the folders it was run into, in order."""
    rng, ran = np.random.default_rng(12), []

    def run_grid(out: Path, code_root: Path, grid_=None, slowdown=None) -> tuple[bool, str]:
        ran.append(out.name)
        shift = dict(slow or {}) if code_root == root else {}
        if slowdown is not None:
            shift[slowdown.impl.split(":")[0]] = slowdown.factor
        write_run(out, grid(rng, shift))
        sidecar = out / "results.json"
        sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "wall_s": 1.5}))
        return True, ""

    monkeypatch.setattr(gate, "run_grid", run_grid)
    return ran
