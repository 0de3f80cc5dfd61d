"""One plot of the history page as inline SVG: a case family's series, value (log scale) against
commit, each point with its commit in a ``<title>`` (the browser shows it on hover), each step a
dashed vertical line and each drift a shaded band, both with their own ``<title>``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from attnbench.bench.history.analysis import Fitted, describe

WIDTH, HEIGHT = 760, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 58
#: Line colours (matplotlib's tab10), one per series, in turn.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
)
#: Steps and drifts in the step colour (a red no series uses).
STEP_COLOUR = "#d62728"
_NICE = (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8)


@dataclass(frozen=True)
class Axes:
    """Commit index -> x, value -> y (log scale) inside the plot area."""

    commits: int
    low: float  # log10 of the lowest value shown
    high: float

    def x(self, index: float) -> float:
        span = max(self.commits - 1, 1)
        return LEFT + (WIDTH - LEFT - RIGHT) * (index / span if self.commits > 1 else 0.5)

    def y(self, value: float) -> float:
        frac = (math.log10(value) - self.low) / (self.high - self.low)
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - frac)


def axes_for(fitted: Sequence[Fitted], commits: int) -> Axes:
    values = [v for f in fitted for v in f.series.values]
    low, high = math.log10(min(values)), math.log10(max(values))
    pad = max((high - low) * 0.08, 0.02)
    return Axes(commits, low - pad, high + pad)


def y_ticks(axes: Axes) -> list[float]:
    """Round values inside the axis: 1-1.2-1.5-2-... per decade, thinned to at most 8."""
    ticks = [
        m * 10.0**k
        for k in range(math.floor(axes.low) - 1, math.ceil(axes.high) + 1)
        for m in _NICE
        if axes.low <= math.log10(m * 10.0**k) <= axes.high
    ]
    while len(ticks) > 8:
        ticks = ticks[::2]
    if len(ticks) < 3:
        ticks = [10 ** (axes.low + (axes.high - axes.low) * f) for f in (0.15, 0.5, 0.85)]
    return ticks


def _number(value: float) -> str:
    return f"{value:.3g}"


def _frame(axes: Axes, commits: Sequence[str], metric: str) -> list[str]:
    """Axes, grid lines, tick labels (every few commits' short hash) and axis titles."""
    out = [
        f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
        f'height="{HEIGHT - TOP - BOTTOM}" fill="#fff" stroke="#999"/>'
    ]
    for tick in y_ticks(axes):
        y = axes.y(tick)
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
        )
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_number(tick)}</text>')
    every = max(1, math.ceil(len(commits) / 10))
    for i in range(0, len(commits), every):
        x = axes.x(i)
        out.append(
            f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 14}" text-anchor="end" '
            f'transform="rotate(-30 {x:.1f} {HEIGHT - BOTTOM + 14})">'
            f"{escape(commits[i][:7])}</text>"
        )
    out.append(
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 4}" text-anchor="middle">'
        "commit (in the order measured)</text>"
    )
    out.append(
        f'<text x="14" y="{(TOP + HEIGHT - BOTTOM) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(TOP + HEIGHT - BOTTOM) / 2})">'
        f"{escape(metric)} (log)</text>"
    )
    return out


def _series(
    fitted: Fitted, axes: Axes, position: dict[str, int], colour: str, started: dict[str, str]
) -> list[str]:
    """One series: its line and its points, each point titled with case, commit and value."""
    s = fitted.series
    xy = [(axes.x(position[c]), axes.y(v)) for c, v in zip(s.commits, s.values, strict=True)]
    label = escape(s.label)
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    out = [
        f'<g class="series" data-case="{label}">',
        f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5">'
        f"<title>{label}</title></polyline>",
    ]
    for (x, y), commit, value, runs in zip(xy, s.commits, s.values, s.runs, strict=True):
        when = started.get(commit, "")[:16].replace("T", " ")
        title = (
            f"{label}\ncommit {escape(commit)}\n{escape(when)}\n{escape(s.metric)} = "
            f"{value:.4g} (median of {runs} run{'s' * (runs > 1)})"
        )
        out.append(
            f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}" '
            f'data-commit="{escape(commit)}"><title>{title}</title></circle>'
        )
    out.append("</g>")
    return out


def _changes(fitted: Fitted, axes: Axes, position: dict[str, int]) -> list[str]:
    """A dashed line between the two commits of each step, a band over each drift."""
    s, out = fitted.series, []
    for change in fitted.fit.changes:
        before, after = s.commits[change.before], s.commits[change.after]
        x0, x1 = axes.x(position[before]), axes.x(position[after])
        title = escape(
            f"{describe(change)}: {s.label}\nbetween commit {before[:10]} and "
            f"{after[:10]}\nconfidence {change.confidence} (p = "
            f"{change.p_value:.2g})"
        )
        top, height = TOP, HEIGHT - TOP - BOTTOM
        if change.kind == "step":
            x = (x0 + x1) / 2
            out.append(
                f'<g class="step"><line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" '
                f'y2="{top + height}" stroke="{STEP_COLOUR}" stroke-width="2" '
                f'stroke-dasharray="6 3"/><path d="M{x - 6:.1f},{top} h12 l-6,9 z" '
                f'fill="{STEP_COLOUR}"/><title>{title}</title></g>'
            )
        else:
            out.append(
                f'<g class="drift"><rect x="{x0:.1f}" y="{top}" '
                f'width="{max(x1 - x0, 2):.1f}" height="{height}" fill="{STEP_COLOUR}" '
                f'fill-opacity="0.12"/><title>{title}</title></g>'
            )
    return out


def plot_svg(
    fitted: Sequence[Fitted], commits: Sequence[str], started: dict[str, str], metric: str
) -> str:
    """The SVG of one plot: ``fitted`` (series of one metric), against ``commits`` (the
    environment's, in order; ``started``: when each was first measured)."""
    position = {c: i for i, c in enumerate(commits)}
    axes = axes_for(fitted, len(commits))
    parts = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-size="11" '
        'font-family="sans-serif">',
        *_frame(axes, commits, metric),
    ]
    for f in fitted:
        parts.extend(_changes(f, axes, position))
    for i, f in enumerate(fitted):
        parts.extend(_series(f, axes, position, PALETTE[i % len(PALETTE)], started))
    parts.append("</svg>")
    return "\n".join(parts)
