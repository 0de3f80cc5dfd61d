"""``attnbench compare`` on synthetic results: every verdict and every exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.bench.compare import Thresholds, compare
from attnbench.bench.results import COLUMNS, ResultsWriter
from attnbench.cli import app
from tests.helpers.results import reference_row, row

runner = CliRunner()


def write(path: Path, rows: list[dict], sidecar: dict | None = None) -> Path:
    writer = ResultsWriter(path)
    for r in rows:
        writer.write(r)
    writer.close()
    if sidecar is not None:
        path.with_suffix(".json").write_text(json.dumps(sidecar))
    return path


def pair(tmp_path, base_rows, cur_rows):
    b = write(tmp_path / "base.csv", base_rows, {"git": {"sha": "a" * 40, "dirty": False}})
    c = write(tmp_path / "cur.csv", cur_rows)
    return c, b


def verdicts(result) -> dict[str, str]:
    return {f"{ln.case}|{ln.metric}": ln.verdict for ln in result.lines}


def test_identical_runs_exit_0(tmp_path):
    rows = [reference_row(), row(), row(seq_len=256), row(direction="fwdbwd", flops=3_000_000)]
    c, b = pair(tmp_path, rows, rows)
    result = compare(c, b)
    assert result.exit_code == 0 and result.compared == 4
    assert set(verdicts(result).values()) == {"same"}


def test_a_real_slowdown_fails_and_noise_does_not(tmp_path):
    base = [reference_row(), row()]
    slow = row(ref_ratio=0.75, ref_ratio_p20=0.72, ref_ratio_p80=0.78)  # 1.5x, bands apart
    c, b = pair(tmp_path, base, [reference_row(), slow])
    result = compare(c, b)
    assert result.exit_code == 1 and result.count("worse") == 1
    # The same factor with overlapping bands (a noisy run) is not a regression...
    noisy = row(ref_ratio=0.75, ref_ratio_p20=0.45, ref_ratio_p80=0.9)
    c, b = pair(tmp_path, base, [reference_row(), noisy])
    assert compare(c, b).exit_code == 0
    # ...unless separation is switched off.
    assert compare(c, b, Thresholds(require_separation=False)).exit_code == 1
    # A 10 % change is within the threshold; a 2x speed-up is "better", not a failure.
    c, b = pair(tmp_path, base, [reference_row(), row(ref_ratio=0.55, ref_ratio_p20=0.53)])
    assert compare(c, b).exit_code == 0
    fast = row(ref_ratio=0.25, ref_ratio_p20=0.24, ref_ratio_p80=0.26)
    c, b = pair(tmp_path, base, [reference_row(), fast])
    result = compare(c, b)
    assert result.exit_code == 0 and result.count("better") == 1


def test_the_reference_itself_is_compared_in_matmul_units(tmp_path):
    base = [reference_row()]
    c, b = pair(tmp_path, base, [reference_row(time_median_ms=4.0 * 2.0)])
    assert compare(c, b).exit_code == 1
    # A machine half as fast: time doubles, so does 1 / matmul rate; nothing changed.
    c, b = pair(tmp_path, base, [reference_row(time_median_ms=8.0, matmul_flop_per_s=2.5e10)])
    assert compare(c, b).exit_code == 0


def test_flops_memory_and_status_changes(tmp_path):
    base = [reference_row(), row()]
    cases = {
        "flops": row(flops=1_000_001),
        "memory +10%": row(mem_fwd_bytes=1_100_000 + 64 * 1024),
        "status": row(status="oom", reason="OutOfMemoryError: ..."),
    }
    for name, changed in cases.items():
        c, b = pair(tmp_path, base, [reference_row(), changed])
        assert compare(c, b).exit_code == 1, name
    # Skipped by the sweep's time limit (a load burst can trip its prediction): not measured,
    # reported, not failed; the smaller n it was predicted from is compared on its own.
    skipped = row(status="skipped", reason="skipped: one call took 0.066 s at n=256, ...")
    c, b = pair(tmp_path, base, [reference_row(), skipped])
    result = compare(c, b)
    assert result.exit_code == 0 and "not measured" in result.lines[-1].note
    c, b = pair(tmp_path, base, [reference_row(), row(mem_fwd_bytes=1_010_000)])
    assert compare(c, b).exit_code == 0  # within 2 % + 64 KiB
    c, b = pair(tmp_path, base, [reference_row(), row(mem_method="cuda-max-allocated")])
    assert compare(c, b).exit_code == 0  # different methods are not compared


def test_new_and_missing_rows_are_reported_not_failed(tmp_path):
    base = [reference_row(), row()]
    current = [reference_row(), row(mechanism="brand-new", params="")]
    c, b = pair(tmp_path, base, current)
    result = compare(c, b)
    assert result.exit_code == 0
    assert result.count("new") == 1 and result.count("missing") == 1
    assert any("new" in w for w in result.warnings) and any(
        "not in this" in w for w in result.warnings
    )


def test_other_machine_or_nothing_in_common_exits_3(tmp_path):
    base = [reference_row(), row()]
    c, b = pair(tmp_path, base, [reference_row(device_name="Other CPU"), row()])
    result = compare(c, b)
    assert result.exit_code == 3
    assert any("another machine" in w for w in result.warnings)
    c, b = pair(tmp_path, base, [reference_row(torch_version="2.99.0")])
    assert compare(c, b).exit_code == 3
    c, b = pair(tmp_path, base, [row(seq_len=8)])  # no case in common
    assert compare(c, b).exit_code == 3


def test_another_thread_count_is_compared_with_wider_thresholds(tmp_path):
    base = [reference_row(), row()]
    slow = dict(ref_ratio=0.75, ref_ratio_p20=0.72, ref_ratio_p80=0.78)  # 1.5x, bands apart
    c, b = pair(tmp_path, base, [reference_row(threads=2), row(threads=2, **slow)])
    result = compare(c, b)
    assert result.exit_code == 0 and result.compared == 2  # 1.5 < 1.35 ** 2
    (warning,) = [w for w in result.warnings if "not made for comparing" in w]
    assert "threads 1 in the baseline, 2 now" in warning
    twice = dict(ref_ratio=1.0, ref_ratio_p20=0.98, ref_ratio_p80=1.02)  # 2x
    c, b = pair(tmp_path, base, [reference_row(threads=2), row(threads=2, **twice)])
    assert compare(c, b).exit_code == 1


def test_nothing_measured_is_a_usage_error(tmp_path):
    base = [reference_row(), row()]
    for rows in ([], [row(status="unsupported", reason="needs CUDA")]):
        c, b = pair(tmp_path, base, rows)
        with pytest.raises(ValueError, match="nothing measured"):
            compare(c, b)
        result = runner.invoke(app, ["compare", str(b), str(c)])
        assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


def test_cli_exit_codes_tables_and_markdown(tmp_path):
    base = [reference_row(), row()]
    slow = row(ref_ratio=0.75, ref_ratio_p20=0.72, ref_ratio_p80=0.78)
    c, b = pair(tmp_path, base, [reference_row(), slow])
    md = tmp_path / "out" / "compare.md"
    result = runner.invoke(app, ["compare", str(c), str(b), "--markdown", str(md)])
    assert result.exit_code == 1, result.output
    assert "worse" in result.stdout and "1 regression" in result.stdout
    assert "[window=64]" in result.stdout  # not eaten as markup (the table may fold the case)
    assert "worse: local:efficient [window=64] fwd bidir n=1024" in result.stderr
    text = md.read_text()
    assert "**worse**" in text and "| case | metric | baseline | current | ratio |" in text
    assert runner.invoke(app, ["compare", str(c), str(b), "--time-ratio", "2"]).exit_code == 0
    same = runner.invoke(app, ["compare", str(b), str(b)])
    assert same.exit_code == 0 and "nothing worse" in same.stdout


def test_a_regression_must_repeat_in_the_confirming_rerun(tmp_path):
    base = write(tmp_path / "base.csv", [reference_row(), row(), row(seq_len=256)])
    slow = dict(ref_ratio=0.75, ref_ratio_p20=0.72, ref_ratio_p80=0.78)  # 1.5x, bands apart
    first = write(tmp_path / "first.csv", [reference_row(), row(**slow), row(seq_len=256)])
    # The re-run shows the same slowdown: a regression.
    again = write(tmp_path / "again.csv", [reference_row(), row(**slow), row(seq_len=256)])
    result = compare(first, base, confirm=[again])
    assert result.exit_code == 1 and result.count("worse") == 1
    # The re-run is clean: the first run's alarm was noise, reported but not failed.
    clean = write(tmp_path / "clean.csv", [reference_row(), row(), row(seq_len=256)])
    result = compare(first, base, confirm=[clean])
    assert result.exit_code == 0 and result.count("unconfirmed") == 1
    (line,) = [ln for ln in result.lines if ln.verdict == "unconfirmed"]
    assert "n=1024" in line.case and "re-run: same" in line.note
    # Something worse only in the re-run is not a regression of this run either.
    result = compare(clean, base, confirm=[first])
    assert result.exit_code == 0 and result.count("unconfirmed") == 0
    # Every re-run must agree.
    assert compare(first, base, confirm=[again, clean]).exit_code == 0
    assert compare(first, base, confirm=[again, again]).exit_code == 1
    # Deterministic quantities repeat by themselves.
    fat = write(tmp_path / "fat.csv", [reference_row(), row(flops=2), row(seq_len=256)])
    assert compare(fat, base, confirm=[fat]).exit_code == 1
    # A re-run that cannot be compared is a usage error, not a silent pass.
    other = write(tmp_path / "other.csv", [reference_row(torch_version="2.99"), row()])
    with pytest.raises(ValueError, match="not comparable with the baseline"):
        compare(first, base, confirm=[other])


def test_cli_confirm_and_the_last_lines_name_the_regression(tmp_path):
    base = write(tmp_path / "base.csv", [reference_row(), row()])
    slow = row(ref_ratio=0.75, ref_ratio_p20=0.72, ref_ratio_p80=0.78)
    first = write(tmp_path / "first.csv", [reference_row(), slow])
    clean = write(tmp_path / "clean.csv", [reference_row(), row()])
    failed = runner.invoke(app, ["compare", str(first), str(base)])
    assert failed.exit_code == 1
    # A CI log cut to its tail still says which case failed, and by how much.
    tail = failed.output.strip().splitlines()[-2:]
    assert tail[0].startswith("worse: local:efficient [window=64] fwd bidir n=1024")
    assert "(1.500x)" in tail[0] and "1 regression" in tail[1]
    args = ["compare", str(first), str(base), "--confirm", str(clean)]
    md = tmp_path / "c.md"
    passed = runner.invoke(app, [*args, "--markdown", str(md)])
    assert passed.exit_code == 0, passed.output
    assert "unconfirmed: local:efficient" in passed.output and "1 unconfirmed" in passed.output
    assert f"re-run: `{clean}`" in md.read_text()
    missing = runner.invoke(app, [*args[:-1], str(tmp_path / "nope.csv")])
    assert missing.exit_code == 2 and "Traceback" not in missing.output


def test_a_baseline_from_another_cpu_is_skipped(tmp_path):
    rows = [reference_row(), row()]

    def sidecar(signature):
        return {"machine": {"cpu_signature": signature}, "git": {"sha": "b" * 40}}

    b = write(tmp_path / "b.csv", rows, sidecar("GenuineIntel 6/143/8 avx2,avx512f"))
    c = write(tmp_path / "c.csv", rows, sidecar("AuthenticAMD 25/1/1 avx2"))
    result = compare(c, b)
    assert result.exit_code == 3 and any("another CPU" in w for w in result.warnings)
    c = write(tmp_path / "c.csv", rows, sidecar("GenuineIntel 6/143/8 avx2,avx512f"))
    assert compare(c, b).exit_code == 0


def test_the_cpu_signature_names_family_model_and_instruction_sets():
    from attnbench.measure.machine import cpu_signature

    sig = cpu_signature()
    assert "torch " in sig
    if Path("/proc/cpuinfo").is_file():
        assert sig.count("/") >= 2


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("hello,world\n1,2\n", "not an attnbench results CSV"),
        (",".join(COLUMNS[:-1]) + "\n", "schema differs"),
        (",".join(COLUMNS) + ",extra\n", "unexpected extra"),
        (",".join(COLUMNS) + "\n" + ",".join(["x"] * len(COLUMNS)) + "\n", "not an attnbench"),
        ("\x00\x01binary", "not an attnbench results CSV"),
    ],
)
def test_cli_bad_csvs_exit_2_with_one_line(tmp_path, content, words):
    good = write(tmp_path / "good.csv", [row()])
    bad = tmp_path / "bad.csv"
    bad.write_text(content)
    result = runner.invoke(app, ["compare", str(bad), str(good)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0]
    missing = runner.invoke(app, ["compare", str(tmp_path / "nope.csv"), str(good)])
    assert missing.exit_code == 2 and "no such file" in missing.stderr


def test_matmuls_of_other_sizes_are_a_warning(tmp_path):
    """Each run sizes its roofline matmul by time (timing.matmul_max_s): when the two runs kept
    different sizes, the times in units of matmul work do not compare, and compare says so."""
    rows = [reference_row(), row()]

    def sidecar(size):
        return {"calibration": {"float32": {"matmul_size": size}}, "git": {"sha": "b" * 40}}

    b = write(tmp_path / "b.csv", rows, sidecar(2048))
    c = write(tmp_path / "c.csv", rows, sidecar(1024))
    (warning,) = [w for w in compare(c, b).warnings if "matmul" in w]
    assert "baseline {'float32': 2048}, this run {'float32': 1024}" in warning
    c = write(tmp_path / "c.csv", rows, sidecar(2048))
    assert not [w for w in compare(c, b).warnings if "matmul" in w]
