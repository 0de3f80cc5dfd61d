"""The speed runner on tiny grids: rows as produced, schema, oom/error/unsupported/skipped rows,
Ctrl-C, and every registered mechanism consumed through the registry alone. No test here
asserts that anything is fast: timings on a shared machine are not facts."""

from __future__ import annotations

import csv
import json
import time
from dataclasses import replace

import pytest
import torch

from attnbench import registry
from attnbench.bench.config import override, select
from attnbench.bench.failures import is_oom
from attnbench.bench.plan import plan
from attnbench.bench.results import COLUMNS, read_results
from attnbench.bench.run import run_speed
from attnbench.bench.summary import describe_not_run
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import ExtraInput, Mechanism, PathSpec, Requirement
from attnbench.measure.timing import Clock
from attnbench.variants import softmax
from tests.helpers.speed import FAST, tiny


def variant(name: str, fn, **changes) -> Mechanism:
    """softmax with its efficient path replaced by ``fn`` (a test double of a mechanism)."""
    paths = (softmax.MECHANISM.reference, PathSpec("efficient", "efficient", fn, memory="O(n)"))
    return replace(softmax.MECHANISM, name=name, aliases=(), paths=paths, **changes)


def test_rows_schema_sidecar_and_complexity(tmp_path):
    run = run_speed(tiny(mechanisms=("softmax",)), tmp_path, command=["attnbench", "test"])
    with run.csv.open(newline="") as f:
        assert tuple(next(csv.reader(f))) == COLUMNS
    df = read_results(run.csv)
    assert len(df) == 2 * 2 * 2 * 2  # paths x directions x causal x lengths
    assert (df["status"] == "ok").all()
    assert (df["time_p20_ms"] <= df["time_median_ms"]).all()
    assert (df["time_median_ms"] <= df["time_p80_ms"]).all()
    assert (df["samples"] == 2).all() and (df["mem_fwd_bytes"] > 0).all()
    assert (df["mem_fwdbwd_bytes"] > df["mem_fwd_bytes"]).all()
    assert set(df["mem_method"]) == {"dispatch-live-bytes"}
    assert (df["roofline"] > 0).all() and (df["matmul_flop_per_s"] > 0).all()
    # FLOPs: exact pairs (causal n(n+1)/2), fwd+bwd = 3x fwd.
    one = df[(df["path"] == "efficient") & (df["seq_len"] == 32)]
    fwd = one.set_index(["causal", "direction"])["flops"]
    assert fwd[(False, "fwd")] == 2 * 1 * 2 * 32 * 32 * (8 + 8)
    assert fwd[(True, "fwd")] == 2 * 1 * 2 * (32 * 33 // 2) * (8 + 8)
    assert fwd[(False, "fwdbwd")] == 3 * fwd[(False, "fwd")]
    # Beside it, flash-attention's convention: fwd+bwd = 3.5x fwd; no executed count (not sparse).
    fa = one.set_index(["causal", "direction"])["flops_fa"]
    assert fa[(False, "fwd")] == fwd[(False, "fwd")]
    assert fa[(True, "fwdbwd")] == 3.5 * fwd[(True, "fwd")]
    factor = df["direction"].map({"fwd": 1.0, "fwdbwd": 3.5 / 3})  # rates written to 6 digits
    assert ((df["flop_per_s_fa"] / df["flop_per_s"] / factor - 1).abs() < 1e-5).all()
    assert df["flops_executed"].isna().all() and df["flop_per_s_executed"].isna().all()
    # The reference divides itself exactly.
    ref = df[df["path"] == "efficient"]
    assert (ref["ref_ratio"] == 1.0).all() and (ref["reference"] == "softmax:efficient").all()
    side = json.loads(run.sidecar.read_text())
    for key in ("machine", "versions", "git", "command", "suite", "calibration", "started"):
        assert key in side
    assert side["command"] == "attnbench test" and side["interrupted"] is False
    assert side["machine"]["torch_threads"] == 1 and side["versions"]["torch"] == torch.__version__
    cx = run.exponents
    assert len(cx) == 2 * 2 * 2 and cx["points"].eq(2).all()
    assert run.complexity.read_text().startswith("mechanism,")


def test_the_cpu_time_clock_is_recorded_and_refused_on_cuda(tmp_path):
    suite = tiny(mechanisms=("softmax:efficient",), lengths=(16,), causal=(False,))
    run = run_speed(replace(suite, timing=replace(FAST, clock="cpu")), tmp_path)
    df = read_results(run.csv)
    assert set(df["clock"]) == {"process-cpu"} and (df["time_median_ms"] > 0).all()
    assert json.loads(run.sidecar.read_text())["machine_class"].endswith("|clock=process-cpu")
    with pytest.raises(ValueError, match="a CPU device only"):
        Clock("cuda", "cpu")


def test_rows_are_on_disk_before_the_next_group_runs(tmp_path):
    seen = {}

    def spy(q, k, v, *, causal):
        if q.shape[2] == 32 and "rows" not in seen:
            with (tmp_path / "results.csv").open(newline="") as f:
                seen["rows"] = list(csv.DictReader(f))
        return softmax.sdpa(q, k, v, causal=causal)

    mech = variant("spy", spy)
    run_speed(
        tiny(causal=(False,), directions=("fwd",)),
        tmp_path,
        mechanisms=[softmax.MECHANISM, mech],
    )
    # When spy first runs at n=32, every n=16 row (2 mechanisms x 2 paths) is already on disk.
    assert {(r["mechanism"], r["path"], r["seq_len"]) for r in seen["rows"]} >= {
        ("softmax", "reference", "16"),
        ("softmax", "efficient", "16"),
        ("spy", "reference", "16"),
        ("spy", "efficient", "16"),
    }


def test_oom_is_a_row_and_longer_lengths_are_skipped(tmp_path):
    def greedy(q, k, v, *, causal):
        if q.shape[2] >= 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 TiB")
        return softmax.sdpa(q, k, v, causal=causal)

    suite = tiny(lengths=(16, 32, 64), causal=(False,), directions=("fwd",))
    run = run_speed(suite, tmp_path, mechanisms=[softmax.MECHANISM, variant("greedy", greedy)])
    df = read_results(run.csv)
    mine = df[(df["mechanism"] == "greedy") & (df["path"] == "efficient")].set_index("seq_len")
    assert mine.loc[16, "status"] == "ok"
    assert mine.loc[32, "status"] == "oom"
    assert mine.loc[32, "reason"].startswith("OutOfMemoryError: CUDA out of memory")
    assert mine.loc[64, "status"] == "skipped"
    assert mine.loc[64, "reason"] == "out of memory at n=32"
    others = df[df["mechanism"] == "softmax"]
    assert (others["status"] == "ok").all() and len(others) == 2 * 3
    assert is_oom(MemoryError())
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not is_oom(RuntimeError("shape mismatch"))


def test_an_error_is_a_row_and_the_sweep_goes_on(tmp_path):
    def broken(q, k, v, *, causal):
        raise RuntimeError("boom at this shape\nsecond line of the message")

    suite = tiny(causal=(False,))
    run = run_speed(suite, tmp_path, mechanisms=[softmax.MECHANISM, variant("broken", broken)])
    df = read_results(run.csv)
    bad = df[(df["mechanism"] == "broken") & (df["path"] == "efficient")]
    assert (bad["status"] == "error").all() and len(bad) == 4  # both lengths are still tried
    assert set(bad["reason"]) == {"RuntimeError: boom at this shape"}
    assert (df[df["mechanism"] == "softmax"]["status"] == "ok").all()
    assert (df[(df["mechanism"] == "broken") & (df["path"] == "reference")]["status"] == "ok").all()


def test_unsupported_cases_are_rows_with_the_reason(tmp_path):
    gpu_only = Requirement("gpu", lambda device, backward: "needs a fused kernel (test double)")
    paths = (
        softmax.MECHANISM.reference,
        PathSpec("fused", "fused", softmax.sdpa, memory="O(n)", requires=(gpu_only,)),
    )
    fused = replace(softmax.MECHANISM, name="fusedonly", aliases=(), paths=paths)
    causal_only = variant("causalonly", softmax.sdpa, bidirectional=False)
    no_bwd = variant("nobwd", softmax.sdpa, backward=False)
    picky = variant(
        "picky",
        softmax.sdpa,
        check_inputs=lambda q, k, v, params: "needs n divisible by 64" if q.shape[2] % 64 else None,
    )
    mechs = [softmax.MECHANISM, fused, causal_only, no_bwd, picky]
    suite = tiny(lengths=(16,), path_kinds=("reference", "efficient", "fused"))
    run = run_speed(suite, tmp_path, mechanisms=mechs)
    df = read_results(run.csv)

    def reasons(mech, path="efficient", **where):
        s = df[(df["mechanism"] == mech) & (df["path"] == path)]
        for col, value in where.items():
            s = s[s[col] == value]
        return set(zip(s["status"], s["reason"], strict=True))

    assert reasons("fusedonly", "fused") == {("unsupported", "needs a fused kernel (test double)")}
    assert reasons("causalonly", causal=False) == {("unsupported", "causalonly is causal only")}
    assert {s for s, _ in reasons("causalonly", causal=True)} == {"ok"}
    assert reasons("nobwd", direction="fwdbwd") == {
        ("unsupported", "nobwd has no backward (forward only)")
    }
    assert reasons("picky") == {("unsupported", "picky: needs n divisible by 64")}


def test_extra_inputs_and_adapted_shapes_come_from_the_registry_record(tmp_path):
    got = {}

    def biased(q, k, v, *, causal, bias):
        got["bias"] = tuple(bias.shape)
        return softmax.sdpa(q, k, v, causal=causal) + bias.sum() * 0

    def biased_reference(q, k, v, *, causal, bias):
        return softmax.reference(q, k, v, causal=causal) + bias.sum() * 0

    extra = ExtraInput("bias", "a test bias", shape=lambda s, p: (s.heads, s.seq_len))
    mech = variant("biased", biased, extra_inputs=(extra,))
    ref = PathSpec("reference", "reference", biased_reference, memory="O(n^2)")
    mech = replace(mech, paths=(ref, mech.paths[1]))
    mqa = registry.get("mqa")
    run = run_speed(
        tiny(lengths=(16,), causal=(False,)), tmp_path, mechanisms=[softmax.MECHANISM, mech, mqa]
    )
    df = read_results(run.csv)
    assert got["bias"] == (2, 16)
    assert (df[df["mechanism"] == "biased"]["status"] == "ok").all()
    assert set(df[df["mechanism"] == "mqa"]["kv_heads"]) == {1}


def test_ctrl_c_keeps_finished_rows_and_says_what_was_not_run(tmp_path):
    def interrupted(q, k, v, *, causal):
        if q.shape[2] == 32:
            raise KeyboardInterrupt
        return softmax.sdpa(q, k, v, causal=causal)

    suite = tiny(lengths=(16, 32, 64), causal=(False,))
    mechs = [softmax.MECHANISM, variant("stopper", interrupted)]
    run = run_speed(suite, tmp_path, mechanisms=mechs)
    assert run.interrupted
    df = read_results(run.csv)
    assert set(df["seq_len"]) <= {16, 32} and (df[df["seq_len"] == 16]["status"] == "ok").all()
    assert len(df[df["seq_len"] == 16]) == 4 * 2  # every n=16 case finished and was kept
    assert any("n=64" in label for label in run.not_run)
    assert len(run.not_run) + len(df) == sum(len(g.cases) for g in plan(suite, mechs))
    assert describe_not_run(run.not_run).startswith(f"{len(run.not_run)} cases: ")
    side = json.loads(run.sidecar.read_text())
    assert side["interrupted"] is True and side["not_run"] == run.not_run


def test_slow_calls_skip_longer_lengths(tmp_path):
    def slow(q, k, v, *, causal):
        time.sleep(0.02)
        return softmax.sdpa(q, k, v, causal=causal)

    suite = tiny(lengths=(16, 32), causal=(False,), directions=("fwd",), max_call_s=0.01)
    run = run_speed(suite, tmp_path, mechanisms=[softmax.MECHANISM, variant("slow", slow)])
    df = read_results(run.csv).set_index(["mechanism", "path", "seq_len"])
    assert df.loc[("slow", "efficient", 16), "status"] == "ok"
    assert df.loc[("slow", "efficient", 32), "status"] == "skipped"
    assert "suite limit max_call_s = 0.01" in df.loc[("slow", "efficient", 32), "reason"]


def test_selection_caps_and_command_line_overrides():
    suite = tiny(max_len={"reference": 16}, reference="softmax:efficient")
    groups = plan(suite)
    ref_lengths = {c.shape.seq_len for g in groups for c in g.cases if c.path.kind == "reference"}
    assert ref_lengths == {16}
    lifted = override(suite, lengths="16,32")
    assert lifted.max_len == {}
    only = override(suite, impls=["flash-tiled:efficient"])
    pairs = [(m.name, p.name) for m, p in select(only)]
    assert pairs == [("flash-tiled", "efficient"), ("softmax", "efficient")]  # + the reference
    assert [(m.name, p.name) for m, p in select(override(only, reference="none"))] == [
        ("flash-tiled", "efficient")
    ]
    for bad in ("0", "12,abc", "-4", "1.5", ""):
        with pytest.raises(AttnbenchError, match="--lengths"):
            override(suite, lengths=bad)
    with pytest.raises(AttnbenchError, match="unknown mechanism 'sofmax'"):
        override(suite, impls=["sofmax"])
    with pytest.raises(AttnbenchError, match="has no path 'fast'"):
        override(suite, impls=["softmax:fast"])
    with pytest.raises(AttnbenchError, match="no selected mechanism has a parameter 'window'"):
        override(suite, impls=["softmax"], params={"window": "4"})
    if not torch.cuda.is_available():
        with pytest.raises(AttnbenchError, match="no GPU"):
            override(suite, device="cuda")


def test_every_registered_mechanism_runs_through_the_suite(tmp_path):
    """The generic path: every registered mechanism and path, at one small length, both
    directions and causal flags; nothing may end as an error (unsupported is fine)."""
    suite = tiny(
        lengths=(24,), head_dims=(16,), heads=4, path_kinds=("reference", "efficient", "fused")
    )
    run = run_speed(suite, tmp_path)
    df = read_results(run.csv)
    errors = df[df["status"] == "error"]
    assert errors.empty, errors[["mechanism", "path", "direction", "reason"]].to_string()
    expected = {(m.name, p.name) for m in registry.MECHANISMS for p in m.paths}
    assert set(zip(df["mechanism"], df["path"], strict=True)) == expected
    ok = df[df["status"] == "ok"]
    assert ok["flops"].gt(0).all()
    # Compiled paths on the CPU (FlexAttention) run under no dispatch mode: memory not measured,
    # and the row says so; every other ok row has its peak memory.
    unseen = ok["mem_method"].str.startswith("not measured")
    compiled = {f"{m.name}:{p.name}" for m in registry.MECHANISMS for p in m.paths if p.compiled}
    assert set(ok[unseen]["mechanism"] + ":" + ok[unseen]["path"]) <= compiled
    assert ok[unseen]["mem_fwd_bytes"].isna().all() and ok[~unseen]["mem_fwd_bytes"].notna().all()


class OutOfResources(Exception):
    """Stands in for triton.runtime.errors.OutOfResources (matched by its type's name)."""


def test_out_of_resources_is_unsupported_and_longer_lengths_still_run(tmp_path):
    def too_big(q, k, v, *, causal):
        if q.shape[2] == 16:
            raise OutOfResources("out of resource: shared memory, Required: 270336")
        return softmax.sdpa(q, k, v, causal=causal)

    suite = tiny(lengths=(16, 32), causal=(False,), directions=("fwd",))
    run = run_speed(suite, tmp_path, mechanisms=[softmax.MECHANISM, variant("tight", too_big)])
    mine = read_results(run.csv).query("mechanism == 'tight' and path == 'efficient'")
    mine = mine.set_index("seq_len")
    assert mine.loc[16, "status"] == "unsupported"
    assert "shared memory" in mine.loc[16, "reason"]
    assert mine.loc[32, "status"] == "ok"  # not skipped as an out-of-memory series would be
    assert not is_oom(OutOfResources("x"))


def test_skips_are_predicted_from_the_timed_median_not_a_warm_up_call(tmp_path):
    """A slow warm-up call (compilation, autotuning) must not skip the longer lengths."""
    calls = {"n": 0}

    def slow_once(q, k, v, *, causal):
        calls["n"] += 1
        if calls["n"] == 1:  # the warm-up call (FAST takes one)
            time.sleep(0.3)
        return softmax.sdpa(q, k, v, causal=causal)

    suite = replace(tiny(lengths=(16, 32), causal=(False,), directions=("fwd",)), max_call_s=0.05)
    run = run_speed(suite, tmp_path, mechanisms=[softmax.MECHANISM, variant("cold", slow_once)])
    mine = read_results(run.csv).query("mechanism == 'cold' and path == 'efficient'")
    assert (mine["status"] == "ok").all(), mine[["seq_len", "status", "reason"]]


def test_a_sticky_cuda_error_stops_the_sweep_and_resume_finishes_it(tmp_path):
    """An illegal memory access poisons the process's CUDA context: the case is an error row,
    the sweep stops (every later call would fail too), and --resume in a fresh process runs
    what is left without redoing finished cases."""
    state = {"broken": True}

    def crashes(q, k, v, *, causal):
        if q.shape[2] == 32 and state["broken"]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return softmax.sdpa(q, k, v, causal=causal)

    mechs = [softmax.MECHANISM, variant("crash", crashes)]
    suite = tiny(lengths=(16, 32, 64), causal=(False,), directions=("fwd",))
    first = run_speed(suite, tmp_path, mechanisms=mechs)
    assert first.stopped and "--resume" in first.stopped and first.not_run
    rows = read_results(first.csv)
    bad = rows.query("mechanism == 'crash' and path == 'efficient' and seq_len == 32")
    assert list(bad["status"]) == ["error"]
    assert 64 not in set(rows["seq_len"])  # nothing after the crash ran in the broken process
    done_before = len(rows)

    state["broken"] = False  # a fresh process
    second = run_speed(suite, tmp_path, mechanisms=mechs, resume=True)
    assert not second.stopped and not second.not_run
    rows = read_results(second.csv)
    assert len(rows) == len(set(map(tuple, rows[["mechanism", "path", "seq_len"]].values)))
    assert len(rows) == 2 * 2 * 3  # every case once: 2 mechanisms x 2 paths x 3 lengths
    assert len(rows) > done_before
    assert json.loads(second.sidecar.read_text())["resumed_with_rows"] == done_before


def test_round_order_rotates_every_position_through_every_place():
    from attnbench.measure.timing import round_order

    count = 5
    rounds = [round_order(count, r) for r in range(count)]
    assert all(sorted(r) == list(range(count)) for r in rounds)
    for place in range(count):  # a cyclic Latin square: each member once in each place
        assert sorted(r[place] for r in rounds) == list(range(count))
    assert round_order(count, count) == rounds[0]
    assert round_order(count, 3, "fixed") == list(range(count))
    assert round_order(count, 3, "reversed") == list(range(count))[::-1]
    shuffled = round_order(count, 3, "shuffle")
    assert sorted(shuffled) == list(range(count)) and shuffled == round_order(count, 3, "shuffle")
    assert round_order(1, 7) == [0] and round_order(0, 2) == []
    with pytest.raises(ValueError, match="accepted: rotate"):
        round_order(3, 0, "random")
