"""The machine's load and the thread count, in both experiments: more threads than usable cores
in a suite built in code is a warning as the run starts (from a suite file, a preset or the
command line it is refused, with the core count: issue 63), and the extrapolation sidecar keeps
the load the run saw, as the speed sidecar does."""

from __future__ import annotations

import json
import os

import pytest

from attnbench.bench.sweep import run_sweep
from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.experiment.run import run_extrapolate
from attnbench.measure.machine import usable_cores
from tests.helpers.extrapolation import make_corpus, run_options, tiny_cfg
from tests.helpers.speed import tiny


def test_a_unit_wise_speed_run_warns_of_more_threads_than_cores(tmp_path):
    said: list[str] = []
    too_many = usable_cores() + 1
    suite = tiny(mechanisms=("softmax",), causal=(False,), threads=too_many)
    run_sweep(suite, tmp_path, log=said.append)
    assert f"warning: {too_many} threads on {usable_cores()} usable cores" in said[0], said


def test_an_extrapolation_preset_refuses_more_threads_than_cores(tmp_path):
    """(Issue 63: a warning before, as the speed suite's options; now refused with the core
    count when the preset is read, since a count beyond them only slows every thread down and
    an absurd one overflowed torch.)"""
    cfg = tiny_cfg(make_corpus(tmp_path / "c.txt"))
    with pytest.raises(AttnbenchError, match=f"this machine has {usable_cores()} usable core"):
        cfg.override({"threads": usable_cores() + 1})


def test_the_extrapolation_sidecar_keeps_the_load(tmp_path):
    said: list[str] = []
    cores = usable_cores()
    cfg = tiny_cfg(make_corpus(tmp_path / "c.txt")).override({"threads": cores})
    opts = run_options(tmp_path / "x")
    opts.log = said.append
    run_extrapolate(cfg, opts)
    assert not any("usable cores" in line for line in said), said
    side = json.loads((tmp_path / "x" / "extrapolate.json").read_text())
    if not hasattr(os, "getloadavg"):
        pytest.skip("this OS has no load average")
    load = side["load"]
    assert len(load["before_1_5_15min"]) == 3 and len(load["after_1_5_15min"]) == 3
    assert load["threads"] == cores and load["cores"] == cores
    assert load["others_before"] >= 0 and load["others_during"] >= 0
