"""attnbench.bench.slowdown (``attnbench gate --slow``): one path made slower in one process,
the registry elsewhere untouched, and the command line of such a process."""

from __future__ import annotations

import time

import pytest

from attnbench import registry
from attnbench.bench.slowdown import Slowdown, checked, inject, launch_args, slowed
from attnbench.core.errors import AttnbenchError


def busy(seconds: float) -> str:
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass
    return "done"


def test_a_slowed_call_spends_the_factor_in_cpu_time():
    t0 = time.process_time()
    assert slowed(busy, 3.0)(0.05) == "done"
    assert time.process_time() - t0 >= 3.0 * 0.05 * 0.95  # the call, then twice it again


def test_inject_replaces_one_path_in_this_registry_only(monkeypatch):
    monkeypatch.setattr(registry, "MECHANISMS", registry.MECHANISMS)
    monkeypatch.setattr(registry, "_BY_NAME", registry._BY_NAME)
    _, before = registry.resolve("gqa:efficient")
    _, untouched = registry.resolve("gqa:reference")
    inject("gqa:efficient", 1.5)
    _, after = registry.resolve("gqa:efficient")
    assert after.fn is not before.fn and after.fn.__wrapped__ is before.fn
    assert registry.resolve("gqa:reference")[1] is untouched
    assert registry.resolve("mqa:efficient")[1].fn is not after.fn


def test_a_slowdown_names_one_registered_path_and_a_factor_above_one():
    assert checked("gqa:efficient", 1.3) == Slowdown("gqa:efficient", 1.3)
    assert checked("gqa:efficient", 1.3).label == "gqa:efficient x1.3"
    with pytest.raises(AttnbenchError, match="accepted: NAME:PATH"):
        checked("gqa", 1.3)
    with pytest.raises(AttnbenchError, match="unknown mechanism 'nosuch'"):
        checked("nosuch:efficient", 1.3)
    with pytest.raises(AttnbenchError, match="--factor 1.0: accepted: a slowdown factor > 1"):
        checked("gqa:efficient", 1.0)


def test_only_a_slowed_run_starts_with_the_injection():
    argv = ["run", "speed", "--suite", "ci"]
    assert launch_args(argv, None) == ["-m", "attnbench", *argv]
    flag, code = launch_args(argv, Slowdown("gqa:efficient", 1.3))
    assert flag == "-c"
    assert "inject('gqa:efficient', 1.3)" in code
    assert "sys.argv = ['attnbench', 'run', 'speed', '--suite', 'ci']" in code
    compile(code, "<launch>", "exec")  # valid Python
