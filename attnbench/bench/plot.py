"""Figures from a speed results CSV: time, throughput and peak memory against n.

One figure per (direction, causal flag) — and per dtype, device and head dim when a file mixes
them — with three log-log panels. Colour says the mechanism (the legend groups mechanisms by
family), line style the path kind (reference dashed with hollow markers, efficient solid, fused
dotted). Cases that did not run are never silently missing: a length-dependent
``oom``/``error``/``skipped``/``unsupported`` cell is a marker on the strip at the bottom of each
panel, at its n, in its series' colour; a series that ran nowhere is listed under the figure with
its reason. The memory panel carries the bytes of one dense n x n score matrix per head
(B * H * n^2 * itemsize), the line every O(n^2) method follows and every efficient one should
leave behind.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from attnbench import registry  # noqa: E402
from attnbench.bench.results import read_results  # noqa: E402
from attnbench.errors import AttnbenchError  # noqa: E402

FORMATS = ("png", "svg")
KIND_STYLE = {"reference": "--", "efficient": "-", "fused": ":"}
KIND_MARKER = {"reference": "o", "efficient": "o", "fused": "s"}
STATUS_MARKER = {"oom": "X", "error": "*", "skipped": ">", "unsupported": "|"}
STATUS_ROW = {"oom": 0.03, "error": 0.07, "skipped": 0.11, "unsupported": 0.15}
ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
MAX_FOOTNOTES = 14
STRIP_JITTER = 0.012  # octaves between neighbouring series' strip markers


def _series_colors(df: pd.DataFrame) -> dict[tuple, tuple]:
    """A colour per mechanism (its paths share it, told apart by line style), taken in family
    order from 40 distinct colours, so a family's mechanisms sit together in the legend."""
    palette = [plt.get_cmap("tab20")(i) for i in range(0, 20, 2)]
    palette += [plt.get_cmap("tab20b")(i) for i in range(0, 20, 4)]
    palette += [plt.get_cmap("tab20")(i) for i in range(1, 20, 2)]
    palette += [plt.get_cmap("tab20b")(i) for i in range(2, 20, 4)]
    mechs = _mechanism_order(df)
    by_mech = {m: palette[i % len(palette)] for i, m in enumerate(mechs)}
    keys = zip(df["mechanism"], df["path"], df["params"], strict=True)
    return {key: by_mech[key[0]] for key in keys}


def _mechanism_order(df: pd.DataFrame) -> list[str]:
    """Mechanisms in registry order (then any the registry does not know, as they appear), with
    each family's mechanisms together, families in the order of their first mechanism."""
    known = registry.names()
    seen = list(dict.fromkeys(df["mechanism"]))
    mechs = sorted(seen, key=lambda m: known.index(m) if m in known else len(known) + seen.index(m))
    family_of = dict(zip(df["mechanism"], df["family"], strict=True))
    families = list(dict.fromkeys(family_of[m] for m in mechs))
    return sorted(mechs, key=lambda m: families.index(family_of[m]))


def _ordered_series(df: pd.DataFrame) -> list[tuple]:
    """(family, mechanism, path, params) in legend order: mechanisms as above, paths by kind."""
    order = {m: i for i, m in enumerate(_mechanism_order(df))}
    kinds = {"reference": 0, "efficient": 1, "fused": 2}
    keys = dict.fromkeys(
        zip(df["family"], df["mechanism"], df["path"], df["params"], df["path_kind"], strict=True)
    )
    ordered = sorted(keys, key=lambda k: (order[k[1]], kinds.get(k[4], 3)))
    return list(dict.fromkeys(k[:4] for k in ordered))


def _fmt_n(n: float) -> str:
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _figure_keys(df: pd.DataFrame) -> list[tuple]:
    cols = ["direction", "causal", "device", "dtype", "head_dim"]
    return list(df[cols].drop_duplicates().itertuples(index=False, name=None))


def plot_results(csv: Path, out_dir: Path | None = None, fmt: str = "png") -> list[Path]:
    """Write one figure per (direction, causal, ...) into ``out_dir``; returns their paths."""
    if fmt not in FORMATS:
        raise AttnbenchError(f"--format {fmt!r}: accepted: {', '.join(FORMATS)}")
    df = read_results(csv)
    if df.empty:
        raise AttnbenchError(f"{csv}: the results CSV has no rows to plot")
    out_dir = out_dir if out_dir is not None else csv.parent / "figures"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AttnbenchError(f"--out {out_dir}: cannot create it ({e.strerror})") from None
    colors = _series_colors(df)
    keys = _figure_keys(df)
    # Device, dtype and head dim are named in the file name only when the file mixes them.
    vary = {c: df[c].nunique() > 1 for c in ("device", "dtype", "head_dim")}
    written = []
    for direction, causal, device, dtype, head_dim in keys:
        sub = df[
            (df["direction"] == direction)
            & (df["causal"] == causal)
            & (df["device"] == device)
            & (df["dtype"] == dtype)
            & (df["head_dim"] == head_dim)
        ]
        name = f"speed-{direction}-{'causal' if causal else 'bidir'}"
        if vary["device"]:
            name += f"-{device}"
        if vary["dtype"]:
            name += f"-{dtype}"
        if vary["head_dim"]:
            name += f"-d{head_dim}"
        path = out_dir / f"{name}.{fmt}"
        _figure(sub, colors, path)
        written.append(path)
    return written


def _figure(df: pd.DataFrame, colors: dict[tuple, tuple], path: Path) -> None:
    first = df.iloc[0]
    direction, causal = first["direction"], bool(first["causal"])
    mem_col = "mem_fwd_bytes" if direction == "fwd" else "mem_fwdbwd_bytes"
    series = _ordered_series(df)
    never_ran = []
    footnotes = []
    for _family, mech, p, params in series:
        s = df[(df["mechanism"] == mech) & (df["path"] == p) & (df["params"] == params)]
        if not (s["status"] == "ok").any():
            reasons = "; ".join(dict.fromkeys(s["status"] + ": " + s["reason"]))
            never_ran.append((mech, p, params))
            footnotes.append(f"{mech}:{p} did not run ({reasons})")
    n_notes = min(len(footnotes), MAX_FOOTNOTES)
    fig_h = 6.2 + 0.22 * n_notes
    fig, axes = plt.subplots(1, 3, figsize=(19, fig_h))
    bottom = (0.9 + 0.22 * n_notes) / fig_h
    fig.subplots_adjust(left=0.05, right=0.80, top=1 - 0.85 / fig_h, bottom=bottom, wspace=0.28)
    panels = (
        ("time_median_ms", "time per call (ms)", 1.0),
        ("tokens_per_s", "throughput (tokens/s)", 1.0),
        (mem_col, "peak memory (MiB)", 1 / 2**20),
    )
    lengths = sorted(df["seq_len"].unique())
    for ax, (col, ylabel, scale) in zip(axes, panels, strict=True):
        strip = blended_transform_factory(ax.transData, ax.transAxes)
        for index, (_family, mech, p, params) in enumerate(series):
            s = df[(df["mechanism"] == mech) & (df["path"] == p) & (df["params"] == params)]
            s = s.sort_values("seq_len")
            kind = s["path_kind"].iloc[0]
            color = colors[(mech, p, params)]
            # Every length of the series, NaN where it did not run: the line breaks there
            # instead of bridging the gap as if the cell had been measured.
            y = s[col].astype(float).where(s["status"] == "ok") * scale
            if y.notna().any():
                ax.plot(
                    s["seq_len"],
                    y,
                    KIND_STYLE.get(kind, "-"),
                    marker=KIND_MARKER.get(kind, "o"),
                    markersize=4,
                    color=color,
                    linewidth=1.6,
                    markerfacecolor="white" if kind == "reference" else color,
                )
            if (mech, p, params) in never_ran:
                continue
            for status, marker in STATUS_MARKER.items():
                bad = s[s["status"] == status]
                if not bad.empty:
                    # Spread the series' markers a little sideways so none hides another.
                    jitter = 2 ** (STRIP_JITTER * (index - (len(series) - 1) / 2))
                    ax.scatter(
                        bad["seq_len"] * jitter,
                        [STATUS_ROW[status]] * len(bad),
                        marker=marker,
                        s=60 if marker != "|" else 90,
                        color=color,
                        transform=strip,
                        clip_on=False,
                        zorder=5,
                        linewidths=1.8,
                    )
        if col == mem_col:
            _dense_line(ax, df, scale)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths)
        ax.set_xticklabels([_fmt_n(n) for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_title("time (lower is better)")
    axes[1].set_title("throughput (higher is better)")
    axes[2].set_title("peak memory, " + ("forward" if direction == "fwd" else "forward+backward"))
    _legends(fig, df, series, colors, never_ran)
    dname = first["device_name"]
    fig.suptitle(
        f"{'forward' if direction == 'fwd' else 'forward + backward'}, "
        f"{'causal' if causal else 'bidirectional'} — {first['device']} ({dname}), "
        f"{first['dtype']}, B={_batch_text(df)} H={first['heads']} D={first['head_dim']}, "
        f"{first['threads']} threads — suite {first['suite']}",
        fontsize=13,
        fontweight="bold",
    )
    if footnotes:
        shown = footnotes[:MAX_FOOTNOTES]
        if len(footnotes) > MAX_FOOTNOTES:
            shown.append(f"... and {len(footnotes) - MAX_FOOTNOTES} more (see the CSV)")
        fig.text(0.05, 0.2 / fig_h, "\n".join(shown), fontsize=8.5, va="bottom", family="monospace")
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend may extend past the axes
    plt.close(fig)


def _batch_text(df: pd.DataFrame) -> str:
    batches = sorted(df["batch"].unique())
    if len(batches) == 1:
        return str(batches[0])
    return f"{batches[-1]}..{batches[0]} (fixed tokens)"


def _dense_line(ax, df: pd.DataFrame, scale: float) -> None:
    first = df.iloc[0]
    per_n = df.groupby("seq_len")["batch"].max()
    n = per_n.index.to_numpy(dtype=float)
    itemsize = ITEMSIZE.get(first["dtype"], 4)
    y = per_n.to_numpy(dtype=float) * float(first["heads"]) * n**2 * itemsize * scale
    ax.plot(n, y, color="black", linewidth=1.0, linestyle=(0, (1, 2)), alpha=0.7)
    ax.annotate(
        "dense n² scores",
        (n[-1], y[-1]),
        textcoords="offset points",
        xytext=(-4, 4),
        ha="right",
        fontsize=8,
        alpha=0.8,
    )


def _legends(fig, df: pd.DataFrame, series: list[tuple], colors, never_ran) -> None:
    handles: list[Line2D] = []
    for family in dict.fromkeys(f for f, *_ in series):
        handles.append(Line2D([], [], linestyle="none", label=f"— {family} —"))
        for fam, mech, p, params in series:
            if fam != family:
                continue
            kind = df[(df["mechanism"] == mech) & (df["path"] == p)]["path_kind"].iloc[0]
            label = f"{mech}:{p}" + (f" [{params}]" if params and len(params) <= 24 else "")
            if (mech, p, params) in never_ran:
                label += " (not run)"
            handles.append(
                Line2D(
                    [],
                    [],
                    color=colors[(mech, p, params)],
                    linestyle=KIND_STYLE.get(kind, "-"),
                    marker=KIND_MARKER.get(kind, "o"),
                    markersize=4,
                    markerfacecolor="white" if kind == "reference" else colors[(mech, p, params)],
                    label=label,
                )
            )
    status_handles = [
        Line2D([], [], linestyle="none", marker=m, color="0.3", markersize=7, label=s)
        for s, m in STATUS_MARKER.items()
        if (df["status"] == s).any()
    ]
    if status_handles:
        handles.append(Line2D([], [], linestyle="none", label="— not measured (bottom strip) —"))
        handles.extend(status_handles)
    ncol = 1 if len(handles) <= 34 else 2
    leg = fig.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(0.805, 1 - 0.9 / fig.get_figheight()),
        fontsize=8 if ncol == 1 else 7,
        ncol=ncol,
        frameon=False,
        handlelength=2.6,
    )
    for text in leg.get_texts():
        if text.get_text().startswith("— "):
            text.set_fontweight("bold")
