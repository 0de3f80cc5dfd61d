"""The join of ``attnbench report`` on tiny synthetic CSVs: the accuracy interval over seeds
(float64, against closed forms of Student's t), the division per token, the Pareto front, the
shape-mismatch lines, the not-joined list and the floors."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from attnbench.core.errors import AttnbenchError
from attnbench.costreport.join import accuracy_interval, build_report, pareto_flags
from attnbench.costreport.tables import read_extrapolation, read_speed
from tests.helpers.costreport import speed_row, table_row, write_extrapolation, write_speed


def t_quantile_975(df: int) -> float:
    """Student's t at 0.975 in closed form: df 1 is Cauchy, tan(pi (p - 1/2)); df 2 is
    (2p - 1) / sqrt(2 p (1 - p))."""
    p = 0.975
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    raise ValueError(df)


@pytest.mark.parametrize("values", [[61.25, 63.5], [60.1, 62.3, 61.7]])
def test_the_interval_is_the_students_t_interval_of_the_mean(values):
    got = accuracy_interval(values)
    mean, sd, k = statistics.fmean(values), statistics.stdev(values), len(values)
    half = t_quantile_975(k - 1) * sd / math.sqrt(k)
    assert got.seeds == k
    assert got.mean == pytest.approx(mean, rel=1e-14)
    assert got.low == pytest.approx(mean - half, rel=1e-12)
    assert got.high == pytest.approx(mean + half, rel=1e-12)


def test_eight_seeds_use_the_tabulated_t_of_seven_degrees():
    values = [62.9, 62.4, 63.1, 62.7, 62.2, 63.3, 62.8, 62.6]
    got = accuracy_interval(values)
    half = (got.high - got.low) / 2
    assert half / (statistics.stdev(values) / math.sqrt(8)) == pytest.approx(2.365, abs=5e-4)


def test_one_seed_and_a_count_row_have_no_interval():
    one, count = accuracy_interval([50.0]), accuracy_interval([54.5], seeded=False)
    assert (one.mean, one.seeds, math.isnan(one.low), math.isnan(one.high)) == (50, 1, True, True)
    assert (count.mean, count.seeds, math.isnan(count.low)) == (54.5, 0, True)
    assert count.text() == "54.50"


def front_by_sweep(times, accs) -> list[bool]:
    """The Pareto front the other way: fastest first, a point is on it when it is more
    accurate than every faster one (distinct times and accuracies)."""
    order = sorted(range(len(times)), key=lambda i: times[i])
    best, flags = -math.inf, [False] * len(times)
    for i in order:
        if accs[i] > best:
            flags[i], best = True, accs[i]
    return flags


def test_the_pareto_front_matches_a_sweep():
    rng = random.Random(7)
    for _ in range(50):
        times = rng.sample(range(1, 1000), 12)
        accs = [rng.random() * 100 for _ in times]
        assert pareto_flags(times, accs) == front_by_sweep(times, accs)


def test_equal_points_are_both_on_the_front_and_a_tie_in_time_keeps_the_better():
    assert pareto_flags([1.0, 1.0, 1.0, 2.0], [5.0, 5.0, 4.0, 6.0]) == [True, True, False, True]


# --------------------------------------------------------------------------------------------
# The join on synthetic folders
# --------------------------------------------------------------------------------------------

O_ACC = {64: [60.0, 62.0, 61.0], 128: [50.0, 52.0, 57.0]}


def extrapolation_rows() -> list[dict]:
    rows = []
    for n, values in O_ACC.items():
        for seed, acc in enumerate(values):
            rows.append(table_row("O", n, acc, seed))
            rows.append(table_row("O+rerope", n, acc + 5, seed))
            rows.append(table_row("O+local", n, acc + 1, seed))
            rows.append(table_row("O+nosuch", n, acc, seed))
        rows.append(table_row("E", n, 55.0, 0, mechanism="softmax-logn", params='{"base": 512}'))
        rows.append(table_row("count-baseline", n, 54.0 + n / 64, seed=None, kind="baseline"))
    rows[-2].update(status="error", accuracy="", reason="diverged")  # E at n = 128 failed
    return rows


def speed_rows(**shape) -> list[dict]:
    return [
        speed_row("softmax", "efficient", 64, batch=2, time_median_ms=1.28,
                  mem_fwd_bytes=256_000, **shape),
        speed_row("softmax", "efficient", 128, time_median_ms=2.56, mem_fwd_bytes=128_000,
                  **shape),
        speed_row("softmax", "reference", 64, time_median_ms=2.0, mem_fwd_bytes=64_000, **shape),
        speed_row("softmax", "reference", 128, status="oom", reason="out of memory at 1 GiB",
                  time_median_ms=None, **shape),
        speed_row("softmax", "efficient", 64, direction="fwdbwd", time_median_ms=9.0,
                  mem_fwdbwd_bytes=640_000, **shape),
    ]  # fmt: skip


def joined(tmp_path, speed=None, direction="fwd", rows=None, **eval_config):
    ex = read_extrapolation(
        write_extrapolation(tmp_path / "ex", rows or extrapolation_rows(), **eval_config)
    )
    sp = read_speed(write_speed(tmp_path / "sp", speed if speed is not None else speed_rows()))
    return build_report(ex, sp, direction)


def test_time_and_memory_are_divided_by_batch_times_n(tmp_path):
    report = joined(tmp_path)
    by = {(p.variant, p.eval_len): p for p in report.points}
    assert sorted(by) == [("E", 64), ("O", 64), ("O", 128), ("O+rerope", 64)]
    o64, o128, rerope = by["O", 64], by["O", 128], by["O+rerope", 64]
    assert o64.time_per_token_ns == pytest.approx(1.28e6 / (2 * 64), rel=1e-12)
    assert o64.memory_per_token_bytes == pytest.approx(256_000 / (2 * 64), rel=1e-12)
    assert o128.time_per_token_ns == pytest.approx(2.56e6 / 128, rel=1e-12)
    assert rerope.time_per_token_ns == pytest.approx(2 * 2.0e6 / 64, rel=1e-12)  # x 2: ReRoPE
    assert rerope.memory_per_token_bytes == pytest.approx(64_000 / 64, rel=1e-12)
    assert o64.measured["time_ms"] == 1.28 and o64.measured["batch"] == 2


def test_accuracy_of_a_point_is_over_its_seeds(tmp_path):
    o128 = next(p for p in joined(tmp_path).points if (p.variant, p.eval_len) == ("O", 128))
    assert o128.accuracy == accuracy_interval(O_ACC[128])


def test_rows_that_cannot_be_joined_are_listed_with_why(tmp_path):
    left = {(x.variant, x.eval_len): x.reason for x in joined(tmp_path).not_joined}
    assert left == {
        ("O+rerope", 128): "softmax:reference (no parameters) on Test CPU did not run: oom "
        "(out of memory at 1 GiB)",
        ("O+local", 64): "the speed CSV has no bidirectional local:efficient (window=32) case "
        "on Test CPU",
        ("O+local", 128): "the speed CSV has no bidirectional local:efficient (window=32) case "
        "on Test CPU",
        ("O+nosuch", None): "no mapping entry for the evaluation-time trick 'nosuch'",
        ("E", 128): "no accuracy: error (diverged)",
    }


def test_the_local_window_is_the_runs(tmp_path):
    report = joined(tmp_path, local_window=8)
    assert report.costs["O+local"].params == "window=8"


def test_count_rows_are_floors_not_points(tmp_path):
    report = joined(tmp_path)
    assert [(f.variant, f.eval_len, f.accuracy.mean) for f in report.floors] == [
        ("count-baseline", 64, 55.0),
        ("count-baseline", 128, 56.0),
    ]
    assert all(p.kind != "baseline" for p in report.points)


def test_the_front_is_per_length(tmp_path):
    front = {(p.variant, p.eval_len) for p in joined(tmp_path).points if p.pareto}
    # n = 64: O and E share the cheapest cost, O is more accurate; O+rerope is slower, better.
    assert front == {("O", 64), ("O+rerope", 64), ("O", 128)}


def test_a_case_at_another_shape_is_said_once_per_mismatch(tmp_path):
    report = joined(tmp_path, speed=speed_rows(heads=4, kv_heads=4, head_dim=32, value_dim=32))
    assert report.mismatches == (
        "softmax:efficient was measured at heads 4, head dim 32, float32; the model's layer "
        "runs heads 2, head dim 64, float32 (rows: O, E)",
        "softmax:reference was measured at heads 4, head dim 32, float32; the model's layer "
        "runs heads 2, head dim 64, float32 (rows: O+rerope)",
    )


def test_the_case_at_the_models_shape_is_preferred(tmp_path):
    other = speed_row("softmax", "efficient", 64, heads=4, head_dim=32, time_median_ms=99.0)
    report = joined(tmp_path, speed=[other, *speed_rows()])
    o64 = next(p for p in report.points if (p.variant, p.eval_len) == ("O", 64))
    assert o64.measured["time_ms"] == 1.28 and report.mismatches == ()


def test_fwdbwd_prices_with_forward_and_backward(tmp_path):
    report = joined(tmp_path, direction="fwdbwd")
    o64 = next(p for p in report.points if (p.variant, p.eval_len) == ("O", 64))
    assert o64.time_per_token_ns == pytest.approx(9.0e6 / 64, rel=1e-12)
    assert o64.memory_per_token_bytes == pytest.approx(640_000 / 64, rel=1e-12)


def test_a_direction_the_csv_lacks_is_an_error(tmp_path):
    speed = [r for r in speed_rows() if r["direction"] == "fwd"]
    with pytest.raises(AttnbenchError, match="no bidirectional fwdbwd case .* directions: fwd"):
        joined(tmp_path, speed=speed, direction="fwdbwd")


def test_hwfa_is_the_mean_over_layers_of_local_and_full_attention(tmp_path):
    rows = [table_row("O+hwfa", 64, 60.0, seed) for seed in range(2)]
    speed = [
        speed_row("local", "efficient", 64, params="window=32", time_median_ms=3.0,
                  mem_fwd_bytes=5_000),
        speed_row("softmax", "efficient", 64, time_median_ms=1.0, mem_fwd_bytes=9_000),
    ]  # fmt: skip
    (point,) = joined(tmp_path, speed=speed, rows=rows).points
    layers = 2  # the helper's model
    assert point.time_per_token_ns == pytest.approx(((layers - 1) * 3.0e6 + 1.0e6) / 2 / 64)
    assert point.memory_per_token_bytes == pytest.approx(9_000 / 64)


def test_a_model_with_d_head_is_costed_at_that_head_size(tmp_path):
    """A run with ``model.d_head`` (heads of 32 in width 128, four of them) is priced at 4 heads of
    32, not at d_model / heads; a sidecar from before the option reads as d_model / heads."""
    import json

    folder = write_extrapolation(tmp_path / "ex", extrapolation_rows())
    side = folder / "extrapolate.json"
    assert read_extrapolation(folder).model.head_dim == 64  # MODEL: 2 heads in width 128
    data = json.loads(side.read_text())
    data["config"]["model"] |= {"heads": 4, "d_head": 32}
    side.write_text(json.dumps(data))
    model = read_extrapolation(folder).model
    assert (model.heads, model.head_dim) == (4, 32)
    sp = read_speed(write_speed(tmp_path / "sp", speed_rows(heads=4, kv_heads=4, head_dim=32,
                                                            value_dim=32)))  # fmt: skip
    assert build_report(read_extrapolation(folder), sp, "fwd").mismatches == ()
