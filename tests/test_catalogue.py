"""``attnbench list`` and every ``--help`` answer without importing torch (issue 19), from a
registry snapshot that must match the live registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from attnbench import capabilities, catalogue

NO_GPU_NODES = sys.platform == "linux" and not any(map(os.path.exists, capabilities.GPU_NODES))


def test_snapshot_is_current():
    """Fails after a mechanism changes until ``python -m attnbench.catalogue`` is run."""
    data = json.loads(catalogue.SNAPSHOT.read_text(encoding="utf-8"))
    stale = "run `python -m attnbench.catalogue` to refresh attnbench/data/registry.json"
    assert data["fingerprint"] == catalogue.fingerprint(), stale
    assert data["mechanisms"] == json.loads(json.dumps(catalogue.live())), stale


def test_stale_snapshot_falls_back_to_the_live_registry(tmp_path, monkeypatch):
    stale = tmp_path / "registry.json"
    stale.write_text(json.dumps({"fingerprint": "old", "mechanisms": []}))
    monkeypatch.setattr(catalogue, "SNAPSHOT", stale)
    assert catalogue.snapshot() is None
    names = [e["name"] for e in catalogue.entries("cpu")]
    from attnbench import registry

    assert names == registry.names()


def test_availability_matches_the_paths_own_check():
    from attnbench import registry

    for entry, mech in zip(catalogue.entries("cpu"), registry.MECHANISMS, strict=True):
        for shown, path in zip(entry["paths"], mech.paths, strict=True):
            assert shown["reason"] == (path.unavailable("cpu") or ""), (mech.name, path.name)
            assert shown["available"] == (path.unavailable("cpu") is None)


def _torch_imported(args: list[str]) -> bool:
    code = (
        "import sys\n"
        "from attnbench.cli import main\n"
        f"sys.argv = ['attnbench', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert "TORCH" in done.stderr, done.stderr[-2000:]
    return done.stderr.rstrip().endswith("NO-TORCH") is False


@pytest.mark.skipif(not NO_GPU_NODES, reason="with a GPU, list asks torch whether CUDA works")
@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["run", "speed", "--help"],
        ["run", "extrapolate", "--help"],
        ["compare", "--help"],
        ["plot", "--help"],
        ["export", "--help"],
        ["check", "--help"],
        ["show", "--help"],
        ["list"],
        ["list", "--format", "json"],
    ],
    ids=" ".join,
)
def test_help_and_list_do_not_import_torch(args):
    assert not _torch_imported(args)
