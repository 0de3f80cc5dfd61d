"""The inference shapes in the speed suite: decoding (``shape.query_lengths``: every decode
form against a cache of each length, its bytes and memory roofline) and packed batches
(``shape.varlen``: each path packed beside the same sequences padded), planned, run, summed up
and drawn."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from attnbench.bench.config import load_suite, reference_pair, select
from attnbench.bench.inference_summary import decode_rows, fastest_decoder, packed_rows
from attnbench.bench.plan import plan
from attnbench.bench.plot import plot_results
from attnbench.bench.results import KEY, read_results, read_samples_file
from attnbench.bench.run import run_speed
from attnbench.core.errors import AttnbenchError
from attnbench.measure.bandwidth import CopyAnchor
from attnbench.runtime.tomlconfig import parse_settings
from tests.helpers.speed import tiny

DECODE = tiny(
    mechanisms=("softmax", "gqa", "linear", "local", "bigbird"),
    query_lengths=(1, 3),
    kv_heads=(1, 2),
    lengths=(16, 32, 64),
    heads=4,
    reference="softmax:sdpa",
    copy_mib=1,
)


def test_decode_plan_groups_each_query_length_and_cache():
    groups = plan(DECODE)
    assert [(g.query_len, g.seq_len) for g in groups] == [
        (1, 16), (1, 32), (1, 64), (3, 16), (3, 32), (3, 64)
    ]  # fmt: skip
    cases = groups[0].cases
    assert all(c.causal and c.direction == "fwd" and c.shape.query_len == 1 for c in cases)
    assert {c.path.kind for c in cases} == {"decode"}
    gqa = [c for c in cases if c.mech.name == "gqa"]
    assert sorted({c.shape.kv_heads for c in gqa}) == [1, 2]  # the kv_heads axis, per form
    bigbird = [c for c in cases if c.mech.name == "bigbird"]
    assert len(bigbird) == 1 and "random blocks" in bigbird[0].path.unavailable("cpu")
    assert reference_pair(DECODE) == ("softmax", "sdpa")


def test_decode_names_resolve_to_decode_forms():
    pairs = {(m.name, p.name) for m, p in select(DECODE)}
    assert ("linear", "recurrent") in pairs and ("local", "gather") in pairs
    assert ("softmax", "efficient") not in pairs


def test_suite_keys_of_the_inference_shapes(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[grid]\nreference = "softmax:sdpa"\n[shape]\nquery_lengths = [1]\n')
    assert load_suite(str(path)).decoding
    bad = parse_settings(["shape.varlen=tokens=10,count=3,seed=0"])
    with pytest.raises(AttnbenchError, match="varlen and query_lengths cannot be combined"):
        load_suite(str(path), settings=bad)
    path.write_text('[grid]\nmechanisms = ["softmax:efficient"]\n[shape]\nquery_lengths = [1]\n')
    with pytest.raises(AttnbenchError, match="softmax has no decode form 'efficient'"):
        load_suite(str(path))
    # a prefill suite decoded with --set: its reference and exclusions name paths; the
    # reference becomes the mechanism's first decode form, the exclusions exclude nothing
    speed = load_suite("speed", settings=parse_settings(["shape.query_lengths=1"]))
    assert reference_pair(speed) == ("softmax", "sdpa")
    assert ("softmax-logn", "sdpa") in {(m.name, p.name) for m, p in select(speed)}
    path.write_text('[shape]\nvarlen = "5,0"\n')
    with pytest.raises(AttnbenchError, match='accepted: a list of lengths >= 1, "L1,L2'):
        load_suite(str(path))
    path.write_text("[shape]\nvarlen = [5, 7]\n")
    assert load_suite(str(path)).varlen == (5, 7)
    drawn = load_suite(
        str(path), settings=parse_settings(["shape.varlen=tokens=64,count=4,seed=1"])
    )
    assert sum(drawn.varlen) == 64 and len(drawn.varlen) == 4
    assert drawn.settings()["shape"]["varlen_text"] == "tokens=64,count=4,seed=1"


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    out = tmp_path_factory.mktemp("decode")
    run = run_speed(DECODE, out)
    return run, read_results(out / "results.csv"), out


def test_decode_rows_carry_bytes_and_the_memory_roofline(decoded):
    run, df, _ = decoded
    ok = df[df["status"] == "ok"]
    assert set(ok["path_kind"]) == {"decode"} and ok["query_len"].notna().all()
    assert (ok["bytes_moved"] > 0).all() and (ok["state_bytes"] > 0).all()
    assert (ok["copy_bytes_per_s"] > 0).all() and (ok["bandwidth_fraction"] > 0).all()
    rate = ok["bytes_moved"] / (ok["time_median_ms"] / 1e3)
    pd.testing.assert_series_equal(
        rate.astype(float), ok["bytes_per_s"], check_names=False, rtol=1e-4
    )
    tokens = ok["batch"] * ok["query_len"] / (ok["time_median_ms"] / 1e3)
    pd.testing.assert_series_equal(
        tokens.astype(float), ok["tokens_per_s"], check_names=False, rtol=1e-4
    )
    softmax = ok[(ok["mechanism"] == "softmax") & (ok["query_len"] == 1)].sort_values("seq_len")
    assert softmax["state_bytes"].is_monotonic_increasing  # a cache grows with n
    linear = ok[(ok["path"] == "recurrent") & (ok["query_len"] == 1)]
    assert linear["state_bytes"].nunique() == 1  # a recurrent state does not
    gqa = ok[(ok["mechanism"] == "gqa") & (ok["seq_len"] == 64) & (ok["query_len"] == 1)]
    assert set(zip(gqa["kv_heads"], gqa["params"], strict=True)) >= {(1, "kv_heads=1")}
    unsupported = df[df["status"] == "unsupported"]
    assert {"bigbird", "linear"} <= set(unsupported["mechanism"])  # no form; CUDA-only form
    assert ok["ref_ratio"].notna().all()


def test_decode_summary_and_exponents(decoded):
    run, df, out = decoded
    rows = decode_rows(run.rows, run.exponents)
    sdpa = next(r for r in rows if r["impl"] == "softmax:sdpa" and r["query_len"] == 3)
    assert sdpa["n"] == 64 and sdpa["ms_per_token"] > 0 and sdpa["copy_fraction"] > 0
    assert any("reason" in r and r["impl"] == "bigbird:decode" for r in rows)
    fastest = fastest_decoder(run.rows)
    assert {(f["query_len"], f["n"]) for f in fastest} == {(q, n) for q in (1, 3)
                                                             for n in (16, 32, 64)}  # fmt: skip
    cx = pd.read_csv(out / "complexity.csv")
    assert set(cx["query_len"]) == {1, 3}
    from attnbench.cli.speed_report import summary_json

    data = json.loads(summary_json(run, []))  # NaN-free: missing numbers are null
    assert {r["impl"] for r in data["decode"]} >= {"softmax:sdpa", "linear:recurrent"}
    assert data["summary"] == [] and len(data["fastest_decode"]) == 6


def test_decode_figures_and_samples(decoded, tmp_path):
    _, df, out = decoded
    figures = plot_results(out / "results.csv", tmp_path)
    assert sorted(p.name for p in figures.paths) == ["decode-time-q1.png", "decode-time-q3.png"]
    samples = read_samples_file(out / "samples.jsonl")
    assert len(samples) == (df["status"] == "ok").sum()


def test_samples_and_rows_of_older_files_read_without_the_new_key_columns(decoded, tmp_path):
    _, _, out = decoded
    line = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    for column in ("query_len", "varlen", "packing"):
        del line[column]
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps(line) + "\n")
    (key,) = read_samples_file(old)
    assert len(key) == len(KEY) and key[-3:] == ("", "", "")


def test_copy_anchor_moves_twice_its_size():
    copy = CopyAnchor(torch_device(), 1 << 20)
    assert copy.bytes == 2 * copy.size == 2 << 20
    assert copy().data_ptr() == copy.dst.data_ptr()


def torch_device():
    import torch

    return torch.device("cpu")


PACKED = tiny(
    mechanisms=("softmax", "linear", "aft-full"),
    exclude=("linear:compiled",),  # compiled once per sequence length: slow, and the same loop
    varlen=(40, 7, 13),
    causal=(True,),
    directions=("fwd",),
)


def test_packed_batch_runs_packed_and_padded_side_by_side(tmp_path):
    groups = plan(PACKED)
    assert len(groups) == 1 and groups[0].seq_len == 60
    packing = {(c.impl, c.packing) for c in groups[0].cases}
    assert ("softmax:reference", "packed") in packing  # its block-diagonal entry
    assert ("softmax:efficient", "packed-loop") in packing  # no causal varlen SDPA here
    assert ("linear:chunkwise", "padded") in packing
    run = run_speed(PACKED, tmp_path)
    df = read_results(tmp_path / "results.csv")
    ok = df[df["status"] == "ok"]
    assert set(ok["varlen"]) == {"40+7+13"}
    padded = ok[ok["packing"] == "padded"]
    packed = ok[ok["packing"] != "padded"]
    assert (padded["batch"] == 3).all() and (padded["seq_len"] == 40).all()
    assert (packed["batch"] == 1).all() and (packed["seq_len"] == 60).all()
    # the same useful FLOPs (pairs inside each sequence); the padded batch computes more
    merged = packed.merge(padded, on=["mechanism", "path"], suffixes=("", "_pad"))
    assert (merged["flops"] == merged["flops_pad"]).all()
    assert (merged["flops_executed_pad"] > merged["flops_pad"]).all()
    assert (ok["tokens_per_s"] * ok["time_median_ms"] / 1e3).round().eq(60).all()
    assert ok["ref_ratio"].notna().all()  # packed against the packed reference, padded padded
    rows = packed_rows(run.rows)
    sdpa = next(r for r in rows if r["impl"] == "softmax:efficient")
    assert sdpa["packing"] == "packed-loop" and sdpa["speedup"] > 0
    assert not pd.read_csv(tmp_path / "complexity.csv").shape[0]  # no n axis: no exponent
