"""The roofline's matmul is sized by time (issue 35: 2048^3 in float16 on a CPU took minutes a
call): the largest size up to ``matmul_size`` whose call stays under ``timing.matmul_max_s``,
recorded in the sidecar and the summary."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.measure.flops import MatmulAnchor, anchor_sizes, sized_anchor
from attnbench.measure.timing import Clock
from tests.helpers.speed import tiny_suite_file

runner = CliRunner()


class CubicClock(Clock):
    """A CPU clock whose matmul calls take ``seconds_at_1024 * (size / 1024)^3`` (the first
    call of each anchor ``first_extra`` more, as a cold start would), and that counts them."""

    def __init__(self, seconds_at_1024: float, first_extra: float = 0.0) -> None:
        super().__init__("cpu")
        self.seconds, self.first_extra = seconds_at_1024, first_extra
        self.calls: list[int] = []

    def time_block(self, fn, calls: int) -> float:
        assert isinstance(fn, MatmulAnchor) and calls == 1
        extra = self.first_extra if fn.size not in self.calls else 0.0
        self.calls.append(fn.size)
        return self.seconds * (fn.size / 1024) ** 3 + extra


def size_for(clock: Clock, max_size: int = 2048, max_call_s: float = 1.0) -> int:
    return sized_anchor(torch.device("cpu"), torch.float32, max_size, max_call_s, clock).size


def test_sizes_are_powers_of_two_then_the_suites_size():
    assert anchor_sizes(512) == [64, 128, 256, 512]
    assert anchor_sizes(3000) == [64, 128, 256, 512, 1024, 2048, 3000]
    assert anchor_sizes(32) == [32]


def test_a_fast_device_keeps_the_suites_size():
    assert size_for(CubicClock(0.01)) == 2048  # 2048^3: 0.08 s a call


def test_a_slow_dtype_gets_the_largest_size_under_the_limit():
    clock = CubicClock(6.0)  # float16 on a CPU: 1024^3 takes 6 s
    assert size_for(clock) == 512  # 0.75 s; 1024^3 predicted at 6 s is never called
    assert 1024 not in clock.calls and 2048 not in clock.calls


def test_a_bigger_size_that_turns_out_too_slow_is_not_kept():
    """The prediction (x8 per doubling) may be wrong; the measured call decides."""

    class SteepClock(CubicClock):
        def time_block(self, fn, calls):
            t = super().time_block(fn, calls)
            return t * 40 if fn.size >= 1024 else t  # fp16 on a CPU: 1024^3 is 31x 512^3

    assert size_for(SteepClock(0.5)) == 512


def test_a_cold_first_call_does_not_stop_the_growth():
    """The first call of an anchor may pay cuBLAS start-up: the second one is what counts."""
    assert size_for(CubicClock(0.01, first_extra=0.3)) == 2048


def test_the_smallest_size_when_none_fits_and_the_suites_size_without_a_limit():
    assert size_for(CubicClock(1e6), max_call_s=1.0) == 64
    clock = CubicClock(1e6)
    assert size_for(clock, max_size=96, max_call_s=0) == 96 and clock.calls == []


#: The tiny suite (tests/fixtures) in float16, forward, one length, with a 4096^3 matmul anchor
#: and a time limit for it.
FLOAT16_MATMUL_4096 = dict(
    top={"name": "tiny16"},
    grid={"mechanisms": ["softmax:efficient"], "path_kinds": None, "dtypes": ["float16"],
          "directions": ["fwd"], "causal": [False], "lengths": [32], "reference": ""},
    timing={"matmul_size": 4096, "matmul_max_s": 0.05},
)  # fmt: skip


def test_the_run_times_and_records_the_sized_matmul(tmp_path):
    """A 4096^3 float16 matmul would take many minutes a call on a CPU: the run keeps a size
    whose call fits the limit, and the sidecar and the summary say which."""
    suite = tiny_suite_file(tmp_path, "tiny16.toml", **FLOAT16_MATMUL_4096)
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["run", "speed", "--suite", str(suite), "--out", str(out), "--no-plot"]
    )
    assert result.exit_code == 0, result.output
    cal = json.loads((out / "results.json").read_text())["calibration"]["float16"]
    assert cal["matmul_size_max"] == 4096 and 64 <= cal["matmul_size"] <= 512, cal
    flat = result.stdout.replace("\n", "")  # rich wraps long lines (a long tmp path) anywhere
    assert f"matmul {cal['matmul_size']}^3 float16" in flat
    assert "sized down from 4096^3 by timing.matmul_max_s" in flat
    assert "sizing the float16 matmul (up to 4096^3, a call at most 0.05 s)" in result.stderr


def test_the_summary_line_names_the_sizes_kept():
    from attnbench.cli.speed_report import matmul_shape

    assert matmul_shape({"matmul_size": 2048, "matmul_size_max": 2048}) == ("2048^3", "")
    shape, note = matmul_shape({"matmul_size": [256, 512], "matmul_size_max": 512})
    assert shape == "256^3/512^3" and note == "; sized down from 512^3 by timing.matmul_max_s"


def test_a_merge_records_the_sizes_its_units_kept(tmp_path):
    """Each unit sizes its matmul in its own process: the merged calibration says which sizes
    the units kept (one number when they agree), from the units' sidecars."""
    import pandas as pd

    from attnbench.bench.merge import _anchor_sizes, _calibration

    taken = {}
    for unit, size in (("a", 512), ("b", 256), ("c", 512)):
        folder = tmp_path / unit
        folder.mkdir()
        cal = {"float16": {"matmul_size": size, "matmul_size_max": 2048}}
        (folder / "results.json").write_text(json.dumps({"calibration": cal}))
        taken[unit] = (folder, {"status": "ok"})
    assert _anchor_sizes(taken) == {"float16": [256, 512]}
    df = pd.DataFrame(
        {"status": ["ok", "ok"], "dtype": ["float16"] * 2, "matmul_flop_per_s": [1e9, 2e9]}
    )
    doc = {"suite": {"matmul_size": 2048}}
    merged = _calibration(df, doc, {"float16": [256, 512]})["torch.float16"]
    assert merged["matmul_size"] == [256, 512] and merged["matmul_size_max"] == 2048
    assert _calibration(df, doc, {"float16": [512]})["torch.float16"]["matmul_size"] == 512
