"""The compile and autotune caches' folders: --cache-dir, then the usual variables, then the
user's cache folder; set for a run and restored after."""

from __future__ import annotations

import os
from pathlib import Path

from typer.testing import CliRunner

from attnbench.runtime import caches
from attnbench.runtime.caches import (
    AUTOTUNE_VAR,
    INDUCTOR_VAR,
    TRITON_VAR,
    compile_caches,
    resolve_caches,
)


def test_the_user_cache_folder_by_default():
    found = resolve_caches(None, {"HOME": "/home/u"})
    assert found.inductor == Path("/home/u/.cache/attnbench/inductor")
    assert found.triton == Path("/home/u/.cache/attnbench/triton")
    assert found.sources == {"inductor": "default", "triton": "default"}
    xdg = resolve_caches(None, {"HOME": "/home/u", "XDG_CACHE_HOME": "/fast"})
    assert xdg.inductor == Path("/fast/attnbench/inductor")
    own = resolve_caches(None, {"HOME": "/home/u", "ATTNBENCH_CACHE_DIR": "/scratch/ab"})
    assert (
        own.triton == Path("/scratch/ab/triton") and own.sources["triton"] == "ATTNBENCH_CACHE_DIR"
    )


def test_the_usual_variables_win_over_the_default_and_the_option_over_them():
    env = {"HOME": "/home/u", INDUCTOR_VAR: "/tmp/ind", TRITON_VAR: "/tmp/tri"}
    found = resolve_caches(None, env)
    assert (found.inductor, found.triton) == (Path("/tmp/ind"), Path("/tmp/tri"))
    assert found.sources == {"inductor": INDUCTOR_VAR, "triton": TRITON_VAR}
    partly = resolve_caches(None, {"HOME": "/home/u", TRITON_VAR: "/tmp/tri"})
    assert partly.inductor == Path("/home/u/.cache/attnbench/inductor")
    given = resolve_caches("/data/cache", env)
    assert (given.inductor, given.triton) == (
        Path("/data/cache/inductor"),
        Path("/data/cache/triton"),
    )


def test_a_run_sets_the_variables_and_restores_them(monkeypatch):
    monkeypatch.setenv(INDUCTOR_VAR, "/before")
    monkeypatch.delenv(TRITON_VAR, raising=False)
    monkeypatch.delenv(AUTOTUNE_VAR, raising=False)
    chosen = resolve_caches("/c", {})
    with compile_caches(chosen):
        assert os.environ[INDUCTOR_VAR] == "/c/inductor" and os.environ[TRITON_VAR] == "/c/triton"
        assert os.environ[AUTOTUNE_VAR] == "1"  # Triton keeps autotuning results on disk
    assert os.environ[INDUCTOR_VAR] == "/before"
    assert TRITON_VAR not in os.environ and AUTOTUNE_VAR not in os.environ


def test_run_speed_takes_cache_dir(monkeypatch, tmp_path):
    """--cache-dir reaches the run: the variables are set while it runs."""
    from attnbench.cli import app, speed_cmd

    seen = {}

    def in_process(suite, out_dir, ray_address, resume, overwrite):
        seen.update({k: os.environ.get(k) for k in (INDUCTOR_VAR, TRITON_VAR)})
        raise SystemExit(0)

    monkeypatch.setattr(speed_cmd, "in_process", in_process)
    suite = tmp_path / "s.toml"
    suite.write_text('[grid]\nmechanisms = ["softmax"]\ndevice = "cpu"\nlengths = [16]\n')
    CliRunner().invoke(app, ["run", "speed", "--suite", str(suite), "--cache-dir", str(tmp_path)])
    assert seen == {INDUCTOR_VAR: str(tmp_path / "inductor"), TRITON_VAR: str(tmp_path / "triton")}
    assert caches.cache_root({"HOME": "/h"}) == Path("/h/.cache/attnbench")
