"""Measured complexity: the exponent of time and of peak memory against n, fitted in log-log.

For each series (a mechanism's path with fixed parameters, dtype, heads, head dim, causal flag and
direction) over the lengths where it ran, the least-squares slope of log(y) against log(n). Time
and memory are taken per sequence (divided by the batch), so a sweep at a fixed token count, where
the batch shrinks as n grows, gives the same exponents as a sweep at a fixed batch. Dense
attention reads about 2 (less at short n, where per-call overheads and the O(n) output dominate);
banded, chunked and linear paths about 1 for memory.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

SERIES: tuple[str, ...] = (
    "mechanism",
    "family",
    "path",
    "path_kind",
    "params",
    "device",
    "dtype",
    "heads",
    "head_dim",
    "causal",
    "direction",
)

COLUMNS: tuple[str, ...] = (
    *SERIES,
    "points",
    "n_min",
    "n_max",
    "time_exponent",
    "mem_fwd_exponent",
    "mem_fwdbwd_exponent",
)


def slope(n: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of log y against log n; NaN with fewer than two distinct n."""
    keep = np.isfinite(y) & (y > 0)
    n, y = n[keep], y[keep]
    if len(np.unique(n)) < 2:
        return math.nan
    return float(np.polyfit(np.log(n), np.log(y), 1)[0])


def fit_exponents(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per series with at least one ok measurement; exponents NaN below two lengths."""
    ok = rows[rows["status"] == "ok"]
    out = []
    for key, g in ok.groupby(list(SERIES), sort=False, dropna=False):
        g = g.sort_values("seq_len")
        n = g["seq_len"].to_numpy(dtype=np.float64)
        batch = g["batch"].to_numpy(dtype=np.float64)

        def per_seq(col: str, g=g, batch=batch) -> np.ndarray:
            return g[col].to_numpy(dtype=np.float64, na_value=np.nan) / batch

        out.append(
            {
                **dict(zip(SERIES, key, strict=True)),
                "points": int(len(np.unique(n))),
                "n_min": int(n.min()),
                "n_max": int(n.max()),
                "time_exponent": slope(n, per_seq("time_median_ms")),
                "mem_fwd_exponent": slope(n, per_seq("mem_fwd_bytes")),
                "mem_fwdbwd_exponent": slope(n, per_seq("mem_fwdbwd_bytes")),
            }
        )
    return pd.DataFrame(out, columns=list(COLUMNS))
