"""Per-family small multiples: one log-log panel per family, time or peak memory against n.

Every panel draws dense SDPA (``softmax:efficient``) in grey, the common reference, and a dashed
n² guide; colour says the mechanism (its own legend, inside the panel), line style the path kind
(efficient solid, reference dashed with hollow markers, fused dotted), and a second path of the
same mechanism and kind (``linear:chunkwise`` and ``linear:recurrent``) its own marker. Where a
series stops, a marker on its last measured point says why (out of memory, skipped by the time
limit, unsupported, error; the key at the top names them); a family's paths that ran at no length
are one line at the foot of its panel.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from attnbench.bench.figstyle import (
    ITEMSIZE,
    KIND_LABEL,
    KIND_STYLE,
    REFERENCE,
    REFERENCE_COLOR,
    STATUS_LABEL,
    STATUS_MARKER,
    Series,
    direction_text,
    family_order,
    fmt_n,
    memory_column,
    series_in,
    setting_text,
    variant_markers,
)

PANEL_W, PANEL_H = 5.6, 3.6  # inches: two columns make a figure that reads at 800 px
LEGEND_FONT = 8.5
STOP_OFFSET = 2**0.18  # a stop marker sits just right of the point it follows (octaves)
MiB = 2**20
REFERENCE_GID = "dense-reference"  # the grey line's id (tests and SVG readers find it by this)


@dataclass(frozen=True)
class Metric:
    """What a figure plots against n."""

    name: str  # time | memory
    ylabel: str
    title: str
    xlabel: str = "sequence length n"
    #: Time per new token (decoding): the time per call over the call's new queries.
    per_token: bool = False
    #: The slope of the dashed guide through the reference's first point (n^2; decoding: n).
    guide_power: int = 2

    def values(self, s: Series) -> pd.Series:
        """The series' y at each of its lengths, NaN where it did not run (the line breaks)."""
        rows = s.rows
        if self.name == "time":
            y = rows["time_median_ms"].astype(float)
            if self.per_token:
                y = y / rows["query_len"].astype(float)
        else:
            direction = rows["direction"].iloc[0]
            y = rows[memory_column(direction)].astype(float) / MiB
        y = y.where(rows["status"] == "ok")
        return y.where(y > 0)


METRICS = {
    "time": Metric("time", "time per call (ms)", "Time per call"),
    "memory": Metric("memory", "peak memory (MiB)", "Peak memory"),
}


def family_figure(
    df: pd.DataFrame,
    metric: Metric,
    colors: dict[str, tuple],
    reference_impl: tuple[str, str] = REFERENCE,
) -> Figure:
    """One figure: a panel per family of ``df`` (one setting), in family order, with the
    ``reference_impl`` series (dense SDPA by default) in every panel."""
    families = family_order(df)
    series = series_in(df)
    is_ref = lambda s: (s.mechanism, s.path) == reference_impl  # noqa: E731
    reference = next((s for s in series if is_ref(s) and s.ran), None)
    fig, axes = _grid(len(families))
    markers = variant_markers(series)
    for ax, family in zip(axes, families, strict=False):
        members = [s for s in series if s.family == family and not is_ref(s)]
        _panel(ax, family, members, reference, metric, colors, markers)
    for ax in axes[len(families) :]:
        ax.set_visible(False)
    _finish_axes(axes[: len(families)], df, metric, reference_impl)
    _figure_key(fig, series, metric, reference_impl if reference is not None else None)
    first = df.iloc[0]
    causal = "causal" if bool(first["causal"]) else "bidirectional"
    fig.suptitle(
        f"{metric.title} against n, {direction_text(first['direction'])}, {causal}\n"
        f"{setting_text(df)}",
        fontsize=12,
        fontweight="bold",
        y=0.995,
    )
    return fig


def _grid(panels: int):
    cols = 1 if panels == 1 else 2
    rows = math.ceil(panels / cols)
    key_h = 1.3
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(PANEL_W * cols, PANEL_H * rows + key_h),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    top = 1 - key_h / (PANEL_H * rows + key_h)
    fig.subplots_adjust(left=0.08, right=0.98, top=top, bottom=0.06, hspace=0.22, wspace=0.06)
    return fig, list(axes.flat)


def _panel(ax, family, members, reference, metric, colors, markers) -> None:
    ax.set_title(family, fontsize=11, fontweight="bold", loc="left")
    stops: Counter = Counter()  # stop markers already at each n: the next one moves aside
    if reference is not None:
        _draw_reference(ax, reference, metric, stops)
    for s in members:
        if s.ran:
            _draw_series(ax, s, metric, colors[s.mechanism], markers[_key(s)], stops)
    _panel_legend(ax, [s for s in members if s.ran], colors, markers)
    never = [s for s in members if not s.ran]
    if never:
        _not_run_note(ax, never)


def _key(s: Series) -> tuple[str, str, str]:
    return (s.mechanism, s.path, s.params)


def _draw_series(ax, s: Series, metric: Metric, color, marker: str, stops: Counter) -> None:
    y = metric.values(s)
    n = s.rows["seq_len"].to_numpy(dtype=float)
    hollow = s.kind == "reference"
    ax.plot(
        n,
        y.to_numpy(),
        KIND_STYLE.get(s.kind, "-"),
        marker=marker,
        markersize=4.5,
        color=color,
        linewidth=1.6,
        markerfacecolor="white" if hollow else color,
        zorder=3,
    )
    _draw_stops(ax, s, y.to_numpy(), color, stops)


def _draw_stops(ax, s: Series, y: np.ndarray, color, stops: Counter) -> None:
    """The series' stop markers (:func:`stop_points`), in its colour with a black edge; where
    several series stop at one n, each further marker sits a little further right."""
    n = s.rows["seq_len"].to_numpy(dtype=float)
    for x, yy, status in stop_points(n, y, s.rows["status"].to_numpy()):
        slot = round(math.log2(x), 1)
        shift = STOP_OFFSET ** (0.6 * stops[slot])
        stops[slot] += 1
        ax.scatter(
            [x * shift],
            [yy],
            marker=STATUS_MARKER.get(status, "*"),
            s=110 if status != "unsupported" else 160,
            color=color,
            edgecolors="black",
            linewidths=0.8 if status != "unsupported" else 2.2,
            zorder=6,
        )


def stop_points(n: np.ndarray, y: np.ndarray, status: np.ndarray) -> list[tuple[float, float, str]]:
    """Where a series' not-``ok`` cells are marked: (n, y, status) beside the measured point next
    to each run of them: just right of the last point before a series stops, just left of the
    first after one that starts late; a gap between two measured points is marked halfway
    (geometrically) along it."""
    ok = np.isfinite(y) & (status == "ok")
    if not ok.any():
        return []
    points = []
    i = 0
    while i < len(n):
        if ok[i] or status[i] == "ok":
            i += 1
            continue
        j = i
        while j < len(n) and not ok[j]:
            j += 1
        before = i - 1 if i > 0 and ok[i - 1] else None
        after = j if j < len(n) else None
        if before is not None and after is not None:
            x = math.sqrt(n[before] * n[after])
            yy = math.sqrt(y[before] * y[after])
        elif before is not None:
            x, yy = n[before] * STOP_OFFSET, y[before]
        else:
            x, yy = n[after] / STOP_OFFSET, y[after]
        points.append((float(x), float(yy), str(status[i])))
        i = j
    return points


def _draw_reference(ax, reference: Series, metric: Metric, stops: Counter) -> None:
    y = metric.values(reference).to_numpy()
    _draw_stops(ax, reference, y, REFERENCE_COLOR, stops)
    ax.plot(
        reference.rows["seq_len"].to_numpy(dtype=float),
        y,
        "-",
        color=REFERENCE_COLOR,
        linewidth=4,
        alpha=0.6,
        solid_capstyle="round",
        zorder=2,
        gid=REFERENCE_GID,
    )


def n2_guide(
    df: pd.DataFrame, metric: Metric, reference_impl: tuple[str, str] = REFERENCE
) -> tuple[np.ndarray, np.ndarray] | None:
    """The dashed n² line: for memory, the bytes of one dense n x n score matrix per head
    (B * H * n² * itemsize); for time, n² (``metric.guide_power``) through the reference's
    time at the shortest n."""
    lengths = np.array(sorted(df["seq_len"].unique()), dtype=float)
    if metric.name == "memory":
        first = df.iloc[0]
        batch = df.groupby("seq_len")["batch"].max().to_numpy(dtype=float)
        itemsize = ITEMSIZE.get(first["dtype"], 4)
        return lengths, batch * float(first["heads"]) * lengths**2 * itemsize / MiB
    ref = df[
        (df["mechanism"] == reference_impl[0])
        & (df["path"] == reference_impl[1])
        & (df["status"] == "ok")
    ].sort_values("seq_len")
    if ref.empty:
        return None
    n0, t0 = float(ref["seq_len"].iloc[0]), float(ref["time_median_ms"].iloc[0])
    if metric.per_token:
        t0 /= float(ref["query_len"].iloc[0])
    return lengths, t0 * (lengths / n0) ** metric.guide_power


def _finish_axes(
    axes, df: pd.DataFrame, metric: Metric, reference_impl: tuple[str, str] = REFERENCE
) -> None:
    lengths = sorted(df["seq_len"].unique())
    guide = n2_guide(df, metric, reference_impl)
    for i, ax in enumerate(axes):
        if guide is not None:
            ax.plot(*guide, "--", color="black", linewidth=0.9, alpha=0.75, zorder=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths)
        ax.set_xticklabels([fmt_n(n) for n in lengths])
        ax.minorticks_off()
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(labelsize=9, labelbottom=True)
        if i % 2 == 0:
            ax.set_ylabel(metric.ylabel, fontsize=9.5)
        if i >= len(axes) - 2:
            ax.set_xlabel(metric.xlabel, fontsize=9.5)
    if len(axes) > 1:
        axes[0].set_xlim(lengths[0] / 1.25, lengths[-1] * 1.25)


def _panel_legend(ax, drawn: list[Series], colors, markers) -> None:
    """One entry per mechanism (its colour); a mechanism with two paths of one kind (linear:
    chunkwise and recurrent) gets an entry per path, in that path's style and marker."""
    split = {m for m, n in Counter((s.mechanism, s.kind) for s in drawn).items() if n > 1}
    split_mechs = {mech for mech, _kind in split}
    handles = []
    named: set[str] = set()
    for s in drawn:
        if s.mechanism in split_mechs:
            handles.append(
                _legend_line(s, colors, markers[_key(s)], s.impl + _params_tag(s, drawn))
            )
        elif s.mechanism not in named:
            handles.append(_legend_line(s, colors, "o", s.mechanism, solid=True))
        named.add(s.mechanism)
    if handles:
        ax.legend(
            handles=handles,
            loc="best",
            fontsize=LEGEND_FONT,
            framealpha=0.85,
            handlelength=2.0,
            labelspacing=0.25,
            borderpad=0.35,
            ncol=2 if len(handles) > 5 else 1,
            columnspacing=0.8,
        )


def _params_tag(s: Series, drawn: list[Series]) -> str:
    """`` [k=8]`` when the mechanism is drawn with more than one parameter setting."""
    settings = {x.params for x in drawn if x.mechanism == s.mechanism}
    return f" [{s.params}]" if s.params and len(settings) > 1 else ""


def _legend_line(s: Series, colors, marker: str, label: str, solid: bool = False) -> Line2D:
    hollow = s.kind == "reference" and not solid
    return Line2D(
        [],
        [],
        color=colors[s.mechanism],
        linestyle="-" if solid else KIND_STYLE.get(s.kind, "-"),
        marker=marker,
        markersize=4.5,
        markerfacecolor="white" if hollow else colors[s.mechanism],
        linewidth=1.6,
        label=label,
    )


def _not_run_note(ax, never: list[Series]) -> None:
    """One line at the foot of a panel for its paths that ran at no length, grouped by why."""
    groups: dict[tuple[str, str], list[Series]] = {}
    for s in never:
        status = s.rows["status"].iloc[0]
        reasons = s.rows["reason"].drop_duplicates()
        reason = reasons.iloc[0] if len(reasons) == 1 else "reasons in the CSV"
        groups.setdefault((status, reason), []).append(s)
    parts = []
    for (status, reason), members in groups.items():
        kinds = Counter(s.kind for s in members)
        what = ", ".join(f"{k} {kind}" for kind, k in kinds.items())
        parts.append(f"{what} path{'s' if len(members) > 1 else ''} {status}: {reason}")
    text = "not run: " + "; ".join(parts)
    ax.text(
        0.99,
        0.02,
        textwrap.fill(text, 62),
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=7.5,
        color="0.25",
        bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.85, "pad": 2},
        zorder=7,
    )


def _figure_key(
    fig, series: list[Series], metric: Metric, reference_impl: tuple[str, str] | None
) -> None:
    """The shared key at the top: line styles, the grey reference, the n² guide, stop markers."""
    drawn = [s for s in series if s.ran]
    handles = []
    if reference_impl is not None:
        what = "dense SDPA" if reference_impl == REFERENCE else "the suite's reference"
        handles.append(
            Line2D(
                [],
                [],
                color=REFERENCE_COLOR,
                linewidth=4,
                alpha=0.6,
                label=f"{reference_impl[0]}:{reference_impl[1]} ({what}), every panel",
            )
        )
    for kind in ("efficient", "reference", "fused"):
        if any(s.kind == kind and not s.is_reference for s in drawn):
            handles.append(
                Line2D(
                    [],
                    [],
                    color="0.2",
                    linestyle=KIND_STYLE[kind],
                    marker="o",
                    markersize=4.5,
                    markerfacecolor="white" if kind == "reference" else "0.2",
                    label=KIND_LABEL[kind],
                )
            )
    guide = "dense n×n scores (B·H·n²·bytes)" if metric.name == "memory" else "∝ n² (from SDPA)"
    if metric.guide_power == 1:
        guide = "∝ n (from the reference)"
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.9, label=guide))
    statuses = {status for s in drawn for status in s.rows["status"] if status != "ok"}
    for status, marker in STATUS_MARKER.items():
        if status in statuses:
            handles.append(
                Line2D(
                    [],
                    [],
                    linestyle="none",
                    marker=marker,
                    markersize=9 if status != "unsupported" else 11,
                    color="0.6",
                    markeredgecolor="black",
                    markeredgewidth=0.8 if status != "unsupported" else 2,
                    label=f"stops: {STATUS_LABEL[status]}",
                )
            )
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.55 / fig.get_figheight()),
        ncol=min(4, math.ceil(len(handles) / 2)),
        fontsize=9,
        frameon=False,
        handlelength=2.6,
        columnspacing=1.4,
    )
