"""The GPU figure people expect: TFLOP/s against n, one panel per family, the dense cuDNN and
flash kernels drawn in every panel, and at the longest n each path's speed-up over the best dense
kernel there.

This is the figure of the FlashAttention papers (Dao et al. 2022, "FlashAttention: Fast and
Memory-Efficient Exact Attention with IO-Awareness"; Dao 2023, "FlashAttention-2"): attention
throughput against sequence length at a fixed number of tokens a batch. TFLOP/s count FLOPs in
their convention (``flop_per_s_fa``: the forward's FLOPs, forward + backward 3.5x the forward),
each path its own mechanism's FLOPs, so a linear-attention path's rate is of its own (smaller)
work: the panel's dense lines give the scale, and the speed-up label says what a user gains. The
bf16 matmul rate measured in the same rounds is the dashed line at the top.

Drawn for every setting (direction, causal flag, dtype, head dim) of a CUDA results CSV that has
the cuDNN or the flash SDPA backend measured (``attnbench plot``, and ``run speed`` at its end):
``tflops-<setting>.png``.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from attnbench.bench.figstyle import (
    direction_text,
    family_order,
    fmt_n,
    fmt_ratio,
    series_in,
    setting_text,
)

#: The dense kernels drawn in every panel: (mechanism, path) -> (label, colour, line style).
DENSE_LINES = {
    ("softmax", "sdpa-cudnn"): ("cuDNN (SDPA)", "black", "-"),
    ("softmax", "sdpa-flash"): ("flash (SDPA, FlashAttention-2)", "0.45", "--"),
}
#: The dense softmax kernels the speed-up is taken over: the fastest of them at that n.
DENSE_PATHS = ("efficient", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient")
DENSE_GID = "dense-{path}"  # the lines' ids (tests and SVG readers find them by this)
PANEL_W, PANEL_H = 5.2, 3.4
TFLOP = 1e12


def wants_gpu_figure(df: pd.DataFrame) -> bool:
    """A CUDA run with cuDNN or flash measured: the figure has its scale."""
    dense = df[df["mechanism"].eq("softmax") & df["path"].isin(["sdpa-cudnn", "sdpa-flash"])]
    return bool((df["device"] == "cuda").any() and (dense["status"] == "ok").any())


def best_dense_ms(df: pd.DataFrame) -> pd.Series:
    """At each n, the shortest median time of a dense softmax kernel (ok rows)."""
    dense = df[df["mechanism"].eq("softmax") & df["path"].isin(DENSE_PATHS) & df["status"].eq("ok")]
    return dense.groupby("seq_len")["time_median_ms"].min()


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per path of ``df`` (one setting) that is not a dense kernel: at the longest n where both
    it and a dense kernel ran, the best dense kernel's time over its own (``n``, ``speedup``)."""
    best = best_dense_ms(df)
    out = []
    for s in series_in(df):
        if (s.mechanism, s.path) in DENSE_LINES:
            continue
        ok = s.rows[s.rows["status"].eq("ok") & s.rows["seq_len"].isin(best.index)]
        if ok.empty:
            continue
        top = ok.loc[ok["seq_len"].idxmax()]
        speedup = best[top["seq_len"]] / float(top["time_median_ms"])
        out.append(
            {"impl": s.impl, "family": s.family, "n": int(top["seq_len"]), "speedup": speedup}
        )
    return pd.DataFrame(out, columns=["impl", "family", "n", "speedup"])


def tflops(rows: pd.DataFrame) -> np.ndarray:
    """TFLOP/s in flash-attention's convention at each row (NaN where it did not run)."""
    rate = rows["flop_per_s_fa"].astype(float).where(rows["status"].eq("ok"))
    return (rate / TFLOP).to_numpy()


def gpu_figure(df: pd.DataFrame) -> Figure | None:
    """The figure for ``df`` (one setting), or None when it has no dense kernel to scale by."""
    if not wants_gpu_figure(df):
        return None
    families = [f for f in family_order(df) if (df[df["family"] == f]["status"] == "ok").any()]
    gains = speedups(df)
    longest = int(df[df["status"] == "ok"]["seq_len"].max())
    cols = 1 if len(families) == 1 else 2
    rows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(PANEL_W * cols, PANEL_H * rows + 1.2), squeeze=False, sharex=True
    )
    axes = list(axes.flat)
    matmul = df["matmul_flop_per_s"].astype(float).median() / TFLOP
    for ax, family in zip(axes, families, strict=False):
        _panel(ax, df, family, gains, longest, matmul)
    for ax in axes[len(families) :]:
        ax.set_visible(False)
    first = df.iloc[0]
    causal = "causal" if bool(first["causal"]) else "bidirectional"
    fig.suptitle(
        f"TFLOP/s against n, {direction_text(first['direction'])}, {causal} "
        f"(fwd+bwd = 3.5 x fwd FLOPs); label: speed-up over the best dense kernel\n"
        f"{setting_text(df)}",
        fontsize=11,
        fontweight="bold",
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def _panel(
    ax, df: pd.DataFrame, family: str, gains: pd.DataFrame, longest: int, matmul: float
) -> None:
    ax.set_title(family, fontsize=11, fontweight="bold", loc="left")
    colors = iter(plt.get_cmap("tab10")(i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9) * 3)
    handles = []
    for s in series_in(df):
        n = s.rows["seq_len"].to_numpy(dtype=float)
        style = DENSE_LINES.get((s.mechanism, s.path))
        if style is not None:
            label, color, dash = style
            ax.plot(
                n,
                tflops(s.rows),
                dash,
                color=color,
                linewidth=2.2,
                zorder=2,
                gid=DENSE_GID.format(path=s.path),
            )
            handles.append(Line2D([], [], color=color, linestyle=dash, linewidth=2.2, label=label))
            continue
        if s.family != family or not s.ran:
            continue
        color = next(colors)
        ax.plot(n, tflops(s.rows), "-o", color=color, markersize=4, linewidth=1.6, zorder=3)
        handles.append(Line2D([], [], color=color, marker="o", markersize=4, label=s.impl))
        _label_speedup(ax, s, gains, longest, color)
    if matmul and math.isfinite(matmul):
        ax.axhline(matmul, color="0.3", linestyle=":", linewidth=1)
        handles.append(Line2D([], [], color="0.3", linestyle=":", label="matmul, same rounds"))
    lengths = sorted(df["seq_len"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([fmt_n(n) for n in lengths])
    ax.set_xlim(lengths[0] / 1.3, lengths[-1] * 1.7)  # room for the speed-up labels
    ax.minorticks_off()
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # headroom for the legend
    ax.set_ylabel("TFLOP/s", fontsize=9.5)
    ax.set_xlabel("sequence length n", fontsize=9.5)
    ax.grid(True, alpha=0.3)
    ax.legend(handles=handles, fontsize=7, loc="upper left", framealpha=0.85, ncol=2)


def _label_speedup(ax, s, gains: pd.DataFrame, longest: int, color) -> None:
    """``2.3×`` beside the series' point at its longest n (``@4k`` when that is not the
    figure's longest)."""
    gain = gains[gains["impl"] == s.impl]
    if gain.empty:
        return
    n, speedup = int(gain["n"].iloc[0]), float(gain["speedup"].iloc[0])
    y = tflops(s.rows[s.rows["seq_len"] == n])
    if not len(y) or not math.isfinite(y[0]):
        return
    text = fmt_ratio(speedup) + ("" if n == longest else f" @{fmt_n(n)}")
    ax.annotate(
        text,
        (n, y[0]),
        xytext=(5, 0),
        textcoords="offset points",
        fontsize=8,
        color=color,
        va="center",
        fontweight="bold",
    )
