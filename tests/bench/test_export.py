"""``attnbench export`` (github-action-benchmark and Bencher JSON) and the
``torch.utils.benchmark.Measurement`` view of results, on small synthetic results CSVs."""

from __future__ import annotations

import json
import math
import warnings

import pytest
from torch.utils import benchmark
from typer.testing import CliRunner

from attnbench.bench import export as ex
from attnbench.bench.measurement import (
    FROM_SAMPLES,
    RECONSTRUCTED,
    measurements_frame,
    to_measurements,
)
from attnbench.bench.results import (
    SAMPLES_NAME,
    CaseSamples,
    SamplesWriter,
    read_results,
)
from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from tests.helpers.results import result_row, write_results

runner = CliRunner()

GITHUB_FIELDS = {"name": str, "unit": str, "value": (int, float)}
GITHUB_OPTIONAL = {"range": str, "extra": str}


def grid_rows():
    rows = []
    for n in (256, 512):
        for direction in ("fwd", "fwdbwd"):
            rows.append(result_row(n=n, direction=direction))
            rows.append(result_row("local", n=n, direction=direction, params="window=64"))
    rows.append(result_row("gqa", kv_heads=2, params="kv_heads=2", family="multi-query"))
    rows.append(result_row("softmax", "sdpa-flash", status="unsupported", reason="needs CUDA"))
    return rows


@pytest.fixture
def results_csv(tmp_path):
    return write_results(tmp_path / "results.csv", grid_rows())


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def export_cli(*args):
    return runner.invoke(app, ["export", *map(str, args)])


# ---------------------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------------------


def check_github_schema(doc):
    """github-action-benchmark's custom tools: an array of {name, unit, value, range?, extra?}."""
    assert isinstance(doc, list) and doc
    for entry in doc:
        assert set(entry) <= set(GITHUB_FIELDS) | set(GITHUB_OPTIONAL), entry
        for field, kind in {**GITHUB_FIELDS, **GITHUB_OPTIONAL}.items():
            if field in GITHUB_FIELDS or field in entry:
                assert isinstance(entry[field], kind), (field, entry)
        assert math.isfinite(entry["value"]) and not isinstance(entry["value"], bool)
    names = [e["name"] for e in doc]
    assert len(names) == len(set(names))


def check_bmf_schema(doc):
    """Bencher Metric Format: {benchmark: {measure: {value, lower_value?, upper_value?}}}."""
    assert isinstance(doc, dict) and doc
    for benchmark_name, measures in doc.items():
        assert isinstance(benchmark_name, str) and benchmark_name
        assert isinstance(measures, dict) and measures
        for slug, metric in measures.items():
            assert isinstance(slug, str) and 0 < len(slug) <= 64
            assert set(metric) <= {"value", "lower_value", "upper_value"} and "value" in metric
            assert all(isinstance(v, float) and math.isfinite(v) for v in metric.values())
            if "lower_value" in metric or "upper_value" in metric:
                assert metric["lower_value"] <= metric["value"] <= metric["upper_value"]


def test_github_benchmark_time(results_csv):
    res = export_cli(results_csv, "--to", "github-benchmark")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    check_github_schema(doc)
    assert len(doc) == 9  # the ok rows only
    by_name = {e["name"]: e for e in doc}
    entry = by_name["local:efficient(window=64) fwd bidir n=256 float32 B=1 H=4 D=32 [time]"]
    assert entry["unit"] == "ms" and entry["value"] == 2.0
    assert entry["range"] == "+/- 0.3"  # (p80 - p20) / 2 = (2.4 - 1.8) / 2
    assert "p20 1.8, p80 2.4 ms over 5 rounds" in entry["extra"]
    assert "gqa:efficient(kv_heads=2) fwd bidir n=256 float32 B=1 H=4 Hkv=2 D=32 [time]" in by_name
    assert "github-action-benchmark: tool: 'customSmallerIsBetter'" in res.stderr


def test_github_benchmark_bigger_is_better(results_csv, tmp_path):
    out = tmp_path / "sub" / "bench.json"
    res = export_cli(results_csv, "--to", "github-benchmark", "--metric", "throughput,roofline")
    assert res.exit_code == 0, res.output
    res = export_cli(
        results_csv, "--to", "github-benchmark", "--metric", "throughput", "--metric",
        "roofline", "--out", out,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "tool: 'customBiggerIsBetter'" in res.stderr and f"wrote {out}" in res.stderr
    doc = json.loads(out.read_text())
    check_github_schema(doc)
    assert {e["unit"] for e in doc} == {"tokens/s", "fraction of matmul FLOP/s"}
    tput = next(e for e in doc if e["name"].startswith("softmax:efficient fwd bidir n=512"))
    assert tput["value"] == pytest.approx(512 / 2e-3, rel=1e-6)


def test_bencher_metric_format(results_csv):
    metrics = "time,throughput,memory,roofline,flop-rate,ref-ratio"
    res = export_cli(results_csv, "--to", "bencher", "--metric", metrics)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    check_bmf_schema(doc)
    assert len(doc) == 9
    case = doc["softmax:efficient fwdbwd bidir n=512 float32 B=1 H=4 D=32"]
    assert set(case) == {
        "latency", "throughput", "peak-memory", "roofline", "flop-rate", "ref-ratio"
    }  # fmt: skip
    # Bencher's latency is in nanoseconds; its bounds are p20 / p80.
    assert case["latency"] == {"value": 6e6, "lower_value": 5.4e6, "upper_value": 7.2e6}
    # Throughput's bounds come from the time's: the slow rounds give the low rate.
    tput = case["throughput"]
    assert tput["value"] == pytest.approx(512 / 6e-3, rel=1e-5)
    assert tput["lower_value"] == pytest.approx(512 / 7.2e-3, rel=1e-5)
    assert case["peak-memory"] == {"value": 3000.0 * 512}  # fwdbwd: the fwd + bwd peak
    assert doc["softmax:efficient fwd bidir n=512 float32 B=1 H=4 D=32"]["peak-memory"] == {
        "value": 1000.0 * 512
    }
    assert case["ref-ratio"] == {"value": 1.1, "lower_value": 1.0, "upper_value": 1.3}
    assert set(case["roofline"]) == {"value"}


def test_names_are_stable_across_runs(tmp_path):
    first = write_results(tmp_path / "a.csv", grid_rows())
    faster = [{**r, "time_median_ms": 1.0, "time_p20_ms": 0.9} for r in grid_rows()]
    second = write_results(tmp_path / "b.csv", list(reversed(faster)))
    a, b = (ex.export(p, "bencher") for p in (first, second))
    assert set(a) == set(b)
    assert a != b


def test_bounds_never_exclude_the_value(tmp_path):
    # One sample: p20 == median == p80 in the CSV, and the derived throughput's bounds,
    # computed from 6-digit times, must still hold the value.
    row = result_row(median=1.234567, time_p20_ms=1.234567, time_p80_ms=1.234567)
    doc = ex.export(write_results(tmp_path / "r.csv", [row]), "bencher", ["throughput", "time"])
    check_bmf_schema(doc)


def test_rows_without_the_metric_are_left_out(tmp_path):
    rows = [result_row(), result_row("local", roofline=None)]
    doc = ex.export(write_results(tmp_path / "r.csv", rows), "github-benchmark", ["roofline"])
    assert [e["name"].split(":")[0] for e in doc] == ["softmax"]
    assert "range" not in doc[0]


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2
# ---------------------------------------------------------------------------------------------


def test_unknown_target_and_metric(results_csv):
    line = one_error_line(export_cli(results_csv, "--to", "gh-benchmark"))
    assert "gh-benchmark" in line and "github-benchmark, bencher" in line
    line = one_error_line(export_cli(results_csv, "--to", "bencher", "--metric", "latency"))
    assert "unknown metric 'latency'" in line and "time, throughput, memory" in line
    line = one_error_line(export_cli(results_csv))
    assert "--to" in line


def test_mixed_directions_for_github(results_csv):
    line = one_error_line(
        export_cli(results_csv, "--to", "github-benchmark", "--metric", "time,throughput")
    )
    assert "one direction per file" in line


def test_not_a_results_csv(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("variant,seed,step,loss\nO,0,50,3.2\n")
    line = one_error_line(export_cli(other, "--to", "bencher"))
    assert "not an attnbench results CSV" in line
    line = one_error_line(export_cli(tmp_path / "missing.csv", "--to", "bencher"))
    assert "no such file" in line


def test_no_ok_rows(tmp_path):
    rows = [result_row(status="unsupported", reason="needs CUDA", time_median_ms=None)]
    csv_path = write_results(tmp_path / "r.csv", rows)
    line = one_error_line(export_cli(csv_path, "--to", "github-benchmark"))
    assert "no ok rows" in line and "unsupported 1" in line


def test_metric_absent_everywhere(tmp_path):
    csv_path = write_results(tmp_path / "r.csv", [result_row(roofline=None)])
    line = one_error_line(export_cli(csv_path, "--to", "bencher", "--metric", "roofline"))
    assert "no ok row has a value for metric 'roofline'" in line


def test_one_case_twice(tmp_path):
    csv_path = write_results(tmp_path / "r.csv", [result_row(), result_row(median=3.0)])
    line = one_error_line(export_cli(csv_path, "--to", "bencher"))
    assert "two ok rows for the case" in line


# ---------------------------------------------------------------------------------------------
# torch.utils.benchmark.Measurement
# ---------------------------------------------------------------------------------------------


def test_measurements_from_the_three_known_times(results_csv):
    ms = to_measurements(results_csv)
    df = read_results(results_csv)
    ok = df[df["status"] == "ok"].reset_index(drop=True)
    assert len(ms) == len(ok)
    for m, (_, row) in zip(ms, ok.iterrows(), strict=True):
        assert m.label == "attention"
        assert m.number_per_run == 3
        # Only median, p20 and p80 are known: they are the three times, nothing invented.
        assert m.times == pytest.approx([row[c] / 1e3 for c in ("time_p20_ms", "time_median_ms",
                                                                  "time_p80_ms")])  # fmt: skip
        assert m.median == pytest.approx(row["time_median_ms"] / 1e3)
        assert m.metadata["times"] == RECONSTRUCTED
        assert m.description == ex.case_impl(row) and m.sub_label == ex.case_shape(row)
    back = measurements_frame(ms)
    assert list(back["mechanism"]) == list(ok["mechanism"])
    assert list(back["seq_len"]) == list(ok["seq_len"])
    assert back["time_median_ms"].to_numpy() == pytest.approx(ok["time_median_ms"].to_numpy())


def test_compare_prints_attnbench_beside_a_users_own(results_csv, capsys):
    ours = to_measurements(results_csv)
    mine = benchmark.Timer(
        "x @ x",
        setup="import torch; x = torch.ones(8, 8)",
        label="attention",
        sub_label=ours[0].sub_label,
        description="mine",
        num_threads=ours[0].num_threads,
    ).timeit(20)
    benchmark.Compare([*ours, mine]).print()
    text = capsys.readouterr().out
    assert "[" in text and "attention" in text
    for column in ("softmax:efficient", "local:efficient(window=64)", "mine"):
        assert column in text
    row_line = next(ln for ln in text.splitlines() if ours[0].sub_label in ln)
    cells = [c.strip() for c in row_line.split("|")[1:]]
    assert sum(bool(c) for c in cells) == 3  # softmax, local and mine side by side in one row


def test_measurements_by_family_and_from_a_dataframe(results_csv):
    frame = read_results(results_csv)
    ms = to_measurements(frame, by_family=True)
    assert {m.label for m in ms} == {"softmax", "multi-query"}
    benchmark.Compare(ms).print()
    with pytest.raises(AttnbenchError, match="no column"):
        to_measurements(frame.drop(columns=["seq_len"]))


def write_samples(folder, rows, per_call_ms):
    """samples.jsonl as run speed keeps it, named in the sidecar."""
    writer = SamplesWriter(folder / SAMPLES_NAME)
    for row in rows:
        writer.write(row, CaseSamples(tuple(per_call_ms)))
    writer.close()
    sidecar = {"files": {"rows": "results.csv", "samples": SAMPLES_NAME}}
    (folder / "results.json").write_text(json.dumps(sidecar))
    return folder / SAMPLES_NAME


def test_measurements_use_the_runs_own_samples(tmp_path):
    rows = [result_row(), result_row("local", params="window=64")]
    csv_path = write_results(tmp_path / "results.csv", rows)
    write_samples(tmp_path, rows[:1], [2.0, 1.8, 2.4, 2.1, 1.9])
    ms = to_measurements(csv_path)
    assert ms[0].metadata["times"] == FROM_SAMPLES
    assert ms[0].times == pytest.approx([2.0e-3, 1.8e-3, 2.4e-3, 2.1e-3, 1.9e-3])
    assert ms[0].raw_times[0] == pytest.approx(2.0e-3 * 3)  # a sample times a block of 3 calls
    assert ms[1].metadata["times"] == RECONSTRUCTED  # no samples for this case


def test_measurements_from_a_real_run(tmp_path):
    """What `run speed` writes, read back: every ok row from its own per-round samples."""
    from attnbench.bench.config import load_suite, override
    from attnbench.bench.run import run_speed

    suite = override(load_suite("ci"), impls=["softmax"], lengths="64", direction="fwd", rounds=3)
    run = run_speed(suite, tmp_path / "run")
    ms = to_measurements(run.csv)
    assert ms and all(m.metadata["times"] == FROM_SAMPLES for m in ms)
    assert all(len(m.times) >= 3 for m in ms)


def test_an_unreadable_samples_file_falls_back_with_a_warning(tmp_path):
    csv_path = write_results(tmp_path / "results.csv", [result_row()])
    bad = write_samples(tmp_path, [], [])
    bad.write_text("a,b\n1,2\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ms = to_measurements(csv_path)
    assert ms[0].metadata["times"] == RECONSTRUCTED
    assert any("not an attnbench samples line" in str(w.message) for w in caught)
    with pytest.raises(AttnbenchError, match="not an attnbench samples line"):
        to_measurements(csv_path, samples=bad)


def test_measurements_need_ok_rows(tmp_path):
    rows = [result_row(status="error", reason="boom", time_median_ms=None)]
    with pytest.raises(AttnbenchError, match="no ok rows"):
        to_measurements(write_results(tmp_path / "r.csv", rows))
