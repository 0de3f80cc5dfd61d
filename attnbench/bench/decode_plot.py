"""Decoding's figures: time per new token against the cache length n, one panel per family, the
suite's reference (``softmax:sdpa``) the grey line in each, a dashed guide ∝ n (a form that
reads its whole cache follows it; a recurrent state stays flat). One figure per number of new
queries (and device, dtype and head dim when a file mixes them):
``decode-time-q1.png``. Drawn by :func:`attnbench.bench.plot.plot_results`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from attnbench.bench.figstyle import file_stem
from attnbench.bench.panels import Metric, family_figure

DECODE_TIME = Metric(
    "time",
    "time per new token (ms)",
    "Decoding: time per new token",
    xlabel="cache length n",
    per_token=True,
    guide_power=1,
)
#: The reference a decode figure draws in every panel when the rows name none.
DECODE_REFERENCE = ("softmax", "sdpa")


def is_decode(df: pd.DataFrame) -> pd.Series:
    return df["query_len"].notna() if "query_len" in df else pd.Series(False, index=df.index)


def _reference(df: pd.DataFrame) -> tuple[str, str]:
    named = df["reference"].dropna().astype(str)
    named = named[named != ""]
    if named.empty:
        return DECODE_REFERENCE
    mech, _, path = named.iloc[0].partition(":")
    return mech, path


def decode_figures(df: pd.DataFrame, out_dir: Path, fmt: str, colors, save) -> list[Path]:
    """Every decode figure of ``df``'s decode rows, saved with ``save(fig, path)``."""
    rows = df[is_decode(df)]
    paths = []
    settings = ["query_len", "direction", "causal", "device", "dtype", "head_dim"]
    for key, sub in rows.groupby(settings, sort=True):
        if not (sub["status"] == "ok").any():
            continue
        stem = file_stem(rows, key[1:]).removeprefix("fwd-causal").lstrip("-")
        name = f"decode-time-q{int(key[0])}" + (f"-{stem}" if stem else "")
        path = out_dir / f"{name}.{fmt}"
        queries = "1 new query" if key[0] == 1 else f"{int(key[0])} new queries"
        metric = replace(DECODE_TIME, title=f"Decoding, {queries} a call: time per new token")
        fig = family_figure(sub, metric, colors, reference_impl=_reference(sub))
        save(fig, path)
        paths.append(path)
    return paths
