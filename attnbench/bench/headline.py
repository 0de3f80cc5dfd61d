"""The headline figure: at the longest n each path reached, how much faster and how much leaner
than dense SDPA (``softmax:efficient``) at the same n, on this machine.

Speed-up is the reference's time over the path's: ``1 / ref_ratio`` when the row's reference is
dense SDPA (the ratio of samples taken in the same rounds, the steadiest number on a busy
machine), else the ratio of the two median times at that n. Memory is the path's peak bytes over
the reference's at that n. A path whose longest n the reference did not reach is compared at the
longest n both reached. Efficient and fused paths only: the dense oracles are there to be right,
not fast. Two horizontal bar charts side by side, each sorted, log scale, bars drawn from 1×.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from attnbench.bench.figstyle import (
    KEY_COLUMNS,
    PALETTE,
    REFERENCE,
    direction_text,
    family_order,
    figure_keys,
    fmt_n,
    fmt_ratio,
    memory_column,
    select,
    series_in,
    threads_text,
)

HEADLINE_KINDS = ("efficient", "fused")
#: The setting the headline prefers: forward, bidirectional, float32 (what a CPU runs).
PREFERRED = {"direction": "fwd", "causal": False, "dtype": "float32"}
TABLE_COLUMNS = ["impl", "family", "kind", "n", "speedup", "memory", "time_ms", "ref_time_ms"]


def headline_key(df: pd.DataFrame) -> tuple | None:
    """The setting to headline: the one closest to PREFERRED that has dense SDPA measured."""
    ref = df[(df["mechanism"] == REFERENCE[0]) & (df["path"] == REFERENCE[1])]
    keys = figure_keys(ref[ref["status"] == "ok"])
    if not keys:
        return None

    def misses(key: tuple) -> int:
        named = dict(zip(KEY_COLUMNS, key, strict=True))
        return sum(named[col] != value for col, value in PREFERRED.items())

    return min(keys, key=misses)


def headline_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per efficient or fused path of ``df`` (one setting) that ran: the n compared at,
    speed-up and memory relative to dense SDPA; sorted by speed-up, fastest first."""
    ref = _reference_rows(df)
    rows = []
    for s in series_in(df):
        if s.is_reference or s.kind not in HEADLINE_KINDS:
            continue
        ok = s.rows[(s.rows["status"] == "ok") & s.rows["seq_len"].isin(ref.index)]
        if ok.empty:
            continue
        top = ok.loc[ok["seq_len"].idxmax()]
        rows.append(_compare(s.impl, s.family, s.kind, top, ref.loc[top["seq_len"]]))
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    return table.sort_values("speedup", ascending=False, kind="stable").reset_index(drop=True)


def _reference_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Dense SDPA's ok rows, indexed by n."""
    ref = df[
        (df["mechanism"] == REFERENCE[0]) & (df["path"] == REFERENCE[1]) & (df["status"] == "ok")
    ]
    return ref.drop_duplicates("seq_len").set_index("seq_len")


def _compare(impl: str, family: str, kind: str, row: pd.Series, ref: pd.Series) -> dict:
    mem_col = memory_column(row["direction"])
    ratio = row["ref_ratio"]
    same_rounds = row["reference"] == f"{REFERENCE[0]}:{REFERENCE[1]}" and pd.notna(ratio)
    speedup = 1 / ratio if same_rounds else ref["time_median_ms"] / row["time_median_ms"]
    mem, ref_mem = row[mem_col], ref[mem_col]
    memory = (
        float(mem) / float(ref_mem) if pd.notna(mem) and pd.notna(ref_mem) and ref_mem else None
    )
    return {
        "impl": impl,
        "family": family,
        "kind": kind,
        "n": int(row["seq_len"]),
        "speedup": float(speedup),
        "memory": memory,
        "time_ms": float(row["time_median_ms"]),
        "ref_time_ms": float(ref["time_median_ms"]),
    }


def headline_figure(df: pd.DataFrame) -> tuple[Figure, pd.DataFrame] | None:
    """The headline of ``df`` (any number of settings) and its table, or None when there is
    nothing to headline (dense SDPA or every efficient path never ran)."""
    key = headline_key(df)
    if key is None:
        return None
    sub = select(df, key)
    table = headline_table(sub)
    if table.empty:
        return None
    colors = {f: PALETTE[i % len(PALETTE)] for i, f in enumerate(family_order(df))}
    typical_n = int(table["n"].mode().max())
    height = 0.26 * len(table) + 1.9
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, height))
    fig.subplots_adjust(
        wspace=0.55, left=0.2, right=0.97, top=1 - 1.1 / height, bottom=0.6 / height
    )
    _bars(left, table, "speedup", colors, typical_n, "speed-up over dense SDPA (higher: faster)")
    mem = table.dropna(subset=["memory"]).sort_values("memory", kind="stable")
    _bars(right, mem, "memory", colors, typical_n, "peak memory / dense SDPA's (lower: leaner)")
    fig.suptitle(_title(sub, typical_n), fontsize=11.5, fontweight="bold", y=1 - 0.08 / height)
    families = [f for f in family_order(sub) if f in set(table["family"])]
    fig.legend(
        handles=[Patch(color=colors[f], label=f) for f in families],
        loc="upper center",
        ncol=len(families),
        fontsize=9.5,
        frameon=False,
        bbox_to_anchor=(0.5, 1 - 0.62 / height),
    )
    return fig, table


def _title(df: pd.DataFrame, typical_n: int) -> str:
    first = df.iloc[0]
    causal = "causal" if bool(first["causal"]) else "bidirectional"
    shape = f"B={first['batch']} H={first['heads']} D={first['head_dim']}"
    return (
        f"Against dense SDPA (softmax:efficient) at n = {fmt_n(typical_n)}: "
        f"{direction_text(first['direction'])}, {causal}, {first['dtype']}, {shape}\n"
        f"{first['device_name']}, {threads_text(first['threads'])}, suite {first['suite']} "
        f"(a path that stopped earlier: at its longest n, marked @n)"
    )


def _bars(ax, table: pd.DataFrame, col: str, colors, typical_n: int, xlabel: str) -> None:
    """Horizontal bars from 1× to each value (log scale), first row on top, labelled."""
    values = table[col].to_numpy(dtype=float)
    y = list(range(len(table)))[::-1]
    ax.barh(
        y,
        values - 1,
        left=1,
        color=[colors[f] for f in table["family"]],
        height=0.72,
        edgecolor="none",
    )
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}×"))
    ax.axvline(1, color="black", linewidth=1)
    ax.set_yticks(y)
    ax.set_yticklabels(table["impl"], fontsize=9.5)
    ax.set_ylim(-0.7, len(table) - 0.3)
    ax.set_xlabel(xlabel, fontsize=10)
    ax.grid(True, axis="x", which="major", alpha=0.3)
    low, high = min(values.min(), 1.0), max(values.max(), 1.0)
    ax.set_xlim(low / (8 if low < 1 else 4), high * 3)  # room for the labels at both ends
    for yy, value, n in zip(y, values, table["n"], strict=True):
        text = fmt_ratio(value) + ("" if n == typical_n else f" @{fmt_n(n)}")
        inside_left = value < 1
        ax.text(
            value / 1.06 if inside_left else value * 1.06,
            yy,
            text,
            va="center",
            ha="right" if inside_left else "left",
            fontsize=8.5,
        )
