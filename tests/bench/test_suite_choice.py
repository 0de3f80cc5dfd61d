"""Which suite ``attnbench run speed`` runs without ``--suite`` (the GPU's when the run is on
CUDA, checked with a faked CUDA on the CPU), the shipped GPU suites' grids, and the CPU suite's
thread cap."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from attnbench.bench import config
from attnbench.bench.plan import plan
from attnbench.bench.suite_choice import CPU_SUITE, GPU_SUITE, chosen_note, default_suite
from attnbench.cli import app, speed_cmd
from attnbench.runtime.tomlconfig import find_suite, suite_names

runner = CliRunner()


@pytest.mark.parametrize(
    ("device", "visible", "suite"),
    [(None, True, GPU_SUITE), ("auto", True, GPU_SUITE), (None, False, CPU_SUITE),
     ("auto", False, CPU_SUITE), ("cuda", False, GPU_SUITE), ("cuda", True, GPU_SUITE),
     ("cuda:1", True, GPU_SUITE), ("cpu", True, CPU_SUITE), ("cpu", False, CPU_SUITE)],
)  # fmt: skip
def test_the_device_decides_the_default_suite(device, visible, suite):
    assert default_suite(device, visible) == suite


def test_only_the_gpu_choice_is_announced():
    note = chosen_note(GPU_SUITE, "NVIDIA H200")
    assert "CUDA is visible (NVIDIA H200)" in note and "--suite speed" in note
    assert chosen_note(CPU_SUITE, "NVIDIA H200") is None


@pytest.fixture
def loaded(monkeypatch):
    """run speed up to the suite it loads: the loaded name is kept, nothing runs."""
    names = []

    def load(name, mechanisms=None, settings=()):
        names.append(name)
        raise SystemExit(0)

    monkeypatch.setattr(config, "load_suite", load)
    return names


def test_run_speed_with_cuda_visible_runs_the_gpu_suite(monkeypatch, loaded):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    result = runner.invoke(app, ["run", "speed"])
    assert loaded == [GPU_SUITE], result.output
    assert "no --suite: CUDA is visible (NVIDIA H200)" in result.stderr


def test_run_speed_on_the_cpu_runs_the_cpu_suite_silently(monkeypatch, loaded):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    result = runner.invoke(app, ["run", "speed", "--device", "cpu"])
    assert loaded == [CPU_SUITE] and "no --suite" not in result.stderr
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    loaded.clear()
    result = runner.invoke(app, ["run", "speed"])
    assert loaded == [CPU_SUITE] and result.stderr == ""


def test_an_explicit_suite_is_run_as_given(monkeypatch, loaded):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    runner.invoke(app, ["run", "speed", "--suite", "ci"])
    assert loaded == ["ci"]


def test_the_default_gpu_suite_grid(monkeypatch):
    """bf16, flash-attention's 16k-token shape, head dims 64 and 128, n = 1k..16k, both
    directions and causal flags; every dense SDPA backend and Triton kernel in it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    suite = config.load_suite(GPU_SUITE)
    assert suite.dtypes == ("bfloat16",) and set(suite.head_dims) == {64, 128}
    assert suite.lengths == (1024, 4096, 16384) and suite.tokens == 16384
    assert set(suite.directions) == {"fwd", "fwdbwd"} and set(suite.causal) == {False, True}
    impls = set(suite.mechanisms)
    for path in ("efficient", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
        assert f"softmax:{path}" in impls
    for mech in ("gau", "flash", "linear", "retention"):
        assert f"{mech}:triton" in impls
    groups = plan(suite)
    assert len(groups) == 2 * 2 * 3  # head dims x causal x lengths
    assert {g.cases[0].shape.batch for g in groups} == {16, 4, 1}
    assert all(c.device.type == "cuda" for g in groups for c in g.cases)


def test_every_shipped_gpu_check_suite_loads_and_names_what_exists():
    names = [n for n in suite_names() if n.startswith("gpu/")]
    assert {"gpu/dense", "gpu/flex", "gpu/libraries", "gpu/triton"} <= set(names)
    for name in names:
        suite = config.load_suite(name)
        assert suite.device == "cuda" and suite.dtypes == ("bfloat16",), name
        assert config.select(suite), name  # every NAME:PATH resolved in the registry
        assert find_suite(name).parent.name == "gpu"


def test_every_flex_pattern_is_in_the_flex_suite():
    from attnbench import registry

    flex = {f"{m.name}:flex" for m in registry.MECHANISMS for p in m.paths if p.name == "flex"}
    assert flex <= set(config.load_suite("gpu/flex").mechanisms)


def test_the_cpu_suite_caps_its_threads(monkeypatch):
    suite = config.load_suite(CPU_SUITE)
    assert suite.threads == 0 and suite.max_threads == 2
    monkeypatch.setattr(config.os, "cpu_count", lambda: 16)
    assert suite.thread_count() == 2
    monkeypatch.setattr(config.os, "cpu_count", lambda: 1)
    assert suite.thread_count() == 1
    assert config.override(suite, threads=8).thread_count() == 8  # --threads: as asked


def test_the_cli_default_is_the_library_default():
    import inspect

    assert inspect.signature(speed_cmd.speed).parameters["suite"].default is None
