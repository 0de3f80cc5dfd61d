"""The history page (``attnbench history report``): one static HTML file, no server, no network.

A table of the steps and drifts found, slower first, then per environment (machine class,
versions, suite) one plot per case family: the family's mechanisms in one direction and causal
flag, one line per case, its value on a log scale against the commits in the order they were
measured (:mod:`.svg`). Hovering a point shows its case, commit, date and value (SVG
``<title>``); a few lines of inline script also show it under the plot, and record on the page
how many points and step marks the browser laid out (``data-drawn-points``,
``data-drawn-steps`` on each plot), which the tests read back from a headless browser.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

from attnbench.bench.history.analysis import Fitted, analyse, change_records, describe
from attnbench.bench.history.steps import THRESHOLD
from attnbench.bench.history.store import Env, History, runs_text
from attnbench.bench.history.svg import PALETTE, STEP_COLOUR, plot_svg
from attnbench.core.errors import AttnbenchError
from attnbench.runtime.outputs import ensure_dir, write_text

PAGE_NAME = "index.html"

_STYLE = f"""
body {{ font-family: sans-serif; margin: 1.5em; color: #222; max-width: 1100px; }}
h2 {{ border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ddd; padding: 3px 6px; text-align: left; }}
.slower {{ color: {STEP_COLOUR}; font-weight: bold; }}
.legend {{ font-size: 12px; columns: 2; margin: .3em 0 0 0; padding: 0; list-style: none; }}
.legend span {{ display: inline-block; width: 12px; height: 3px; vertical-align: middle;
  margin-right: 4px; }}
.hover {{ font-family: monospace; font-size: 12px; min-height: 3.6em; white-space: pre; }}
"""

# Shows a point's title under its plot on hover; records what the browser laid out.
_SCRIPT = """
for (const plot of document.querySelectorAll('figure.family')) {
  const svg = plot.querySelector('svg.plot'), out = plot.querySelector('.hover');
  const shown = (el) => {
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0;
  };
  svg.dataset.drawnPoints = [...svg.querySelectorAll('circle.point')].filter(shown).length;
  svg.dataset.drawnSteps = [...svg.querySelectorAll('g.step, g.drift')].filter(shown).length;
  svg.addEventListener('mouseover', (e) => {
    const title = e.target.closest('circle, g.step, g.drift')?.querySelector('title');
    if (title) out.textContent = title.textContent;
  });
}
document.body.dataset.drawn = 'yes';
"""


@dataclass(frozen=True)
class Family:
    """The series of one plot: a family's cases in one direction and causal flag, one metric."""

    env: Env
    family: str
    direction: str
    causal: bool
    metric: str
    fitted: tuple[Fitted, ...]

    @property
    def title(self) -> str:
        return f"{self.family}: {self.direction} {'causal' if self.causal else 'bidir'}"

    @property
    def anchor(self) -> str:
        env = hashlib.sha1(self.env.describe().encode()).hexdigest()[:8]
        tag = f"{self.family}-{self.direction}-{self.causal}-{self.metric}-{env}"
        return "".join(ch if ch.isalnum() else "-" for ch in tag)


def families(fitted: Sequence[Fitted]) -> list[Family]:
    """The plots: ``fitted`` grouped by environment, family, direction, causal flag, metric."""
    groups: dict[tuple, list[Fitted]] = {}
    for f in fitted:
        s = f.series
        groups.setdefault((s.env, s.family, s.direction, s.causal, s.metric), []).append(f)
    return [
        Family(*key, tuple(members))
        for key, members in sorted(
            groups.items(), key=lambda kv: (kv[0][0].describe(), *map(str, kv[0][1:]))
        )
    ]


def _changes_table(fitted: Sequence[Fitted], anchors: dict[str, str]) -> str:
    records = change_records(fitted)
    if not records:
        return "<p>No step or drift beyond the threshold in any series.</p>"
    rows = []
    for r in records:
        link = anchors.get(r["case"] + r["machine_class"] + r["versions"] + r["suite"], "")
        cls = ' class="slower"' if r["slower"] else ""
        what = "slower" if r["slower"] else "faster"
        rows.append(
            f'<tr><td><a href="#{link}">{escape(r["case"])}</a></td><td{cls}>{r["kind"]}, '
            f"{what}</td><td>x{r['size']:.3f}</td><td>{r['commits']}</td>"
            f"<td>{escape(r['last_commit_before'][:10])} .. "
            f"{escape(r['first_commit_after'][:10])}</td><td>{r['confidence']} "
            f"(p = {r['p_value']:.2g})</td><td>{escape(r['machine_class'])}</td></tr>"
        )
    head = (
        "<tr><th>case</th><th>change</th><th>size</th><th>commits</th><th>last before .. "
        "first after</th><th>confidence</th><th>machine class</th></tr>"
    )
    return f"<table>{head}{''.join(rows)}</table>"


def _figure(family: Family, commits: list[str], started: dict[str, str]) -> str:
    legend = "".join(
        f'<li><span style="background:{PALETTE[i % len(PALETTE)]}"></span>'
        f"{escape(f.series.label)}"
        + "".join(f' <b class="slower">{escape(describe(c))}</b>' for c in f.fit.changes)
        + "</li>"
        for i, f in enumerate(family.fitted)
    )
    svg = plot_svg(family.fitted, commits, started, family.metric)
    return (
        f'<figure class="family" id="{family.anchor}"><h3>{escape(family.title)}</h3>'
        f'{svg}<div class="hover"></div><ul class="legend">{legend}</ul></figure>'
    )


def _window(fitted: Fitted, shown: set[str]) -> Fitted | None:
    """``fitted`` cut to its commits in ``shown`` (a suffix of its environment's commits), the
    changes between two shown commits kept; None when none is shown."""
    s = fitted.series
    cut = next((i for i, c in enumerate(s.commits) if c in shown), len(s.commits))
    if cut == len(s.commits):
        return None
    series = dataclasses.replace(
        s, commits=s.commits[cut:], values=s.values[cut:], runs=s.runs[cut:]
    )
    changes = tuple(
        dataclasses.replace(c, before=c.before - cut, after=c.after - cut)
        for c in fitted.fit.changes
        if c.before >= cut
    )
    return Fitted(series, dataclasses.replace(fitted.fit, changes=changes))


def page(
    history: History, fitted: Sequence[Fitted], threshold: float, last: int | None = None
) -> str:
    """The whole page as one HTML string (``last``: plot only the last commits of each
    environment; the table lists every change)."""
    plots = families(fitted)
    anchors = {
        f.series.label + p.env.machine_class + p.env.versions + p.env.suite: p.anchor
        for p in plots
        for f in p.fitted
    }
    body, env = [], None
    timeline: dict[Env, list[tuple[str, str]]] = {}
    for plot in plots:
        if plot.env != env:
            env = plot.env
            every = history.commits(env)
            timeline[env] = every[-last:] if last else every
            shown = f"the last {len(timeline[env])} of " if len(timeline[env]) < len(every) else ""
            body.append(
                f"<h2>{escape(env.machine_class)}</h2><p>{escape(env.versions)}; "
                f"suite {escape(env.suite)}; {shown}{len(every)} commits</p>"
            )
        commits = [c for c, _ in timeline[env]]
        kept = [w for f in plot.fitted if (w := _window(f, set(commits))) is not None]
        if kept:
            windowed = dataclasses.replace(plot, fitted=tuple(kept))
            body.append(_figure(windowed, commits, dict(timeline[env])))
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    intro = (
        f"<p>{runs_text(history.runs())} in <code>{escape(str(history.folder))}</code>, "
        f"{len(fitted)} series, {len(plots)} plots; steps and drifts beyond "
        f"x{threshold:g} (made {now}). Hover a point for its commit.</p>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>attnbench results history</title>"
        f"<style>{_STYLE}</style></head><body><h1>attnbench results history</h1>{intro}"
        f"<h2>Steps and drifts</h2>{_changes_table(fitted, anchors)}{''.join(body)}"
        f"<script>{_SCRIPT}</script></body></html>\n"
    )


@dataclass(frozen=True)
class Written:
    path: Path
    plots: int
    series: int
    changes: int


def write_report(
    folder: Path,
    out: Path,
    metric: str = "auto",
    threshold: float = THRESHOLD,
    last: int | None = None,
) -> Written:
    """Write the page of the history in ``folder`` to ``out``/index.html (``last``: plot the
    last commits of each environment only)."""
    if last is not None and last < 2:
        raise AttnbenchError(f"--last {last}: accepted: a number of commits >= 2")
    with History(folder) as history:
        fitted = analyse(history, metric, threshold)
        if not fitted:
            raise AttnbenchError(f"{folder}: the history has no measured case to plot")
        html = page(history, fitted, threshold, last)
    ensure_dir(out, "--out folder")
    path = out / PAGE_NAME
    write_text(path, html)
    changes = sum(len(f.fit.changes) for f in fitted)
    return Written(path, len(families(fitted)), len(fitted), changes)
