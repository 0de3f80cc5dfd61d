"""A comparison as markdown (a CI job summary) and as plain data (``--format json``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from attnbench.bench.compare.records import Comparison
from attnbench.bench.thresholds import VERDICT_ORDER


def markdown(cmp: Comparison, everything: bool = False) -> str:
    """The comparison as GitHub-flavoured markdown (for a CI job summary)."""
    lines = [
        "## attnbench compare",
        "",
        f"**{cmp.headline()}**",
        "",
        f"- current: `{cmp.current}` {cmp.provenance.get(str(cmp.current), '')}",
        f"- baseline: `{cmp.baseline}` {cmp.provenance.get(str(cmp.baseline), '')}",
        *(f"- re-run: `{p}` {cmp.provenance.get(str(p), '')}" for p in cmp.confirmed_by),
        f"- thresholds: {cmp.describe()}",
    ]
    lines += [f"- warning: {w}" for w in cmp.warnings]
    lines += [f"- note: {n}" for n in cmp.notes]
    shown = cmp.shown(everything)
    if shown:
        lines += [
            "",
            "| case | metric | baseline | current | ratio | p | verdict | note |",
            "|---|---|---|---|---:|---:|---|---|",
        ]
        for ln in shown:
            ratio = f"{ln.ratio:.3f}" if ln.ratio is not None else ""
            p = f"{ln.p_value:.2g}" if ln.p_value is not None else ""
            verdict = f"**{ln.verdict}**" if ln.verdict == "worse" else ln.verdict
            cells = (ln.case, ln.metric, ln.baseline, ln.current, ratio, p, verdict, ln.note)
            lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in cells) + " |")
    return "\n".join(lines) + "\n"


def as_json(cmp: Comparison) -> dict[str, Any]:
    """The comparison as plain data (``attnbench compare --format json``)."""
    return {
        "current": str(cmp.current),
        "baseline": str(cmp.baseline),
        "confirmed_by": [str(p) for p in cmp.confirmed_by],
        "exit_code": cmp.exit_code,
        "headline": cmp.headline(),
        "compared": cmp.compared,
        "counts": {v: cmp.count(v) for v in VERDICT_ORDER},
        "thresholds": asdict(cmp.thresholds),
        "limits": asdict(cmp.limits),
        "provenance": dict(cmp.provenance),
        "warnings": list(cmp.warnings),
        "notes": list(cmp.notes),
        "lines": [asdict(line) for line in cmp.lines],
    }
