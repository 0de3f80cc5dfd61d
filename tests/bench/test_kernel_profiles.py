"""Kernel profiles (suite table ``[profile]``): what ran in each case, from torch.profiler, in
``kernels.csv`` beside the results; per call, by time; never at the cost of the measurement.
No test here asserts that anything is fast."""

from __future__ import annotations

import json
import logging

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench.bench import profiles
from attnbench.bench.plan import plan
from attnbench.bench.profiles import KERNEL_COLUMNS, KERNELS_NAME, TRACES_DIR
from attnbench.bench.results import KEY, read_results
from attnbench.bench.run import run_speed
from attnbench.cli.app import app
from attnbench.core.errors import AttnbenchError
from attnbench.measure.kernel_profile import CallProfile, kind_of, profile_call, summarise
from attnbench.runtime.warning_log import WarningLog
from attnbench.variants import softmax
from tests.helpers.speed import tiny, tiny_suite_file

MECHS = [softmax.MECHANISM]


def key_of(row) -> tuple[str, ...]:
    return tuple("" if pd.isna(row[c]) else str(row[c]).lower() for c in KEY)


# -- the table of one profile ------------------------------------------------------------------


def test_summarise_gives_per_call_launches_time_and_shares_largest_first():
    records = [("b", 30.0, 1), ("a", 10.0, 1), ("b", 30.0, 1), ("Memset (Device)", 20.0, 1)]
    entries, busy = summarise(records, calls=2, kind=kind_of)
    assert [e.name for e in entries] == ["b", "Memset (Device)", "a"]
    b, memset, a = entries
    assert (b.launches, b.time_us, b.kind) == (1.0, 30.0, "kernel")
    assert (memset.launches, memset.time_us, memset.kind) == (0.5, 10.0, "memset")
    assert (a.launches, a.time_us) == (0.5, 5.0)
    assert busy == 45.0
    assert b.share == pytest.approx(60 / 90) and sum(e.share for e in entries) == pytest.approx(1)


def test_summarise_breaks_ties_by_name_and_refuses_zero_calls():
    entries, _ = summarise([("z", 1.0, 1), ("y", 1.0, 1)], calls=1, kind=kind_of)
    assert [e.name for e in entries] == ["y", "z"]
    assert summarise([], calls=1, kind=kind_of) == ((), 0.0)
    with pytest.raises(ValueError, match="accepted: >= 1"):
        summarise([], calls=0, kind=kind_of)


def test_cuda_activity_kinds_follow_cuptis_names():
    assert kind_of("Memcpy DtoD (Device -> Device)") == "memcpy"
    assert kind_of("Memset (Device)") == "memset"
    assert kind_of("_bwd_dkdv") == "kernel"
    assert kind_of("sm90_xmma_gemm_bf16bf16_bf16f32") == "kernel"


def test_a_cpu_profile_counts_each_operator_per_call(tmp_path):
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def call():
        return torch.mm(torch.mm(a, b), b).sum()

    call()
    found = profile_call(call, torch.device("cpu"), calls=3, trace=tmp_path / "t.json")
    by_name = {e.name: e for e in found.entries}
    assert by_name["aten::mm"].launches == 2.0 and by_name["aten::sum"].launches == 1.0
    assert found.calls == 3 and all(e.kind == "operator" for e in found.entries)
    assert sum(e.share for e in found.entries) == pytest.approx(1.0)
    assert sum(e.time_us for e in found.entries) == pytest.approx(found.busy_us)
    times = [e.time_us for e in found.entries]
    assert times == sorted(times, reverse=True)
    assert "self time" in found.source
    assert not any(e.name.startswith("ProfilerStep") for e in found.entries)  # the markers
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


# -- a run with profiles -----------------------------------------------------------------------


def profiled(**changes):
    return tiny(causal=(False,), profile_calls=2, **changes)


def test_a_run_profiles_every_ok_case_into_kernels_csv(tmp_path):
    run = run_speed(profiled(profile_trace=True), tmp_path, mechanisms=MECHS)
    rows = read_results(run.csv)
    kernels = pd.read_csv(tmp_path / KERNELS_NAME)
    assert tuple(kernels.columns) == KERNEL_COLUMNS
    ok = rows[rows["status"] == "ok"]
    assert {key_of(r) for _, r in kernels.iterrows()} == {key_of(r) for _, r in ok.iterrows()}
    for _, case in kernels.groupby(list(KEY), dropna=False):
        assert list(case["rank"]) == list(range(1, len(case) + 1))
        assert case["share"].sum() == pytest.approx(1.0, abs=1e-4)
        assert (case["calls_profiled"] == 2).all() and (case["kind"] == "operator").all()
        assert case["time_us_per_call"].is_monotonic_decreasing
    traces = sorted((tmp_path / TRACES_DIR).iterdir())
    assert len(traces) == len(ok)
    sidecar = json.loads(run.sidecar.read_text())
    assert sidecar["files"]["kernels"] == KERNELS_NAME and sidecar["files"]["traces"] == TRACES_DIR
    assert sidecar["suite"]["profile"] == {"calls": 2, "trace": True}
    assert (run.kernels, run.profiled) == (tmp_path / KERNELS_NAME, len(ok))


def test_profiles_are_taken_after_the_last_timed_round(tmp_path, monkeypatch):
    """No timed sample runs after a profile (CUPTI may stay attached): every row is on disk
    before the first case is profiled."""
    seen = []

    def spy(call, device, calls, trace=None):
        seen.append(len(read_results(tmp_path / "results.csv")))
        return real(call, device, calls, trace)

    real = profiles.profile_call
    monkeypatch.setattr(profiles, "profile_call", spy)
    run = run_speed(profiled(), tmp_path, mechanisms=MECHS)
    assert seen and set(seen) == {len(run.rows)} and run.profiled == len(seen)


def test_a_slow_case_gets_fewer_profiled_calls():
    assert profiles.calls_within(5, 0.001) == 5
    assert profiles.calls_within(5, profiles.PROFILE_BUDGET_S / 2) == 2
    assert profiles.calls_within(5, profiles.PROFILE_BUDGET_S * 10) == 1
    assert profiles.calls_within(5, 0.0) == 5


def test_trace_names_stay_apart_when_cut():
    base = {"mechanism": "softmax", "path": "efficient", "varlen": "7+" * 200, "dtype": "float32"}
    a = profiles.trace_name({**base, "packing": "packed"})
    b = profiles.trace_name({**base, "packing": "packed-loop"})
    assert a != b and a.endswith(".json") and len(a) <= 160 + 16
    assert profiles.trace_name(base) == profiles.trace_name(dict(base))  # stable


def test_the_summary_lists_each_profiled_case_with_its_largest_entries(tmp_path):
    run = run_speed(profiled(lengths=(16,)), tmp_path, mechanisms=MECHS)
    cases = profiles.top_entries(run.kernels)
    assert len(cases) == run.profiled == len(read_results(run.csv))
    for label, busy, wall, top in cases:
        assert label.startswith("softmax:") and " n=16 d=8 float32" in label
        assert busy > 0 and wall > 0 and 1 <= len(top) <= 3
        shares = [share for _, share in top]
        assert shares == sorted(shares, reverse=True) and sum(shares) <= 1 + 1e-6


def test_a_failed_profile_costs_no_measurement(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("profiler unavailable")

    monkeypatch.setattr(profiles, "profile_call", broken)
    run = run_speed(profiled(), tmp_path, mechanisms=MECHS)
    assert (read_results(run.csv)["status"] == "ok").all()
    assert list(pd.read_csv(tmp_path / KERNELS_NAME).columns) == list(KERNEL_COLUMNS)
    assert pd.read_csv(tmp_path / KERNELS_NAME).empty and run.profiled == 0


def test_a_profile_with_no_activity_is_a_warning_not_a_profiled_case(tmp_path, monkeypatch):
    def nothing(call, device, calls, trace=None):
        return CallProfile(calls, "GPU activity recorded by CUPTI", (), 0.0, 1.0)

    monkeypatch.setattr(profiles, "profile_call", nothing)
    said = []
    writer = profiles.KernelsWriter(tmp_path, calls=2, trace=False)
    case = plan(profiled(lengths=(16,)), MECHS)[0].cases[0]
    assert writer.profile(case, {}, lambda: None, said.append) is None
    writer.close()
    assert writer.cases == 0 and "recorded no activity" in said[0]


def test_profiles_follow_the_runs_rows_on_overwrite_and_resume(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / KERNELS_NAME).write_text("a file of the user's\n")
    with pytest.raises(AttnbenchError, match="already holds kernels.csv"):  # not replaced untold
        run_speed(profiled(lengths=(16,)), other, mechanisms=MECHS)
    assert (other / KERNELS_NAME).read_text() == "a file of the user's\n"
    run_speed(profiled(), tmp_path, mechanisms=MECHS)
    first = pd.read_csv(tmp_path / KERNELS_NAME)
    # as if interrupted after n=32 was profiled and before its rows were written
    lines = (tmp_path / "results.csv").read_text().splitlines(keepends=True)
    (tmp_path / "results.csv").write_text("".join(lines[0:1] + [x for x in lines[1:]
                                                                 if ",16," in x]))  # fmt: skip
    run_speed(profiled(), tmp_path, mechanisms=MECHS, resume=True)
    again = pd.read_csv(tmp_path / KERNELS_NAME)
    short = again[again["seq_len"] == 16].reset_index(drop=True)
    pd.testing.assert_frame_equal(short, first[first["seq_len"] == 16].reset_index(drop=True))
    long_ = again[again["seq_len"] == 32]
    assert len(long_) == len(first[first["seq_len"] == 32])  # profiled once again, not twice
    assert (
        long_.groupby(list(KEY), dropna=False)["rank"]
        .apply(list)
        .map(lambda r: r == list(range(1, len(r) + 1)))
        .all()
    )
    # started over without a profile: the replaced run's profiles go with its rows
    run = run_speed(tiny(causal=(False,), lengths=(16,)), tmp_path, mechanisms=MECHS,
                    overwrite=True)  # fmt: skip
    assert not (tmp_path / KERNELS_NAME).exists() and run.kernels is None
    assert "kernels" not in json.loads(run.sidecar.read_text())["files"]


def test_only_the_replaced_runs_own_profile_files_are_removed(tmp_path):
    run_speed(profiled(lengths=(16,), profile_trace=True), tmp_path, mechanisms=MECHS)
    (tmp_path / TRACES_DIR / "my-notes.txt").write_text("mine")
    run_speed(tiny(causal=(False,), lengths=(16,)), tmp_path, mechanisms=MECHS, overwrite=True)
    assert [p.name for p in (tmp_path / TRACES_DIR).iterdir()] == ["my-notes.txt"]
    # a run that never profiled: a folder's own traces/ and kernels.csv are left alone
    (tmp_path / KERNELS_NAME).write_text("mine\n")
    run_speed(tiny(causal=(False,), lengths=(16,)), tmp_path, mechanisms=MECHS, overwrite=True)
    assert (tmp_path / KERNELS_NAME).read_text() == "mine\n"
    assert (tmp_path / TRACES_DIR / "my-notes.txt").read_text() == "mine"


def test_the_command_line_sets_checks_and_reports_profiles(tmp_path):
    suite = tiny_suite_file(tmp_path, grid={"lengths": [16], "causal": [False]})
    runner = CliRunner()
    out = tmp_path / "run"
    args = ["run", "speed", "--suite", str(suite), "--out", str(out), "--no-plot"]
    result = runner.invoke(app, [*args, "--set", "profile.calls=2"])
    assert result.exit_code == 0, result.output
    assert "kernel profiles of " in result.output and (out / KERNELS_NAME).is_file()
    bad = runner.invoke(app, [*args, "--overwrite", "--set", "profile.calls=-1"])
    assert bad.exit_code == 2 and "profile.calls" in bad.output and "Traceback" not in bad.output
    lone = runner.invoke(app, [*args, "--overwrite", "--set", "profile.trace=true"])
    assert lone.exit_code == 2 and "trace = true with calls = 0 profiles nothing" in lone.output
    shard = runner.invoke(app, [*args, "--shard", "1/2", "--set", "profile.calls=2"])
    assert shard.exit_code == 2 and "kernel profiles are recorded by a run in one process" in (
        shard.output
    )


def test_torch_structured_trace_records_are_not_counted_as_warnings(tmp_path):
    trace_log = logging.getLogger("torch.__trace")
    handler = logging.StreamHandler()  # as torch's LazyTraceHandler: a stream that never prints
    trace_log.addHandler(handler)
    try:
        with WarningLog(tmp_path / "warnings.log") as log:
            trace_log.debug("a structured trace record")
            logging.getLogger("torch.something").warning("a real warning")
        text = (tmp_path / "warnings.log").read_text()
        assert log.count == 1 and "a real warning" in text, text
    finally:
        trace_log.removeHandler(handler)


# -- on a GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_a_cuda_profile_lists_the_kernels_of_a_triton_path():
    from attnbench import api

    device = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k = (torch.randn(1, 2, 512, 64, generator=gen).to(device, torch.bfloat16) for _ in "qk")
    v = torch.randn(1, 2, 512, 128, generator=gen).to(device, torch.bfloat16)
    for t in (q, k, v):
        t.requires_grad_(True)

    def call():
        out = api.attention("gau", q, k, v, causal=True, path="triton")
        return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    call()
    found = profile_call(call, device, calls=3)
    names = [e.name for e in found.entries if e.kind == "kernel"]
    assert any("dkdv" in n for n in names) and any("dq" in n for n in names), names
    assert sum(e.share for e in found.entries) == pytest.approx(1.0)
    assert found.busy_us > 0 and "CUPTI" in found.source


@pytest.mark.gpu
def test_a_cuda_profile_of_a_compiled_path_counts_kernels_not_annotations():
    """torch.compile puts user-annotation spans on the GPU's timeline (``## Call
    CompiledFxGraph ...``, ``Torch-Compiled Region``) over kernels counted already."""
    from attnbench import api

    device = torch.device("cuda")
    q, k, v = (torch.randn(1, 2, 256, 64, device=device) for _ in "qkv")

    def call():
        return api.attention("linear", q, k, v, causal=False, path="compiled")

    for _ in range(3):
        call()
    found = profile_call(call, device, calls=3)
    names = [e.name for e in found.entries]
    assert names and not any(n.startswith(("##", "Torch-Compiled", "ProfilerStep")) for n in names)
    assert {e.kind for e in found.entries} <= {"kernel", "memcpy", "memset"}
