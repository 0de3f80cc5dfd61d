"""Speed results as the JSON that continuous-benchmarking dashboards read.

Two targets, one entry per ``ok`` row of a results CSV and per metric:

- ``github-benchmark``: github-action-benchmark's custom tools. The file is a JSON array of
  ``{"name": str, "unit": str, "value": number, "range": str?, "extra": str?}``; the action's
  ``tool`` input says the direction, ``customSmallerIsBetter`` (time, memory, ref-ratio) or
  ``customBiggerIsBetter`` (throughput, roofline, flop-rate), so one file holds metrics of one
  direction. https://github.com/benchmark-action/github-action-benchmark#examples (the custom
  tools' entries: ``name``, ``unit`` and ``value``, optional ``range`` and ``extra``) and
  https://github.com/benchmark-action/github-action-benchmark/blob/master/src/extract.ts
  (``BenchmarkResult``: name, value, unit, range?, extra?).
- ``bencher``: the Bencher Metric Format (BMF),
  ``{benchmark_name: {measure_slug: {"value": n, "lower_value": n?, "upper_value": n?}}}``,
  read by ``bencher run --adapter json``. https://bencher.dev/docs/reference/bencher-metric-format
  and https://bencher.dev/docs/how-to/track-custom-benchmarks. Time goes to Bencher's built-in
  ``latency`` measure, in nanoseconds (its unit), throughput to the built-in ``throughput``
  measure (tokens per second as its operations per second); the other metrics get their own slugs,
  which Bencher creates on first use.

Bounds: ``lower_value`` / ``upper_value`` (and github's ``range``) are the 20th and 80th
percentiles over the timed rounds where the CSV has them: ``time_p20_ms`` / ``time_p80_ms`` for
time, their reciprocals for throughput and FLOP rate (batch * n / p80 .. batch * n / p20), and
``ref_ratio_p20`` / ``ref_ratio_p80`` for the reference ratio. Memory and roofline have none.

A benchmark's name is built from the columns that identify a case (results.KEY), in a fixed order,
so the same case has the same name in every run: ``local:efficient(window=64) fwd causal n=1024
float32 B=1 H=4 D=32`` (``Hkv=`` / ``Dv=`` only where they differ from H / D). The machine is not
in the name: track one machine per github-action-benchmark ``name`` or per Bencher testbed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.bench.results import plain, read_results
from attnbench.core.errors import AttnbenchError, unknown

TARGETS = ("github-benchmark", "bencher")
GITHUB_TOOL = {False: "customSmallerIsBetter", True: "customBiggerIsBetter"}

Row = Mapping[str, Any]
Bounds = tuple[float, float]


@dataclass(frozen=True)
class Metric:
    """One number per ok row, how it is read from the row, and how dashboards should treat it."""

    name: str  # the --metric name
    unit: str  # github-action-benchmark's unit
    bigger_is_better: bool
    bencher_slug: str
    value: Callable[[Row], float | None]
    bounds: Callable[[Row], Bounds | None]
    bencher_scale: float = 1.0  # Bencher's unit over ours (latency: ns per ms)


def _number(row: Row, column: str) -> float | None:
    value = plain(row.get(column))
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _pair(row: Row, low: str, high: str) -> Bounds | None:
    lo, hi = _number(row, low), _number(row, high)
    return None if lo is None or hi is None else (lo, hi)


def _per_second(row: Row, work: float | None, time_column: str) -> float | None:
    """work / time, time in ms per call (tokens or FLOPs per second)."""
    ms = _number(row, time_column)
    return None if work is None or not ms else work * 1e3 / ms


def _tokens(row: Row) -> float | None:
    batch, n = _number(row, "batch"), _number(row, "seq_len")
    return None if batch is None or n is None else batch * n


def _rate_bounds(row: Row, work: float | None) -> Bounds | None:
    """A rate's p20..p80 from the time's: the slow rounds (p80) give the low rate."""
    lo, hi = _per_second(row, work, "time_p80_ms"), _per_second(row, work, "time_p20_ms")
    return None if lo is None or hi is None else (lo, hi)


def _memory(row: Row) -> float | None:
    column = "mem_fwdbwd_bytes" if row.get("direction") == "fwdbwd" else "mem_fwd_bytes"
    return _number(row, column)


def _flop_rate(name: str, unit: str, column: str) -> Metric:
    """A FLOP/s metric: the row's FLOP count in ``column`` over its median time (bounds: over
    its p80 and p20 times)."""
    return Metric(
        name,
        unit,
        True,
        name,
        lambda r: _per_second(r, _number(r, column), "time_median_ms"),
        lambda r: _rate_bounds(r, _number(r, column)),
    )


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "time",
            "ms",
            False,
            "latency",
            lambda r: _number(r, "time_median_ms"),
            lambda r: _pair(r, "time_p20_ms", "time_p80_ms"),
            bencher_scale=1e6,
        ),
        Metric(
            "throughput",
            "tokens/s",
            True,
            "throughput",
            lambda r: _per_second(r, _tokens(r), "time_median_ms"),
            lambda r: _rate_bounds(r, _tokens(r)),
        ),
        Metric("memory", "bytes", False, "peak-memory", _memory, lambda r: None),
        Metric(
            "roofline",
            "fraction of matmul FLOP/s",
            True,
            "roofline",
            lambda r: _number(r, "roofline"),
            lambda r: None,
        ),
        _flop_rate("flop-rate", "FLOP/s", "flops"),
        _flop_rate("flop-rate-fa", "FLOP/s (fwd+bwd = 3.5x fwd)", "flops_fa"),
        _flop_rate("flop-rate-executed", "executed FLOP/s (whole blocks)", "flops_executed"),
        Metric(
            "ref-ratio",
            "x reference time",
            False,
            "ref-ratio",
            lambda r: _number(r, "ref_ratio"),
            lambda r: _pair(r, "ref_ratio_p20", "ref_ratio_p80"),
        ),
    )
}


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------


def _int_text(row: Row, column: str) -> str:
    value = plain(row.get(column))
    return "" if value is None else str(int(value))


def case_impl(row: Row) -> str:
    """``local:efficient(window=64)``: the mechanism, its path and its parameters."""
    params = plain(row.get("params")) or ""
    return f"{row['mechanism']}:{row['path']}" + (f"({params})" if params else "")


def case_shape(row: Row) -> str:
    """``fwd causal n=1024 float32 B=1 H=4 D=32``: everything else that identifies the case."""
    causal = "causal" if plain(row.get("causal")) else "bidir"
    heads, kv = _int_text(row, "heads"), _int_text(row, "kv_heads")
    dim, value_dim = _int_text(row, "head_dim"), _int_text(row, "value_dim")
    parts = [
        str(row["direction"]),
        causal,
        f"n={_int_text(row, 'seq_len')}",
        str(row["dtype"]),
        f"B={_int_text(row, 'batch')}",
        f"H={heads}",
    ]
    if kv and kv != heads:
        parts.append(f"Hkv={kv}")
    parts.append(f"D={dim}")
    if value_dim and value_dim != dim:
        parts.append(f"Dv={value_dim}")
    return " ".join(parts) + inference_tag(row)


def inference_tag(row: Row) -> str:
    """`` q=1`` for a decode case, `` lengths=700+300 packed`` for a packed batch; "" else."""
    query_len, varlen = _int_text(row, "query_len"), plain(row.get("varlen"))
    tag = f" q={query_len}" if query_len else ""
    if varlen:
        tag += f" lengths={varlen} {plain(row.get('packing')) or ''}".rstrip()
    return tag


def benchmark_name(row: Row) -> str:
    """A stable, readable name for one case (the same in every run of the same grid)."""
    return f"{case_impl(row)} {case_shape(row)}"


# --------------------------------------------------------------------------------------------
# Rows and metrics
# --------------------------------------------------------------------------------------------


def parse_metrics(names: Sequence[str]) -> list[Metric]:
    """``["time", "memory,throughput"]`` -> the metrics, in order, without repeats."""
    wanted = [n.strip() for item in names for n in item.split(",") if n.strip()]
    if not wanted:
        raise AttnbenchError(f"no --metric given; accepted: {', '.join(METRICS)}")
    for name in wanted:
        if name not in METRICS:
            raise unknown("metric", name, list(METRICS))
    return [METRICS[n] for n in dict.fromkeys(wanted)]


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise unknown("--to target", target, list(TARGETS))
    return target


def ok_rows(results: pd.DataFrame, source: str) -> list[dict[str, Any]]:
    """The ``ok`` rows as plain dicts, refusing a file with none or with one case twice."""
    rows = results[results["status"] == "ok"].to_dict("records")
    if not rows:
        statuses = ", ".join(f"{s} {n}" for s, n in results["status"].value_counts().items())
        raise AttnbenchError(
            f"{source}: no ok rows to export ({statuses or 'no rows'}); "
            "export a results CSV whose cases ran"
        )
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        name = benchmark_name(row)
        if name in seen:
            raise AttnbenchError(
                f"{source}: two ok rows for the case {name!r}; export one run at a time"
            )
        seen[name] = i
    return rows


def _digits(x: float) -> float:
    """Six significant digits, the precision of the CSV the numbers come from."""
    return float(f"{x:.6g}")


def _ordered(lo: float, value: float, hi: float) -> Bounds:
    """Bounds around the value (6-digit CSV rounding must never put the median outside them)."""
    return min(lo, value), max(hi, value)


def _check_direction(metrics: Sequence[Metric]) -> None:
    directions = {m.bigger_is_better for m in metrics}
    if len(directions) > 1:
        smaller = ", ".join(m.name for m in metrics if not m.bigger_is_better)
        bigger = ", ".join(m.name for m in metrics if m.bigger_is_better)
        raise AttnbenchError(
            f"github-benchmark takes one direction per file: {smaller} smaller-is-better, "
            f"{bigger} bigger-is-better; export them with two commands"
        )


def _check_has_values(rows: Sequence[Row], metrics: Sequence[Metric], source: str) -> None:
    for m in metrics:
        if all(m.value(r) is None for r in rows):
            raise AttnbenchError(
                f"{source}: no ok row has a value for metric {m.name!r}; "
                f"accepted metrics: {', '.join(METRICS)}"
            )


# --------------------------------------------------------------------------------------------
# The two formats
# --------------------------------------------------------------------------------------------


def _extra(row: Row, metric: Metric, bounds: Bounds | None) -> str:
    lines = []
    if bounds is not None:
        lines.append(
            f"p20 {bounds[0]:.4g}, p80 {bounds[1]:.4g} {metric.unit} "
            f"over {_int_text(row, 'samples') or '?'} rounds"
        )
    device = plain(row.get("device_name")) or plain(row.get("device")) or "?"
    threads = _int_text(row, "threads")
    lines.append(f"{device}, threads {threads or '?'}, torch {row.get('torch_version') or '?'}")
    lines.append(f"suite {row.get('suite') or '?'}, clock {row.get('clock') or '?'}")
    return "\n".join(lines)


def github_entry(row: Row, metric: Metric) -> dict[str, Any] | None:
    """One github-action-benchmark entry, or None when the row has no value for the metric."""
    value = metric.value(row)
    if value is None:
        return None
    entry: dict[str, Any] = {
        "name": f"{benchmark_name(row)} [{metric.name}]",
        "unit": metric.unit,
        "value": _digits(value),
    }
    bounds = metric.bounds(row)
    if bounds is not None:
        bounds = _ordered(bounds[0], value, bounds[1])
        entry["range"] = f"+/- {(bounds[1] - bounds[0]) / 2:.4g}"
    entry["extra"] = _extra(row, metric, bounds)
    return entry


def bencher_measure(row: Row, metric: Metric) -> dict[str, float] | None:
    """One BMF measure ``{value, lower_value?, upper_value?}`` in Bencher's unit, or None."""
    value = metric.value(row)
    if value is None:
        return None
    scale = metric.bencher_scale
    measure = {"value": _digits(value * scale)}
    bounds = metric.bounds(row)
    if bounds is not None:
        lo, hi = _ordered(bounds[0], value, bounds[1])
        measure["lower_value"] = _digits(lo * scale)
        measure["upper_value"] = _digits(hi * scale)
    return measure


def to_github_benchmark(rows: Sequence[Row], metrics: Sequence[Metric]) -> list[dict[str, Any]]:
    _check_direction(metrics)
    entries = (github_entry(r, m) for m in metrics for r in rows)
    return [e for e in entries if e is not None]


def to_bencher(rows: Sequence[Row], metrics: Sequence[Metric]) -> dict[str, dict[str, Any]]:
    report: dict[str, dict[str, Any]] = {}
    for row in rows:
        measures = {m.bencher_slug: bencher_measure(row, m) for m in metrics}
        kept = {slug: v for slug, v in measures.items() if v is not None}
        if kept:
            report[benchmark_name(row)] = kept
    return report


def github_tool(metrics: Sequence[Metric]) -> str:
    """The github-action-benchmark ``tool`` input for a file of these metrics."""
    _check_direction(metrics)
    return GITHUB_TOOL[metrics[0].bigger_is_better]


def export(
    results: Path | str | pd.DataFrame, target: str, metrics: Sequence[str] = ("time",)
) -> list[dict[str, Any]] | dict[str, dict[str, Any]]:
    """A results CSV (or the DataFrame ``read_results`` gives) as ``target``'s JSON document."""
    check_target(target)
    chosen = parse_metrics(metrics)
    if target == "github-benchmark":
        _check_direction(chosen)
    source = "results" if isinstance(results, pd.DataFrame) else str(results)
    frame = results if isinstance(results, pd.DataFrame) else read_results(results)
    rows = ok_rows(frame, source)
    _check_has_values(rows, chosen, source)
    if target == "github-benchmark":
        return to_github_benchmark(rows, chosen)
    return to_bencher(rows, chosen)


def export_text(
    results: Path | str | pd.DataFrame, target: str, metrics: Sequence[str] = ("time",)
) -> str:
    """:func:`export` as indented JSON text (strict JSON: no NaN)."""
    return json.dumps(export(results, target, metrics), indent=2, allow_nan=False) + "\n"
