"""Every series of a history fitted at once (:mod:`.steps` on :mod:`.store`), and its changes as
plain records (``attnbench history steps``, the page)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attnbench.bench.history.steps import THRESHOLD, Change, Fit, detect
from attnbench.bench.history.store import History, Series
from attnbench.core.errors import AttnbenchError


@dataclass(frozen=True)
class Fitted:
    """One series and its fit."""

    series: Series
    fit: Fit


def check_threshold(threshold: float) -> float:
    if not threshold > 1:
        raise AttnbenchError(f"--threshold {threshold}: accepted: a factor > 1 (e.g. 1.1)")
    return threshold


def analyse(history: History, metric: str = "auto", threshold: float = THRESHOLD) -> list[Fitted]:
    """Every series of ``history`` on ``metric`` with its steps and drifts."""
    check_threshold(threshold)
    series = history.series(metric)
    fits = detect([s.values for s in series], threshold)
    return [Fitted(s, f) for s, f in zip(series, fits, strict=True)]


def describe(change: Change) -> str:
    """``step x1.31`` or ``drift x1.48 over 8 commits (x1.050 per commit)``."""
    if change.kind == "step":
        return f"step x{change.size:.3f}"
    return (
        f"drift x{change.size:.3f} over {change.commits} commits "
        f"(x{change.per_commit:.3f} per commit)"
    )


def change_record(fitted: Fitted, change: Change) -> dict[str, Any]:
    """One change as plain data: the case, its environment, the commits, size, confidence."""
    s = fitted.series
    return {
        "case": s.label,
        "metric": s.metric,
        "machine_class": s.env.machine_class,
        "versions": s.env.versions,
        "suite": s.env.suite,
        "kind": change.kind,
        "slower": change.size > 1,
        "last_commit_before": s.commits[change.before],
        "first_commit_after": s.commits[change.after],
        "commits": change.commits,
        "size": round(change.size, 4),
        "per_commit": round(change.per_commit, 4),
        "level_before": round(change.level_before, 6),
        "level_after": round(change.level_after, 6),
        "p_value": float(f"{change.p_value:.3g}"),
        "confidence": change.confidence,
        "noise_sigma": round(fitted.fit.sigma, 4),
        "series_commits": len(s.commits),
    }


def change_records(fitted: Sequence[Fitted]) -> list[dict[str, Any]]:
    """Every change of every series, slower ones first, the largest first."""
    records = [change_record(f, c) for f in fitted for c in f.fit.changes]
    return sorted(records, key=lambda r: (not r["slower"], -abs(r["size"] - 1)))
