"""``attnbench run speed`` and ``attnbench plot`` from the command line: output, files, figures,
and bad input (one line on stderr, exit 2, nothing already written lost)."""

from __future__ import annotations

import csv
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from attnbench import registry
from attnbench.bench.results import ResultsWriter, read_results
from attnbench.cli import app
from attnbench.core.spec import PathSpec, Requirement
from attnbench.variants import softmax
from tests.helpers.speed import tiny_suite_file

runner = CliRunner()


@pytest.fixture
def suite_file(tmp_path):
    return tiny_suite_file(tmp_path)


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_run_speed_writes_rows_summary_and_plain_progress(tmp_path, suite_file):
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", "speed", "--suite", str(suite_file), "--out", str(out)])
    assert result.exit_code == 0, result.output
    df = read_results(out / "results.csv")
    assert len(df) == 3 * 2 * 2 * 2 and (df["status"] == "ok").all()
    assert (out / "results.json").is_file() and (out / "complexity.csv").is_file()
    # Not a terminal: one plain line per case on stderr, then the summary table on stdout.
    progress = [ln for ln in result.stderr.splitlines() if ln.startswith("[")]
    assert len(progress) == len(df)
    assert progress[0].startswith("[1/24] softmax:reference fwd bidir n=16 ok")
    assert "n=16 bidir d=8 float32: warm-up, memory, then timed rounds" in result.stderr
    assert "  round 1" in result.stderr
    assert "speed summary" in result.stdout and "flash-tiled:efficient" in result.stdout


def test_options_narrow_the_grid(tmp_path, suite_file):
    out = tmp_path / "out"
    args = ["run", "speed", "--suite", str(suite_file), "--out", str(out), "--impl", "gqa"]
    args += ["--lengths", "24", "--direction", "fwd", "--no-causal", "--param", "kv_heads=1"]
    args += ["--reference", "none", "--threads", "1", "--dtype", "float64"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    df = read_results(out / "results.csv")
    assert set(df["mechanism"]) == {"gqa"} and set(df["seq_len"]) == {24}
    assert set(df["direction"]) == {"fwd"} and set(df["causal"]) == {False}
    assert set(df["kv_heads"]) == {1} and set(df["params"]) == {"kv_heads=1"}
    assert set(df["dtype"]) == {"float64"} and df["ref_ratio"].isna().all()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--impl", "sofmax"], "unknown mechanism 'sofmax'"),
        (["--impl", "softmax:turbo"], "has no path 'turbo'"),
        (["--lengths", "0,256"], "--lengths: '0' is not an integer from 1 to"),
        (["--lengths", "99999999999999999999999"], "is not an integer from 1 to 2147483647"),
        (["--lengths", "12,abc"], "--lengths: 'abc'"),
        (["--dtype", "float8"], "--dtype 'float8'"),
        (["--direction", "sideways"], "--direction 'sideways'"),
        (["--param", "nonsense"], "--param 'nonsense' is not NAME=VALUE"),
        (["--param", "window=4"], "no selected mechanism has a parameter 'window'"),
        (["--suite", "nope"], "unknown suite 'nope'"),
    ],
)
def test_bad_options_exit_2_with_one_line(tmp_path, suite_file, args, words):
    cmd = ["run", "speed", "--suite", str(suite_file), "--out", str(tmp_path / "o"), *args]
    assert words in one_error_line(runner.invoke(app, cmd))
    assert not (tmp_path / "o").exists()  # nothing was started


def test_choice_options_match_the_library_and_are_listed_in_help():
    """The CLI's fixed choices (defined without torch) are the library's lists, and --help
    shows them."""
    from attnbench.bench import config, export, plot
    from attnbench.cli import check_cmd, speed_cmd
    from attnbench.cli import export as export_cli
    from attnbench.cli import plot as plot_cli
    from attnbench.runtime.engines import EXECUTORS

    assert speed_cmd.Device.values() == config.DEVICES
    assert speed_cmd.Dtype.values() == tuple(config.DTYPES)
    assert speed_cmd.Direction.values() == (*config.DIRECTIONS, "both")
    assert speed_cmd.Executor.values() == EXECUTORS
    assert plot_cli.FigureFormat.values() == plot.FORMATS
    assert export_cli.Target.values() == export.TARGETS
    assert all(hasattr(torch, d) for d in check_cmd.Dtype.values())
    text = runner.invoke(app, ["run", "speed", "--help"], env={"COLUMNS": "200"}).stdout
    for shown in ("<auto|cpu|cuda>", "<fwd|fwdbwd|both>", "<table|json>", "<local|ray>"):
        assert shown in text, text
    assert "<float32|float64|bfloat16|float16>" in text and "fp32, fp64, bf16, fp16" in text


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--format", "yaml"], "--format 'yaml': accepted: table, json"),
        (["--executor", "slurm"], "--executor 'slurm': accepted: local, ray"),
        (["--dtype", "float8"], "accepted: float32, fp32, float64, fp64, bfloat16, bf16"),
    ],
)
def test_a_bad_choice_is_one_line_before_anything_runs(tmp_path, args, words):
    cmd = ["run", "speed", "--out", str(tmp_path / "o"), *args]
    assert words in one_error_line(runner.invoke(app, cmd))
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_device_cuda_without_a_gpu_is_a_usage_error(tmp_path, suite_file):
    cmd = ["run", "speed", "--suite", str(suite_file), "--device", "cuda"]
    assert "no GPU" in one_error_line(runner.invoke(app, cmd))


def test_output_directory_problems_lose_nothing(tmp_path, suite_file):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cmd = ["run", "speed", "--suite", str(suite_file), "--out", str(blocker / "sub")]
    assert "which is a file" in one_error_line(runner.invoke(app, cmd))
    out = tmp_path / "done"
    out.mkdir()
    (out / "results.csv").write_text("precious")
    cmd = ["run", "speed", "--suite", str(suite_file), "--out", str(out)]
    assert "already holds results.csv" in one_error_line(runner.invoke(app, cmd))
    assert (out / "results.csv").read_text() == "precious"


def test_ctrl_c_exits_130_and_lists_what_was_not_run(tmp_path, suite_file, monkeypatch):
    def stop(q, k, v, *, causal):
        if q.shape[2] == 32:
            raise KeyboardInterrupt
        return softmax.sdpa(q, k, v, causal=causal)

    stopper = replace(
        softmax.MECHANISM,
        name="stopper",
        aliases=(),
        paths=(
            softmax.MECHANISM.reference,
            PathSpec("efficient", "efficient", stop, memory="O(n)"),
        ),
    )
    monkeypatch.setattr(registry, "MECHANISMS", (*registry.MECHANISMS, stopper))
    out = tmp_path / "out"
    cmd = ["run", "speed", "--suite", str(suite_file), "--out", str(out), "--impl", "stopper"]
    result = runner.invoke(app, cmd)
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.stderr and "not run:" in result.stderr
    df = read_results(out / "results.csv")
    assert set(df["seq_len"]) <= {16, 32} and (df[df["seq_len"] == 16]["status"] == "ok").all()


@pytest.fixture(scope="module")
def mixed_results(tmp_path_factory):
    """A small run with ok, oom, skipped and unsupported rows."""
    from attnbench.bench.config import SpeedSuite
    from attnbench.bench.run import run_speed
    from attnbench.measure.timing import TimingPolicy

    def greedy(q, k, v, *, causal):
        if q.shape[2] >= 32:
            raise torch.OutOfMemoryError("out of memory (test double)")
        return softmax.sdpa(q, k, v, causal=causal)

    never = Requirement("gpu", lambda device, backward: "needs CUDA (test double)")
    paths = (
        softmax.MECHANISM.reference,
        PathSpec("efficient", "efficient", greedy, memory="O(n)"),
        PathSpec("fused", "fused", softmax.sdpa, memory="O(n)", requires=(never,)),
    )
    odd = replace(softmax.MECHANISM, name="odd", family="other", aliases=(), paths=paths)
    suite = SpeedSuite(
        name="mixed",
        device="cpu",
        lengths=(16, 32, 64),
        heads=2,
        head_dims=(8,),
        causal=(False,),
        threads=1,
        timing=TimingPolicy(1, 0.0, 2, 2, 0.0, 1.0),
        matmul_size=32,
    )
    out = tmp_path_factory.mktemp("mixed")
    run_speed(suite, out, mechanisms=[softmax.MECHANISM, registry.get("flash-tiled"), odd])
    return out / "results.csv"


def test_plot_writes_time_and_memory_per_direction_with_every_status(tmp_path, mixed_results):
    df = read_results(mixed_results)
    assert set(df["status"]) == {"ok", "oom", "skipped", "unsupported"}
    out = tmp_path / "png"
    result = runner.invoke(app, ["plot", str(mixed_results), "--out", str(out)])
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "headline.png",
        "memory-fwd-bidir.png",
        "memory-fwdbwd-bidir.png",
        "time-fwd-bidir.png",
        "time-fwdbwd-bidir.png",
    ]
    assert all((out / f).stat().st_size > 10_000 for f in files)
    # SVG (each text is also written as a comment): one direction is enough to read it.
    fwd = tmp_path / "fwd.csv"
    writer = ResultsWriter(fwd)
    for row in csv.DictReader(mixed_results.open(newline="")):
        if row["direction"] == "fwd":
            writer.write(row)
    writer.close()
    cmd = ["plot", str(fwd), "--out", str(tmp_path / "svg"), "--format", "svg"]
    assert runner.invoke(app, cmd).exit_code == 0
    svg = " ".join((tmp_path / "svg" / "time-fwd-bidir.svg").read_text().split())
    # The oom ends odd:efficient's line with a marker the key names; the fused path that ran
    # nowhere is one line at the foot of its panel, with the reason.
    assert "stops: out of memory" in svg and "stops: unsupported" not in svg
    assert "not run: 1 fused path unsupported: needs CUDA (test double)" in svg
    assert "softmax:efficient (dense SDPA), every panel" in svg


def test_plot_bad_input_exits_2(tmp_path, mixed_results):
    bogus = tmp_path / "x.csv"
    bogus.write_text("a,b\n1,2\n")
    assert "not an attnbench" in one_error_line(runner.invoke(app, ["plot", str(bogus)]))
    cmd = ["plot", str(mixed_results), "--format", "jpg", "--out", str(tmp_path)]
    assert "--format 'jpg'" in one_error_line(runner.invoke(app, cmd))


@pytest.mark.parametrize("cmd", [["run", "speed"], ["plot"], ["compare"]])
def test_every_command_help_shows_an_example(cmd):
    result = runner.invoke(app, [*cmd, "--help"])
    assert result.exit_code == 0 and "Example: attnbench" in result.stdout
