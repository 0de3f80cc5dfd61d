"""Synthetic results of ``attnbench run speed``: rows, results CSVs, runs with per-round samples.
For the tests of compare, export, plot and the speed gate; synthetic data only."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from attnbench.bench.results import (
    COLUMNS,
    SAMPLES_NAME,
    CaseSamples,
    ResultsWriter,
    SamplesWriter,
)
from attnbench.measure.timing import stats


def row(**over) -> dict:
    """One ok row of a plausible CPU run; ``over`` changes any column."""
    r = {c: None for c in COLUMNS}
    r.update(
        suite="ci",
        mechanism="local",
        family="sparse",
        path="efficient",
        path_kind="efficient",
        params="window=64",
        device="cpu",
        device_name="Test CPU",
        torch_version="2.13.0+cpu",
        threads=1,
        clock="process-cpu",
        dtype="float32",
        batch=1,
        heads=4,
        kv_heads=4,
        seq_len=1024,
        head_dim=32,
        value_dim=32,
        causal=False,
        direction="fwd",
        status="ok",
        reason="",
        time_median_ms=2.0,
        time_p20_ms=1.9,
        time_p80_ms=2.1,
        samples=9,
        calls_per_sample=3,
        first_call_ms=3.0,
        noisy=False,
        reference="softmax:efficient",
        ref_ratio=0.50,
        ref_ratio_p20=0.48,
        ref_ratio_p80=0.52,
        tokens_per_s=512000.0,
        flops=1_000_000,
        flops_method="pairs",
        flop_per_s=5e8,
        matmul_flop_per_s=5e10,
        roofline=0.01,
        mem_fwd_bytes=1_000_000,
        mem_fwdbwd_bytes=3_000_000,
        mem_method="dispatch-live-bytes",
    )
    r.update(over)
    return r


def reference_row(**over) -> dict:
    """``row`` for the reference (softmax, ratio 1)."""
    base = dict(mechanism="softmax", family="softmax", params="", ref_ratio=1.0)
    base.update(ref_ratio_p20=1.0, ref_ratio_p80=1.0, time_median_ms=4.0)
    return row(**{**base, **over})


def result_row(mechanism="softmax", path="efficient", n=256, direction="fwd", **over):
    """One results row as run speed writes it (times in ms, p20 <= median <= p80)."""
    median = over.pop("median", 2.0 if direction == "fwd" else 6.0)
    row = dict(
        suite="tiny", mechanism=mechanism, family=over.pop("family", "softmax"), path=path,
        path_kind="efficient", params="", device="cpu", device_name="Test CPU",
        torch_version="2.5", threads=1, clock="wall", dtype="float32", batch=1, heads=4,
        kv_heads=4, seq_len=n, head_dim=32, value_dim=32, causal=False, direction=direction,
        status="ok", reason="", time_median_ms=median, time_p20_ms=median * 0.9,
        time_p80_ms=median * 1.2, samples=5, calls_per_sample=3, first_call_ms=median * 4,
        noisy=True, reference="softmax:efficient", ref_ratio=1.1, ref_ratio_p20=1.0,
        ref_ratio_p80=1.3, tokens_per_s=n / (median / 1e3), flops=4 * n * n * 32 * 4,
        flops_method="pairs", flop_per_s=1e9, matmul_flop_per_s=5e10, roofline=0.02,
        mem_fwd_bytes=1000 * n, mem_fwdbwd_bytes=3000 * n if direction == "fwdbwd" else None,
        mem_method="dispatch-live-bytes",
    )  # fmt: skip
    row.update(over)
    return row


def write_results(path, rows):
    """A results CSV of ``rows`` as run speed writes it (ResultsWriter); returns ``path``."""
    writer = ResultsWriter(path)
    for row in rows:
        writer.write(row)
    writer.close()
    return path


def sampled_row(ratios: list[float], **over) -> tuple[dict, CaseSamples]:
    """An ok row whose ref_ratio statistics come from ``ratios`` (per round), and its samples."""
    s = stats(ratios)
    r = row(ref_ratio=s.median, ref_ratio_p20=s.p20, ref_ratio_p80=s.p80, samples=len(ratios))
    r.update(over)
    times = [x * 4.0 for x in ratios]
    return r, CaseSamples(tuple(times), tuple(ratios), tuple(x / 10 for x in times))


def sampled_reference(rounds: int, **over) -> tuple[dict, CaseSamples]:
    """The reference's row (ratio 1 in every round) and its samples."""
    r = reference_row(samples=rounds, **over)
    return r, CaseSamples((4.0,) * rounds, (1.0,) * rounds, (0.4,) * rounds)


def write_run(path: Path, cases: list[tuple[dict, CaseSamples]], samples: bool = True) -> Path:
    """results.csv (+ samples.jsonl, named in the sidecar) in the folder ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    csv_path = path / "results.csv"
    rows, kept = ResultsWriter(csv_path), SamplesWriter(path / SAMPLES_NAME)
    for r, s in cases:
        rows.write(r)
        if samples:
            kept.write(r, s)
    rows.close()
    kept.close()
    files = {"rows": "results.csv", **({"samples": SAMPLES_NAME} if samples else {})}
    (path / "results.json").write_text(json.dumps({"files": files, "git": {"sha": "c" * 40}}))
    return csv_path


#: The mechanisms of ``grid`` (besides the reference).
GRID_MECHANISMS = ("local", "strided", "gqa", "flash-tiled", "aft-full", "gau", "linear", "fixed")


def grid(rng, shift: dict[str, float] | None = None, rounds: int = 9, **over) -> list:
    """Eight mechanisms x two lengths x two directions, each a lognormal scatter of per-round
    ratios (5 % within the run) around a level that moves 3 % between runs; ``shift``
    multiplies a mechanism's ratios (a slowdown)."""
    cases = [
        sampled_reference(rounds, **over),
        sampled_reference(rounds, direction="fwdbwd", **over),
    ]
    for i, mech in enumerate(GRID_MECHANISMS):
        for n in (256, 1024):
            for direction in ("fwd", "fwdbwd"):
                level = (0.5 + 0.2 * i) * math.exp(rng.normal(0, 0.03))
                level *= (shift or {}).get(mech, 1.0)
                ratios = list(level * np.exp(rng.normal(0, 0.05, rounds)))
                cases.append(sampled_row(ratios, mechanism=mech, params="", seq_len=n,
                                         direction=direction, **over))  # fmt: skip
    return cases
