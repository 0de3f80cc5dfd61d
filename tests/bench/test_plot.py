"""The speed figures: per-family panels with dense SDPA in each, stop markers, the headline's
numbers and ranking, and the figures (or none, or JSON) at the end of ``attnbench run speed``."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from typer.testing import CliRunner

from attnbench.bench import plot as plot_module
from attnbench.bench.figstyle import family_order, mechanism_colors
from attnbench.bench.headline import headline_figure, headline_key, headline_table
from attnbench.bench.panels import METRICS, REFERENCE_GID, STOP_OFFSET, family_figure, stop_points
from attnbench.bench.results import COLUMNS, read_results
from attnbench.cli import app
from tests.helpers.results import write_results
from tests.helpers.speed import tiny_suite_file

runner = CliRunner()

FAMILY = {"softmax": "softmax", "flash-tiled": "softmax", "local": "sparse", "linear": "linear"}
KIND = {"reference": "reference", "efficient": "efficient", "chunkwise": "efficient"}
KIND |= {"recurrent": "efficient", "sdpa-flash": "fused"}


def row(impl: str, n: int, status: str = "ok", ms: float | None = None, **values) -> dict:
    """A results row with every column: ``impl`` is NAME:PATH, forward, bidirectional."""
    mech, path = impl.split(":")
    out = {c: None for c in COLUMNS}
    out.update(
        suite="synthetic",
        mechanism=mech,
        family=FAMILY[mech],
        path=path,
        path_kind=KIND[path],
        params="",
        device="cpu",
        device_name="Test CPU",
        torch_version="2.0",
        threads=1,
        clock="process-cpu",
        dtype="float32",
        batch=1,
        heads=2,
        kv_heads=2,
        seq_len=n,
        head_dim=8,
        value_dim=8,
        causal=False,
        direction="fwd",
        status=status,
        reason="" if status == "ok" else f"{status} (test)",
        time_median_ms=ms,
    )
    out.update(values)
    return out


def ref(n: int, ms: float, mem: int) -> dict:
    return row("softmax:efficient", n, ms=ms, mem_fwd_bytes=mem)


@pytest.fixture
def synthetic(tmp_path):
    """Dense SDPA to n = 512; four efficient paths and one oracle in three families."""
    rows = [
        ref(256, 10.0, 1000),
        ref(512, 40.0, 4000),
        row("softmax:reference", 256, ms=12.0, mem_fwd_bytes=9000),
        # Same rounds as the reference: the speed-up is 1 / ref_ratio, not the time ratio.
        row("linear:chunkwise", 256, ms=4.0, mem_fwd_bytes=600),
        row(
            "linear:chunkwise",
            512,
            ms=9.0,
            reference="softmax:efficient",
            ref_ratio=0.25,
            mem_fwd_bytes=2000,
        ),  # fmt: skip
        # No ref_ratio: the ratio of the two times at its longest n (256; oom at 512).
        row("local:efficient", 256, ms=5.0, mem_fwd_bytes=3000),
        row("local:efficient", 512, status="oom"),
        row(
            "flash-tiled:efficient",
            512,
            ms=80.0,
            reference="softmax:efficient",
            ref_ratio=2.0,
            mem_fwd_bytes=8000,
        ),  # fmt: skip
        # Beyond the reference's longest n: compared at 512, the longest both reached.
        row("linear:recurrent", 512, ms=20.0, mem_fwd_bytes=1000),
        row("linear:recurrent", 1024, ms=40.0, mem_fwd_bytes=2000),
        row("softmax:sdpa-flash", 256, status="unsupported"),
    ]
    return write_results(tmp_path / "results.csv", rows)


def test_headline_numbers_and_ranking(synthetic):
    table = headline_table(read_results(synthetic))
    got = {r.impl: (r.n, round(r.speedup, 6), round(r.memory, 6)) for r in table.itertuples()}
    assert got == {
        "linear:chunkwise": (512, 4.0, 0.5),  # 1 / 0.25; 2000 / 4000
        "linear:recurrent": (512, 2.0, 0.25),  # 40 / 20 ms; 1000 / 4000
        "local:efficient": (256, 2.0, 3.0),  # 10 / 5 ms; 3000 / 1000
        "flash-tiled:efficient": (512, 0.5, 2.0),  # 1 / 2.0; 8000 / 4000
    }
    # Fastest first (ties keep registry order); the dense oracle and the fused path are not bars.
    assert list(table["impl"]) == [
        "linear:chunkwise",
        "local:efficient",
        "linear:recurrent",
        "flash-tiled:efficient",
    ]
    leanest = table.sort_values("memory")["impl"].tolist()
    assert leanest == [
        "linear:recurrent",
        "linear:chunkwise",
        "flash-tiled:efficient",
        "local:efficient",
    ]


def test_headline_figure_bars_are_the_table(synthetic):
    df = read_results(synthetic)
    assert headline_key(df) == ("fwd", False, "cpu", "float32", 8)
    fig, table = headline_figure(df)
    speed, memory = fig.axes[:2]
    top_down = sorted(speed.get_yticklabels(), key=lambda t: -t.get_position()[1])
    assert [t.get_text() for t in top_down] == list(table["impl"])  # the first row on top
    widths = sorted(1 + p.get_width() for p in speed.patches)
    assert np.allclose(widths, sorted(table["speedup"]))
    texts = {t.get_text() for t in memory.texts}
    assert {"0.50×", "0.25×", "3.0× @256", "2.0×"} <= texts  # @n: compared at another n
    assert "forward, bidirectional" in fig._suptitle.get_text()
    plt.close(fig)


def test_one_panel_per_family_with_dense_sdpa_in_each(synthetic):
    df = read_results(synthetic)
    fig = family_figure(df, METRICS["time"], mechanism_colors(df))
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title(loc="left") for ax in panels] == ["softmax", "sparse", "linear"]
    assert family_order(df) == ["softmax", "sparse", "linear"]
    for ax in panels:
        (grey,) = [line for line in ax.get_lines() if line.get_gid() == REFERENCE_GID]
        assert list(grey.get_xdata()) == [256, 512] and list(grey.get_ydata()) == [10.0, 40.0]
        assert ax.get_legend() is not None  # each panel names its own lines
    linear = panels[2]
    names = [t.get_text() for t in linear.get_legend().get_texts()]
    assert names == ["linear:chunkwise", "linear:recurrent"]  # two efficient paths, two entries
    plt.close(fig)


def test_a_stop_marker_sits_beside_the_last_measured_point():
    n = np.array([256.0, 512.0, 1024.0, 2048.0])
    y = np.array([1.0, 4.0, np.nan, np.nan])
    status = np.array(["ok", "ok", "oom", "skipped"])
    assert stop_points(n, y, status) == [(512 * STOP_OFFSET, 4.0, "oom")]
    late = stop_points(
        n, np.array([np.nan, 2.0, 8.0, 32.0]), np.array(["unsupported", "ok", "ok", "ok"])
    )
    assert late == [(512 / STOP_OFFSET, 2.0, "unsupported")]
    gap = stop_points(
        n, np.array([1.0, np.nan, 16.0, np.nan]), np.array(["ok", "error", "ok", "ok"])
    )
    assert gap == [(pytest.approx(512.0), pytest.approx(4.0), "error")]


def test_plot_writes_time_memory_and_headline(tmp_path, synthetic):
    result = runner.invoke(app, ["plot", str(synthetic), "--out", str(tmp_path / "f")])
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in (tmp_path / "f").iterdir())
    assert files == ["headline.png", "memory-fwd-bidir.png", "time-fwd-bidir.png"]


def test_plot_with_nothing_measured_is_one_line_and_exit_2(tmp_path):
    csv = write_results(tmp_path / "r.csv", [row("softmax:efficient", 64, status="unsupported")])
    result = runner.invoke(app, ["plot", str(csv), "--out", str(tmp_path / "f")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing was measured (1 unsupported)" in lines[0]
    assert not (tmp_path / "f").exists()


def run_speed(tmp_path, *extra):
    suite = tiny_suite_file(tmp_path, top={"name": None},
                            grid={"mechanisms": None, "path_kinds": None, "lengths": None,
                                  "causal": [False]},
                            timing={"rounds": 1, "min_rounds": 1})  # fmt: skip
    out = tmp_path / "out"
    cmd = ["run", "speed", "--suite", str(suite), "--out", str(out), "--impl", "softmax:efficient"]
    cmd += ["--impl", "linear:chunkwise", "--lengths", "64", "--direction", "fwd", *extra]
    return runner.invoke(app, cmd), out


def test_run_speed_draws_the_figures_into_its_out_dir(tmp_path):
    result, out = run_speed(tmp_path)
    assert result.exit_code == 0, result.output
    figures = sorted(p.name for p in (out / "figures").iterdir())
    assert figures == ["headline.png", "memory-fwd-bidir.png", "time-fwd-bidir.png"]
    assert f"figures: {out / 'figures'}/" in result.stdout.replace("\n", "")  # rich wraps paths


def test_run_speed_no_plot_draws_nothing(tmp_path):
    result, out = run_speed(tmp_path, "--no-plot")
    assert result.exit_code == 0, result.output
    assert (out / "results.csv").is_file() and not (out / "figures").exists()


def test_a_failing_figure_keeps_the_results_and_the_exit_code(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no fonts today")

    monkeypatch.setattr(plot_module, "plot_results", broken)
    result, out = run_speed(tmp_path)
    assert result.exit_code == 0, result.output
    assert "figures not drawn (RuntimeError: no fonts today)" in result.stderr
    assert len(read_results(out / "results.csv")) == 2


def test_run_speed_format_json_is_the_summary_on_stdout(tmp_path):
    result, out = run_speed(tmp_path, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # stdout holds the JSON alone; progress is on stderr
    assert "[1/2]" in result.stderr
    by_impl = {s["impl"]: s for s in data["summary"]}
    assert set(by_impl) == {"softmax:efficient", "linear:chunkwise"}
    chunkwise = by_impl["linear:chunkwise"]
    assert chunkwise["ok"] == 1 and chunkwise["cases"] == 1 and chunkwise["n"] == 64
    assert chunkwise["time_ms"] > 0 and chunkwise["ref_ratio"] > 0
    assert chunkwise["time_exponent"] is None  # one length: no slope
    assert data["counts"] == {"ok": 2}
    assert data["files"]["results"] == str(out / "results.csv")
    assert len(data["files"]["figures"]) == 3


def test_run_speed_bad_format_is_a_usage_error(tmp_path):
    result, out = run_speed(tmp_path, "--format", "yaml")
    assert result.exit_code == 2
    assert "--format 'yaml': accepted: table, json" in result.stderr
    assert not out.exists()


def test_plot_redraws_the_extrapolation_figure(tmp_path):
    """`attnbench plot extrapolate.csv` redraws its accuracy figure (the committed table's)."""
    import shutil

    from typer.testing import CliRunner

    from attnbench.cli import app

    source = Path(__file__).resolve().parents[2] / "results/extrapolate/cpu-families"
    for name in ("extrapolate.csv", "extrapolate.json"):
        shutil.copy(source / name, tmp_path / name)
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "extrapolate.csv")])
    assert result.exit_code == 0, result.output
    figure = tmp_path / "accuracy_vs_length.png"
    assert figure.is_file() and figure.stat().st_size > 10_000
