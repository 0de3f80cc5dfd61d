"""A finished run's inference shapes in a few numbers (what the CLI's tables and JSON show).

Decoding, per decode form (and parameters) and number of new queries, at the longest cache it
reached: time per new token, tokens per second, bytes per second and their fraction of the copy
timed in the same rounds, the state's memory, and the fitted exponent of time against the cache
length n (near 1 for a form that reads the whole cache, near 0 for a recurrent state).

Packed batches, per path: its time on the packed batch beside the same sequences padded to the
longest, in the same rounds, and the speed-up of packing (padded time / packed time) at the same
token budget.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnbench.bench.results import COLUMNS


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _empty(series: pd.Series) -> pd.Series:
    """Cells with no value: None in a run's rows, "" or NA in a CSV read back."""
    return series.isna() | (series.astype(str) == "")


def decode_rows(rows: list[dict[str, Any]], exponents: pd.DataFrame) -> list[dict[str, Any]]:
    """Per decode form, parameters and new queries: its numbers at the longest n it ran."""
    df = _frame(rows)
    df = df[~_empty(df["query_len"])]
    out = []
    for (mech, path, params, tq), g in df.groupby(
        ["mechanism", "path", "params", "query_len"], sort=False, dropna=False
    ):
        ok = g[g["status"] == "ok"]
        entry: dict[str, Any] = {"impl": f"{mech}:{path}", "params": params or "",
                                 "query_len": int(tq), "ok": f"{len(ok)}/{len(g)}"}  # fmt: skip
        if ok.empty:
            entry["reason"] = str(g["reason"].iloc[0] or g["status"].iloc[0])
            out.append(entry)
            continue
        top = ok.loc[ok["seq_len"].astype(int).idxmax()]
        fit = exponents
        if not fit.empty and "query_len" in fit:
            fit = fit[(fit["mechanism"] == mech) & (fit["path"] == path)
                      & (fit["params"].fillna("") == (params or ""))
                      & (fit["query_len"].astype(float) == float(tq))]  # fmt: skip
        reliable = len(fit) and bool(fit["time_reliable"].iloc[0])
        entry.update(
            n=int(top["seq_len"]),
            ms_per_token=float(top["time_median_ms"]) / int(tq),
            tokens_per_s=top["tokens_per_s"],
            gb_per_s=float(top["bytes_per_s"]) / 1e9 if pd.notna(top["bytes_per_s"]) else None,
            copy_fraction=top["bandwidth_fraction"],
            state_bytes=top["state_bytes"],
            ref_ratio=top["ref_ratio"],
            time_exp=float(fit["time_exponent"].iloc[0]) if reliable else None,
            time_exp_note="" if reliable or not len(fit) else str(fit["time_note"].iloc[0]),
        )
        out.append(entry)
    return out


def fastest_decoder(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At each cache length and number of new queries, the decode form that took the least
    time per call (ok rows of one run: measured side by side)."""
    df = _frame(rows)
    df = df[~_empty(df["query_len"]) & (df["status"] == "ok")]
    out = []
    for (tq, n), g in df.groupby(["query_len", "seq_len"], sort=True):
        best = g.loc[g["time_median_ms"].astype(float).idxmin()]
        out.append({"query_len": int(tq), "n": int(n), "impl": f"{best['mechanism']}:"
                    f"{best['path']}", "params": best["params"] or "",
                    "ms": float(best["time_median_ms"])})  # fmt: skip
    return out


def packed_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per path, direction and causal flag: packed and padded time, and packing's speed-up."""
    df = _frame(rows)
    df = df[~_empty(df["packing"])]
    out = []
    keys = ["mechanism", "path", "params", "direction", "causal"]
    for (mech, path, params, direction, causal), g in df.groupby(keys, sort=False, dropna=False):
        packed = g[(g["packing"] != "padded") & (g["status"] == "ok")]
        padded = g[(g["packing"] == "padded") & (g["status"] == "ok")]
        entry: dict[str, Any] = {
            "impl": f"{mech}:{path}",
            "params": params or "",
            "series": f"{direction} {'causal' if causal else 'bidir'}",
            "varlen": g["varlen"].iloc[0],
            "packing": str(g[g["packing"] != "padded"]["packing"].iloc[0])
            if (g["packing"] != "padded").any()
            else "",
        }
        if not packed.empty:
            entry["packed_ms"] = float(packed["time_median_ms"].iloc[0])
        if not padded.empty:
            entry["padded_ms"] = float(padded["time_median_ms"].iloc[0])
        if "packed_ms" in entry and "padded_ms" in entry:
            entry["speedup"] = entry["padded_ms"] / entry["packed_ms"]
        if packed.empty or padded.empty:
            bad = g[g["status"] != "ok"]
            entry["reason"] = str(bad["reason"].iloc[0]) if not bad.empty else ""
        out.append(entry)
    return out
