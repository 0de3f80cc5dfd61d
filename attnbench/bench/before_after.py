"""Before and after a change, read from the gate's runs of two revisions (``attnbench gate --base
REV``): the base's runs and the current code's, made alternately on one machine in one sitting.

A time measured in one process is not compared with one measured in another. Each row is read
through what its own run measured in the same rounds:

* ``matmul``: the case's time in units of the float32 matmul anchor of its rounds (time x the
  anchor's FLOP/s), the speed suite's roofline without the case's FLOP count; the fraction of the
  matmul rate is the current code's FLOPs over that, for both sides, so that a changed FLOP
  convention cannot move the "before" column;
* ``ref_ratio``: the case's time over the suite's reference (dense SDPA) in the same rounds;
* a peer (``PATH=PEER``): PEER's time over PATH's in the same run (the same case and rounds).

Each column is the median over the runs of one side; ``after / before`` is the ratio of the two
sides' medians of the normalised time (above 1: the current code is faster).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from attnbench.runtime.outputs import write_text

#: What makes two rows of one run the same case (with the path).
CASE = ["direction", "causal", "seq_len", "dtype"]
MEASURES = ("matmul_fraction", "vs_sdpa", "vs_peer")
NAME = "before-after"


def side_rows(runs: Sequence[Path], peers: Mapping[str, str]) -> pd.DataFrame:
    """One row per measured case and run of one side (each run's ``results.csv``), with its
    normalised time and, for a PATH of ``peers``, the peer's time over its own in the same run."""
    frames = []
    for k, run in enumerate(runs):
        df = pd.read_csv(run)
        df = df[df["status"] == "ok"].copy()
        df["run"] = k
        df["impl"] = df["mechanism"] + ":" + df["path"]
        df["matmul_units"] = df["time_median_ms"] * 1e-3 * df["matmul_flop_per_s"]
        df["peer_ratio"] = float("nan")
        times = df.set_index(["impl", *CASE])["time_median_ms"]
        for path, peer in peers.items():
            mine = df["impl"] == path
            cases = df.loc[mine, CASE].itertuples(index=False)
            for i, case in zip(df.index[mine], cases, strict=True):
                theirs = times.get((peer, *case))
                if theirs is not None:
                    df.loc[i, "peer_ratio"] = theirs / df.loc[i, "time_median_ms"]
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def table(
    base_runs: Sequence[Path], current_runs: Sequence[Path], peers: Mapping[str, str]
) -> pd.DataFrame:
    """One row per case measured on both sides: medians over each side's runs."""
    cols = ["matmul_units", "ref_ratio", "peer_ratio"]
    sides, flops = {}, None
    for name, runs in (("before", base_runs), ("after", current_runs)):
        grouped = side_rows(runs, peers).groupby(["impl", *CASE])
        sides[name] = grouped[cols].median()
        flops = grouped["flops"].first()  # the current code's count (the last side read)
    out = sides["before"].merge(sides["after"], left_index=True, right_index=True,
                                suffixes=("_before", "_after"))  # fmt: skip
    out = out.join(flops)
    for side in ("before", "after"):
        out[f"matmul_fraction_{side}"] = out["flops"] / out[f"matmul_units_{side}"]
        out[f"vs_sdpa_{side}"] = 1 / out[f"ref_ratio_{side}"]
        out[f"vs_peer_{side}"] = out[f"peer_ratio_{side}"]
    out["after_over_before"] = out["matmul_units_before"] / out["matmul_units_after"]
    keep = [f"{m}_{s}" for m in MEASURES for s in ("before", "after")]
    return out[[*keep, "after_over_before"]].reset_index()


def markdown(df: pd.DataFrame, base: str) -> str:
    """The table as Markdown; ``base`` names the "before" revision in its header."""

    def pct(x: float) -> str:
        return "" if pd.isna(x) else f"{100 * x:.1f} %"

    def times(x: float) -> str:
        return "" if pd.isna(x) else f"{x:.2f}x"

    lines = [
        f"| path | direction | causal | n | matmul rate, before ({base}) | after | "
        "vs dense SDPA, before | after | vs peer, before | after | speed-up |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in df.itertuples():
        lines.append(
            f"| `{r.impl}` | {r.direction} | {'yes' if r.causal else 'no'} | {r.seq_len} | "
            f"{pct(r.matmul_fraction_before)} | {pct(r.matmul_fraction_after)} | "
            f"{times(r.vs_sdpa_before)} | {times(r.vs_sdpa_after)} | {times(r.vs_peer_before)} | "
            f"{times(r.vs_peer_after)} | {times(r.after_over_before)} |"
        )
    return "\n".join(lines) + "\n"


def write(
    out: Path,
    base_runs: Sequence[Path],
    current_runs: Sequence[Path],
    peers: Mapping[str, str],
    base: str,
) -> Path:
    """``OUT/before-after.csv`` and ``OUT/before-after.md`` from the two sides' results CSVs;
    the Markdown file's path."""
    df = table(base_runs, current_runs, peers)
    df.to_csv(out / f"{NAME}.csv", index=False)
    write_text(out / f"{NAME}.md", markdown(df, base))
    return out / f"{NAME}.md"
