"""What a sidecar says about the checkout: which tracked files differed, and that a run's own
outputs (a committed result being remade) do not make the code dirty."""

from __future__ import annotations

import subprocess
from pathlib import Path

import attnbench
from attnbench.measure import machine

ROOT = Path(attnbench.__file__).resolve().parent.parent


def fake_git(porcelain: str):
    def run(args, **kw):
        answer = {
            "rev-parse": "c" * 40 if args[-1] == "HEAD" and "--abbrev-ref" not in args else "main",
            "status": porcelain,
        }[args[3]]
        return subprocess.CompletedProcess(args, 0, stdout=answer + "\n", stderr="")

    return run


def test_changed_files_are_named_and_outputs_set_apart(monkeypatch):
    porcelain = " M attnbench/layers.py\n M results/x/table.md\nR  a.py -> b.py\n"
    monkeypatch.setattr(machine.subprocess, "run", fake_git(porcelain))
    state = machine.git_state(ROOT / "results" / "x")
    assert state["sha"] == "c" * 40 and state["branch"] == "main"
    assert state["dirty"] is True
    assert state["changed"] == ["attnbench/layers.py", "b.py"] and state["outputs_changed"] == 1


def test_only_the_runs_own_outputs_changed_is_clean(monkeypatch):
    monkeypatch.setattr(machine.subprocess, "run", fake_git(" M results/x/table.md\n"))
    state = machine.git_state(ROOT / "results" / "x")
    assert state["dirty"] is False and state["changed"] == [] and state["outputs_changed"] == 1
    outside = machine.git_state(Path("/elsewhere"))  # an output folder outside the checkout
    assert outside["dirty"] is True and outside["changed"] == ["results/x/table.md"]
