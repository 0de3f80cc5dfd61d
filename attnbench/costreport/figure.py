"""The report's figure: one per machine, a panel per evaluated length n.

In each panel every joined row is a point, x its attention time per token (log scale), y its
accuracy with the 95 % t-interval as a bar; the Pareto front (no other row is both faster and
more accurate) is a step line through its points, which are labelled; each count row (no model)
is a horizontal line, the floor a model has to beat; the panel at the training length is titled
so. Colours name the rows in one legend for all panels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from attnbench.bench import figstyle  # matplotlib, Agg backend
from attnbench.costreport.join import Floor, Point, Report
from attnbench.runtime.outputs import save_figure

plt = figstyle.plt
COLUMNS = 3
KIND_MARKER = {"trained": "o", "eval-time": "s"}
FLOOR_STYLES = ("-.", ":", "--")


def panel_title(n: int, train_len: int) -> str:
    """``n = 64 = L (training length)`` at the training length, else ``n = 256 (4 L)``."""
    if n == train_len:
        return f"n = {n} = L (training length)"
    return f"n = {n} ({n / train_len:g} L)"


def draw(report: Report, machine: str, path: Path, title: str) -> Path:
    """The figure of ``report``'s points on ``machine`` into ``path``."""
    lengths = report.lengths
    rows = math.ceil(len(lengths) / COLUMNS)
    cols = min(COLUMNS, len(lengths))
    fig, axes = plt.subplots(
        rows, cols, figsize=(5.0 * cols, 4.2 * rows), squeeze=False, sharex=True, sharey=True
    )
    points = [p for p in report.points if p.machine == machine]
    colours = _colours([p.variant for p in report.points])
    for ax, n in zip(axes.flat, lengths, strict=False):
        at_n = [p for p in points if p.eval_len == n]
        _panel(ax, at_n, [f for f in report.floors if f.eval_len == n], colours)
        ax.set_title(panel_title(n, report.model.train_len), fontsize=10)
    spare = list(axes.flat)[len(lengths) :]
    for ax in spare:
        ax.axis("off")
    handles, labels = _legend_entries(axes.flat)
    if spare:  # the legend in the first empty cell of the grid
        spare[0].legend(handles, labels, loc="center", fontsize=7, ncol=2, frameon=False)
    else:  # beside the grid
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.0, 1, 0.96))
    save_figure(fig, path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


def _colours(variants: Sequence[str]) -> dict[str, tuple]:
    palette = plt.get_cmap("tab20").colors
    order = list(dict.fromkeys(variants))
    return {v: palette[(2 * i) % 20 + (2 * i // 20) % 2] for i, v in enumerate(order)}


def _panel(ax, points: list[Point], floors: list[Floor], colours: dict[str, tuple]) -> None:
    if not points:
        ax.text(0.5, 0.5, "no row joined at this n", transform=ax.transAxes, ha="center",
                color="0.4", fontsize=9)  # fmt: skip
    for p in points:
        acc = p.accuracy
        err = None
        if not math.isnan(acc.low):
            err = [[acc.mean - acc.low], [acc.high - acc.mean]]
        ax.errorbar(
            [p.time_per_token_ns],
            [acc.mean],
            yerr=err,
            marker=KIND_MARKER.get(p.kind, "o"),
            color=colours[p.variant],
            markersize=5,
            capsize=3,
            linestyle="none",
            label=p.variant,
        )
    _front(ax, [p for p in points if p.pareto])
    for floor, style in zip(floors, FLOOR_STYLES * len(floors), strict=False):
        ax.axhline(floor.accuracy.mean, color="black", linestyle=style, linewidth=1.0,
                   label=f"{floor.variant} (no model)")  # fmt: skip
    ax.set_xscale("log")
    ax.margins(x=0.2)
    ax.tick_params(labelbottom=True, labelleft=True)  # shared axes: every panel keeps its scale
    ax.set_xlabel("attention time per token (ns)")
    ax.set_ylabel("masked-token accuracy (%)")
    ax.grid(True, which="both", alpha=0.25)


def _front(ax, front: list[Point]) -> None:
    """The Pareto front as a step line (best accuracy so far, from the fastest), labelled."""
    if not front:
        return
    front = sorted(front, key=lambda p: (p.time_per_token_ns, -p.accuracy.mean))
    xs = [p.time_per_token_ns for p in front]
    ys = [p.accuracy.mean for p in front]
    ax.step(xs, ys, where="post", color="0.35", linewidth=1.0, alpha=0.8, label="Pareto front")
    same: dict[tuple[float, float], list[str]] = {}  # rows at one point (tricks at n <= L)
    for p in front:
        same.setdefault((p.time_per_token_ns, p.accuracy.mean), []).append(p.variant)
    for (x, y), names in same.items():
        label = names[0] + (f" (+{len(names) - 1} equal)" if len(names) > 1 else "")
        ax.annotate(label, (x, y), fontsize=6, xytext=(4, 3), textcoords="offset points")


def _legend_entries(axes) -> tuple[list, list[str]]:
    """Each label once, over every panel."""
    seen: dict[str, object] = {}
    for ax in axes:
        handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels, strict=True):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen)
