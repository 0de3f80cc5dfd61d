"""``attnbench list`` and every ``--help`` answer without importing torch (issue 19), from a
cached description of the registry named after the sources that define it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from attnbench.cli import catalogue
from attnbench.core import capabilities

NO_GPU_NODES = sys.platform == "linux" and not any(map(os.path.exists, capabilities.GPU_NODES))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_first_list_writes_the_cache_and_later_ones_read_it(cache):
    from attnbench import registry

    assert catalogue.cached() is None
    names = [e["name"] for e in catalogue.entries("cpu")]
    assert names == registry.names()
    assert catalogue.cache_file().parent == cache
    assert catalogue.cached() == json.loads(json.dumps(catalogue.live()))


def test_an_edited_mechanism_is_a_new_cache(cache, tmp_path, monkeypatch):
    """The cache is named after the registry's sources: editing one makes the old one unused."""
    catalogue.entries("cpu")
    before = catalogue.cache_file()
    package = tmp_path / "attnbench"
    (package / "variants").mkdir(parents=True)
    (package / "variants" / "mine.py").write_text("X = 1\n")
    (package / "cli").mkdir()
    (package / "cli" / "list.py").write_text("Y = 1\n")
    monkeypatch.setattr(catalogue, "PACKAGE", package)
    first = catalogue.cache_file()
    assert first != before
    (package / "cli" / "list.py").write_text("Y = 2\n")  # not the registry: the same cache
    assert catalogue.cache_file() == first
    (package / "variants" / "mine.py").write_text("X = 2\n")
    assert catalogue.cache_file() != first


def test_a_broken_or_unwritable_cache_falls_back_to_the_live_registry(cache):
    from attnbench import registry

    catalogue.cache_file().parent.mkdir(parents=True)
    catalogue.cache_file().write_text("{not json")
    assert catalogue.cached() is None
    assert [e["name"] for e in catalogue.entries("cpu")] == registry.names()
    cache.joinpath(catalogue.cache_file().name).unlink()
    cache.rmdir()
    cache.write_text("a file where the folder should be")
    assert [e["name"] for e in catalogue.entries("cpu")] == registry.names()


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
def test_help_and_list_do_not_import_torch(args, cache):
    catalogue.entries("cpu")  # the first list after an install or an edit builds the cache
    assert not _torch_imported(args)
