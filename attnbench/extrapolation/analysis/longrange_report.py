"""What a run with ``eval.long_range`` writes beside the main table: ``longrange.csv`` (one row
per variant, seed, length and distance: accuracy on the copy and the no-copy level, the same
bytes with nothing to copy from; rewritten as the rows come, like ``extrapolate.csv``),
``longrange.md`` (the same statistics as the main table, on the copy accuracy pooled over the
distances beyond the training length and, apart, below it) and ``standard_vs_long_range.png``
(the two spans side by side).

Each model row of the main table carries its long-range cells under :data:`CELLS` (not a CSV
column of ``extrapolate.csv``), so the evaluation tasks need no second kind of row.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.extrapolation.analysis import figures, report, stats
from attnbench.extrapolation.evaluation.longrange import LongRangeResult
from attnbench.runtime.outputs import atomic_open, save_figure

#: The row key holding a model row's long-range cells (a list of :class:`LongRangeResult`).
CELLS = "_long_range"
CSV_NAME, TABLE_NAME, FIGURE_NAME = (
    "longrange.csv",
    "longrange.md",
    "standard_vs_long_range.png",
)
COLUMNS = ["variant", "kind", "seed", "train_len", "eval_len", "distance", "copy_length",
           "scored", "correct", "no_copy_correct", "accuracy", "no_copy_accuracy"]  # fmt: skip


def cell_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat dict per long-range cell of ``rows``."""
    out = []
    for row in rows:
        for cell in row.get(CELLS) or ():
            out.append(_flat(row, cell))
    return out


def _flat(row: dict[str, Any], cell: LongRangeResult) -> dict[str, Any]:
    return {
        "variant": row["variant"],
        "kind": row["kind"],
        "seed": row["seed"],
        "train_len": row["train_len"],
        "eval_len": cell.n,
        "distance": cell.distance,
        "copy_length": cell.length,
        "scored": cell.scored,
        "correct": cell.correct,
        "no_copy_correct": cell.no_copy_correct,
        "accuracy": round(cell.accuracy, 6),
        "no_copy_accuracy": round(cell.no_copy_accuracy, 6),
    }


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> bool:
    """``longrange.csv`` from the rows so far; False (nothing written) when none has cells."""
    cells = cell_rows(rows)
    if not cells:
        return False
    with atomic_open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(cells)
    return True


def pooled(cells: pd.DataFrame, beyond: bool, level: str = "accuracy") -> list[dict[str, Any]]:
    """Per (variant, seed, length): accuracy over the scored bytes of every distance beyond the
    training length (``beyond``) or below it, summed before dividing; rows shaped like the main
    table's, so its statistics apply. ``level``: ``accuracy`` (with the copy) or
    ``no_copy_accuracy`` (the control: the same bytes, nothing to copy from)."""
    side = cells["distance"] >= cells["train_len"]
    part = cells[side if beyond else ~side]
    hits = "correct" if level == "accuracy" else "no_copy_correct"
    out = []
    keys = ["variant", "kind", "seed", "train_len", "eval_len"]
    for (variant, kind, seed, train_len, n), g in part.groupby(keys, sort=False, dropna=False):
        scored = int(g["scored"].sum())
        out.append(
            {
                "variant": variant,
                "kind": kind,
                "seed": seed,
                "train_len": train_len,
                "eval_len": n,
                "accuracy": 100.0 * int(g[hits].sum()) / max(1, scored),
                "masked_tokens": scored,
                "status": "ok",
            }
        )
    return out


def _section(title: str, rows: list[dict[str, Any]], lengths: Sequence[int]) -> list[str]:
    if not rows:
        return [f"## {title}", "", "(no distance on this side at the evaluated lengths)", ""]
    summary = report.summarise(rows)
    lines = [f"## {title}", "", report.markdown_table(summary, lengths, published=False), ""]
    diff = report.paired_difference(rows)
    if not diff.empty:
        lines += [
            "Difference to O, paired by seed: mean [95 % t-interval] p of the paired t-test, and "
            "the sign count; bold where p < 0.05 (descriptive: no correction for the number of "
            "cells).",
            "",
            report.markdown_difference(diff, lengths),
            "",
        ]
    return lines


def markdown(rows: Sequence[dict[str, Any]], train_len: int, title: str, command: str) -> str:
    """``longrange.md``: the copy accuracy beyond L and below it (mean ± std over seeds, paired
    differences to O), the no-copy level, and how the span is made."""
    cells = pd.DataFrame(cell_rows(rows))
    lengths = sorted(int(n) for n in cells["eval_len"].unique())
    distances = sorted(int(d) for d in cells["distance"].unique())
    lines = [
        f"# {title}: the long-range span",
        "",
        f"Made by: `{command}`",
        "",
        "Each evaluation window of length n (the main table's text and masks) holds a verbatim "
        "copy of its own earlier bytes at distance d; accuracy (%) is scored on the masked bytes "
        "of the copy whose byte d back is visible, pooled over the distances on one side of the "
        f"training length L = {train_len} (scored bytes summed, then divided). The no-copy level "
        "is the same model on the control windows, where the copy and its source are swapped: the "
        "same bytes with the same neighbours and targets, nothing to copy from. A row that reads "
        "only a window falls to it beyond that window; a row "
        f"that reads the whole window keeps copying. Distances: {', '.join(map(str, distances))} "
        "(each length n scores those with room for a copy of 16 bytes or more); per-distance "
        "numbers in `longrange.csv`.",
        "",
    ]
    beyond = pooled(cells, beyond=True)
    lines += _section(f"Copy accuracy, distances d >= L = {train_len}", beyond, lengths)
    lines += _section(
        f"No-copy level at the same bytes, d >= L = {train_len}",
        pooled(cells, beyond=True, level="no_copy_accuracy"),
        lengths,
    )
    lines += _section(
        f"Copy accuracy, distances d < L = {train_len}", pooled(cells, False), lengths
    )
    lines += _against_window(rows, beyond, train_len, lengths)
    return "\n".join(lines).rstrip() + "\n"


#: The row every other is read against on both spans: a window of keys around each query.
WINDOW_ROW = "O+local"


def _against_window(
    rows: Sequence[dict[str, Any]],
    beyond: list[dict[str, Any]],
    train_len: int,
    lengths: Sequence[int],
) -> list[str]:
    """Every model row minus :data:`WINDOW_ROW`, paired by seed, on the standard span and on
    the copy beyond L: does a row that attends over every key match the window where the task
    is local and beat it where it is not? [] when the run has no window row."""
    standard = [r for r in rows if r.get("status") == "ok"]
    if WINDOW_ROW not in {r["variant"] for r in standard}:
        return []
    lines = [
        f"## Against the window row {WINDOW_ROW}",
        "",
        f"Each model row minus {WINDOW_ROW} (every query sees only the keys within its window), "
        "paired by seed, in the format above (descriptive). A row that attends over every key "
        "should be close to it on the standard span, where the task is mostly local, and above it "
        f"on the long-range span beyond L = {train_len}, where only reading far back helps.",
        "",
    ]
    for name, span_rows in (
        ("Standard span", standard),
        (f"Long-range span, copy accuracy at d >= L = {train_len}", beyond),
    ):
        diff = report.paired_difference(span_rows, base=WINDOW_ROW)
        if diff.empty:
            continue
        lines += [f"{name}:", "", report.markdown_difference(diff, lengths, base=WINDOW_ROW), ""]
    return lines


def figure(standard: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], train_len: int,
           path: Path, title: str) -> None:  # fmt: skip
    """Two panels: the standard span's accuracy (the main table's rows, count floors included)
    and the long-range copy accuracy beyond L (dotted: each row's no-copy level), against n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = pd.DataFrame(cell_rows(rows))
    lengths = sorted({int(r["eval_len"]) for r in standard})
    panels = [
        ("standard span", report.summarise(standard), None),
        (
            f"long-range span: copy at d >= L = {train_len} (dotted: without the copy)",
            report.summarise(pooled(cells, beyond=True)),
            report.summarise(pooled(cells, beyond=True, level="no_copy_accuracy")),
        ),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.2))
    variants = list(dict.fromkeys(r["variant"] for r in standard))
    colours = plt.get_cmap("tab20").colors
    colour = {v: colours[(2 * i) % 20 + (2 * i // 20) % 2] for i, v in enumerate(variants)}
    for ax, (name, summary, no_copy) in zip(axes, panels, strict=True):
        for variant, g in summary.groupby("variant", sort=False):
            g = g.dropna(subset=["mean"]).sort_values("eval_len")
            if g.empty:
                continue
            half = [
                stats.interval_half_width(s, int(c))
                for s, c in zip(g["std"], g["count"], strict=True)
            ]
            style = figures.floor_style(variant) if g["kind"].iloc[0] == "baseline" else {
                "color": colour.get(variant), "marker": "o", "markersize": 4, "label": variant,
                "linestyle": "-" if g["kind"].iloc[0] == "trained" else "--",
            }  # fmt: skip
            ax.errorbar(g["eval_len"], g["mean"], yerr=[0 if math.isnan(h) else h for h in half],
                        capsize=3, **style)  # fmt: skip
        if no_copy is not None:
            for variant, g in no_copy.groupby("variant", sort=False):
                g = g.sort_values("eval_len")
                ax.plot(g["eval_len"], g["mean"], linestyle=":", color=colour.get(variant))
        figures.length_axis(ax, lengths, train_len, name)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, dpi=130)
    plt.close(fig)
