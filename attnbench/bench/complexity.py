"""Measured complexity: the exponent of time and of peak memory against n, fitted in log-log.

For each series (a mechanism's path with fixed parameters, dtype, heads, head dim, causal flag and
direction) over the lengths where it ran, the least-squares slope of log(y) against log(n). Time
and memory are taken per sequence (divided by the batch), so a sweep at a fixed token count, where
the batch shrinks as n grows, gives the same exponents as a sweep at a fixed batch. Dense
attention reads about 2 (less at short n, where per-call overheads and the O(n) output dominate);
banded, chunked and linear paths about 1 for memory.

Every time exponent comes with its fit quality (``time_r2``, the r² of the log-log line) and a
verdict, ``time_reliable``, with ``time_note`` saying why not when it is not: fewer than
``MIN_POINTS`` lengths, more than ``MAX_NOISY_SHARE`` of the rows behind it noisy (their p20..p80
spread over 10 % of the median: a busy machine), an r² below ``MIN_R2``, or a negative exponent
(time that falls as n grows is overhead or noise, never a finding). Memory is measured without
timing noise, so its exponents only need two lengths.
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
    "query_len",  # decoding: time against the cache length n, per number of new queries
)

COLUMNS: tuple[str, ...] = (
    *SERIES,
    "points",
    "n_min",
    "n_max",
    "time_exponent",
    "time_r2",
    "time_reliable",
    "time_note",
    "mem_fwd_exponent",
    "mem_fwdbwd_exponent",
)

#: Lengths a time exponent needs to be read as one.
MIN_POINTS = 3
#: The log-log fit of a reliable time exponent explains at least this share of the variance.
MIN_R2 = 0.95
#: Above this share of noisy rows behind it, a time exponent is not reliable.
MAX_NOISY_SHARE = 1 / 3


def slope(n: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of log y against log n; NaN with fewer than two distinct n."""
    keep = np.isfinite(y) & (y > 0)
    n, y = n[keep], y[keep]
    if len(np.unique(n)) < 2:
        return math.nan
    return float(np.polyfit(np.log(n), np.log(y), 1)[0])


def r_squared(n: np.ndarray, y: np.ndarray) -> float:
    """The r² of the least-squares line of log y against log n; NaN below three points."""
    keep = np.isfinite(y) & (y > 0)
    x, z = np.log(n[keep]), np.log(y[keep])
    if len(np.unique(x)) < 3:
        return math.nan
    fitted = np.polyval(np.polyfit(x, z, 1), x)
    total = float(((z - z.mean()) ** 2).sum())
    return 1.0 - float(((z - fitted) ** 2).sum()) / total if total > 0 else math.nan


def time_verdict(exponent: float, r2: float, points: int, noisy_share: float) -> str:
    """Why a time exponent is not reliable ("" when it is)."""
    if points < MIN_POINTS:
        return f"{points} length{'s' if points != 1 else ''} (a trend needs {MIN_POINTS})"
    if not math.isfinite(exponent):
        return "no fit"
    if exponent < 0:
        return "time fell as n grew: overhead or noise, not a trend"
    if noisy_share > MAX_NOISY_SHARE:
        return f"{noisy_share:.0%} of its timings noisy (a busy machine)"
    if not r2 >= MIN_R2:
        return f"poor log-log fit (r² {r2:.2f} < {MIN_R2})"
    return ""


def fit_exponents(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per series with at least one ok measurement; exponents NaN below two lengths.
    Packed batches have no n axis (one token budget) and are left out."""
    ok = rows[rows["status"] == "ok"]
    if "packing" in ok:  # empty: None in a run's rows, "" in a CSV read back
        ok = ok[ok["packing"].fillna("") == ""]
    if "query_len" not in ok:  # an older file's rows
        ok = ok.assign(query_len=None)
    out = []
    for key, g in ok.groupby(list(SERIES), sort=False, dropna=False):
        g = g.sort_values("seq_len")
        n = g["seq_len"].to_numpy(dtype=np.float64)
        batch = g["batch"].to_numpy(dtype=np.float64)

        def per_seq(col: str, g=g, batch=batch) -> np.ndarray:
            return g[col].to_numpy(dtype=np.float64, na_value=np.nan) / batch

        points = int(len(np.unique(n)))
        time = per_seq("time_median_ms")
        exponent, r2 = slope(n, time), r_squared(n, time)
        noisy = g["noisy"].fillna(False).astype(bool) if "noisy" in g else pd.Series([False])
        note = time_verdict(exponent, r2, points, float(noisy.mean()))
        out.append(
            {
                **dict(zip(SERIES, key, strict=True)),
                "points": points,
                "n_min": int(n.min()),
                "n_max": int(n.max()),
                "time_exponent": exponent,
                "time_r2": r2,
                "time_reliable": not note,
                "time_note": note,
                "mem_fwd_exponent": slope(n, per_seq("mem_fwd_bytes")),
                "mem_fwdbwd_exponent": slope(n, per_seq("mem_fwdbwd_bytes")),
            }
        )
    return pd.DataFrame(out, columns=list(COLUMNS))
