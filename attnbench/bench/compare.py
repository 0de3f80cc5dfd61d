"""Compare a speed run with a baseline, on what stays stable on a noisy, shared machine.

Rows are matched by their key (:data:`attnbench.bench.results.KEY`: mechanism, path, params,
dtype, shape, causal, direction). For each matched pair:

* **time** — not absolute time, which swings 10-20 % between jobs on shared CI and up to 2x, but
  ``ref_ratio``: the case's time over the reference mechanism's, per interleaved round, median
  over rounds (the same run, the same load). The statistic is ``change = current ref_ratio /
  baseline ref_ratio``. A case is *worse* when ``change > time_ratio`` AND the two p20..p80 bands
  do not overlap (current p20 > baseline p80): the ratio moved by more than the threshold and by
  more than its own noise (asv asks for a factor and a significance test for the same reason).
  *Better* is the mirror image.
* **time of the reference itself** (its ratio is 1 by construction): ``time_median_ms`` times the
  run's own measured matmul FLOP/s, i.e. time in units of "matmul work", which removes most of a
  machine's speed; this calibration is not interleaved, so its threshold ``ref_time_ratio`` is
  wider.
* **FLOPs** — counted, not measured: any difference is a regression (refresh the baseline when a
  count is meant to change).
* **peak memory** — when both rows name a deterministic method (``dispatch-live-bytes``):
  worse when current > baseline x (1 + ``mem_tolerance``) + ``mem_slack_bytes``; other methods
  use ``mem_tolerance_other``.
* **status** — ``ok`` turning into ``oom`` or ``error`` (or ``unsupported``) is a regression; the
  reverse an improvement. ``skipped`` (the sweep's ``max_call_s``, predicted from the same path at
  a smaller n) is *not run*, not a regression: a load burst can trip it, and a real slowdown shows
  in that smaller case, which is compared.

**Confirmation** (``confirm``: results of the same grid run again): a quantity counts as *worse*
only when it is worse in this run and in every re-run; one that is worse in this run alone is
*unconfirmed*, reported and not failed. A slowdown that the code causes repeats; a neighbour's
burst of load on a shared machine rarely hits the same case twice. ``.ci/run`` re-runs the grid
only when the first comparison finds something.

Rows only in the current run are *new* (mechanisms added since the baseline) and rows only in
the baseline are *missing*; both are reported and neither fails. A baseline from another machine
class (device, device name, thread count, clock) or torch version is skipped with a warning.

Exit codes: 0 nothing worse, 1 at least one regression, 2 usage error, 3 nothing comparable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.bench.results import KEY, read_results, read_sidecar
from attnbench.bench.results import plain as _plain
from attnbench.errors import AttnbenchError

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, EXIT_NOTHING = 0, 1, 2, 3

#: A time ratio must move by more than this factor to count. On the shared 2-core machine this
#: was tuned on, ratios to the reference from the CI grid (CPU-time clock) moved by 0.77x..1.30x
#: over 30 A/A comparisons of separate runs (the extremes: flash-tiled at n = 256, whose bands
#: were wide), while a 1.5x slowdown of one path read 1.50x..1.71x (results/baselines/README.md).
#: 1.35, with the bands apart, sits between.
TIME_RATIO = 1.35
#: The reference's own time in units of the matmul timed in the same rounds: 0.87x..1.15x over
#: the same 30 A/A comparisons. No band test here, hence a little wider than TIME_RATIO.
REF_TIME_RATIO = 1.4
#: Deterministic memory counts differ only when allocations change; 2 % and 64 KiB absorb
#: allocator rounding and tiny bookkeeping tensors.
MEM_TOLERANCE = 0.02
MEM_SLACK_BYTES = 64 * 1024
#: Memory from a method that is not deterministic (e.g. the CUDA allocator's peak).
MEM_TOLERANCE_OTHER = 0.10
DETERMINISTIC_MEMORY = ("dispatch-live-bytes",)

VERDICT_ORDER = ("worse", "unconfirmed", "better", "new", "missing", "same", "not run")


@dataclass(frozen=True)
class Thresholds:
    time_ratio: float = TIME_RATIO
    ref_time_ratio: float = REF_TIME_RATIO
    mem_tolerance: float = MEM_TOLERANCE
    mem_slack_bytes: int = MEM_SLACK_BYTES
    mem_tolerance_other: float = MEM_TOLERANCE_OTHER
    require_separation: bool = True

    def describe(self) -> str:
        sep = " and p20..p80 bands apart" if self.require_separation else ""
        return (
            f"time: ratio to reference changed by > {self.time_ratio:g}x{sep}; "
            f"reference time (x matmul FLOP/s) > {self.ref_time_ratio:g}x; FLOPs exactly; "
            f"memory > {self.mem_tolerance:.0%} + {self.mem_slack_bytes // 1024} KiB "
            f"(deterministic) or > {self.mem_tolerance_other:.0%} (other)"
        )


@dataclass(frozen=True)
class Line:
    """One compared quantity of one case."""

    case: str
    metric: str
    baseline: str
    current: str
    ratio: float | None
    verdict: str  # worse | unconfirmed | better | same | new | missing | not run
    note: str = ""


@dataclass
class Comparison:
    current: Path
    baseline: Path
    lines: list[Line] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    compared: int = 0  # matched cases with at least one quantity compared
    thresholds: Thresholds = Thresholds()
    provenance: dict[str, str] = field(default_factory=dict)
    confirmed_by: list[Path] = field(default_factory=list)  # re-runs a regression had to repeat in

    def count(self, verdict: str) -> int:
        cases = {line.case for line in self.lines if line.verdict == verdict}
        return len(cases)

    @property
    def exit_code(self) -> int:
        if self.count("worse"):
            return EXIT_REGRESSION
        if self.compared == 0:
            return EXIT_NOTHING
        return EXIT_OK

    def headline(self) -> str:
        worse = self.count("worse")
        verdict = (
            f"{worse} regression{'s' * (worse != 1)}"
            if worse
            else ("nothing comparable" if self.compared == 0 else "nothing worse")
        )
        parts = [f"{self.compared} cases compared"]
        for v in ("unconfirmed", "better", "new", "missing"):
            if self.count(v):
                parts.append(f"{self.count(v)} {v}")
        return f"{verdict} ({', '.join(parts)})"

    def shown(self, everything: bool = False, changes_only: bool = False) -> list[Line]:
        """Lines worth a reader's time, worst first: every case's time line, other quantities
        only when they changed (``everything``: all lines; ``changes_only``: only lines whose
        verdict is not same / not run)."""
        quiet = ("same", "not run")
        keep = [
            line
            for line in self.lines
            if everything
            or (line.verdict not in quiet if changes_only else line.verdict != "same")
            or (not changes_only and line.metric.startswith("time"))
        ]
        return sorted(keep, key=lambda line: VERDICT_ORDER.index(line.verdict))


# --------------------------------------------------------------------------------------------


def _label(row: Mapping[str, Any]) -> str:
    tag = "causal" if row["causal"] else "bidir"
    params = f" [{row['params']}]" if row["params"] else ""
    return (
        f"{row['mechanism']}:{row['path']}{params} {row['direction']} {tag} n={row['seq_len']} "
        f"B{row['batch']} H{row['heads']} D{row['head_dim']} {row['dtype']}"
    )


def _keyed(df: pd.DataFrame, path: Path) -> dict[tuple, dict[str, Any]]:
    out: dict[tuple, dict[str, Any]] = {}
    for row in df.to_dict("records"):
        key = tuple(_plain(row[c]) for c in KEY)
        if key in out:
            raise AttnbenchError(f"{path}: two rows for the same case ({_label(row)})")
        out[key] = row
    return out


def _missing(x: Any) -> bool:
    return _plain(x) is None


def machine_of(df: pd.DataFrame) -> str:
    """``cpu|Intel(R) Xeon(R) Processor|threads=2|clock=wall|torch 2.13.0+cpu`` (or several)."""
    cols = ["device", "device_name", "threads", "clock", "torch_version"]
    kinds = df[cols].drop_duplicates().astype(str).to_dict("records")
    return "; ".join(
        f"{k['device']}|{k['device_name']}|threads={k['threads']}|clock={k['clock']}"
        f"|torch {k['torch_version']}"
        for k in kinds
    )


def _bytes(x: Any) -> str:
    x = float(x)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= size:
            return f"{x / size:.3g} {unit}"
    return f"{x:.0f} B"


def compare_rows(b: Mapping[str, Any], c: Mapping[str, Any], th: Thresholds) -> list[Line]:
    """Every compared quantity of one matched case."""
    label = _label(c)
    bs, cs = b["status"], c["status"]
    if bs != "ok" or cs != "ok":
        if bs == cs:
            return [Line(label, "status", bs, cs, None, "not run", str(c["reason"] or ""))]
        if cs == "skipped":  # the sweep's time limit, predicted from a smaller n that is compared
            note = f"not measured in this run: {c['reason'] or 'skipped'}"
            return [Line(label, "status", bs, cs, None, "not run", note)]
        verdict = "worse" if bs == "ok" else ("better" if cs == "ok" else "same")
        return [Line(label, "status", bs, cs, None, verdict, str(c["reason"] or b["reason"]))]
    lines = [_time_line(label, b, c, th)]
    if _plain(b["flops"]) != _plain(c["flops"]):
        ratio = (
            c["flops"] / b["flops"]
            if not _missing(b["flops"]) and not _missing(c["flops"]) and b["flops"]
            else None
        )
        lines.append(
            Line(label, "flops", str(b["flops"]), str(c["flops"]), ratio, "worse",
                 "FLOP counts are exact: refresh the baseline if the count was meant to change")
        )  # fmt: skip
    else:
        lines.append(Line(label, "flops", str(b["flops"]), str(c["flops"]), 1.0, "same"))
    for col, name in (("mem_fwd_bytes", "mem fwd"), ("mem_fwdbwd_bytes", "mem fwd+bwd")):
        line = _memory_line(label, name, b, c, col, th)
        if line is not None:
            lines.append(line)
    return lines


def _time_line(label: str, b: Mapping[str, Any], c: Mapping[str, Any], th: Thresholds) -> Line:
    impl = f"{c['mechanism']}:{c['path']}"
    has_ratio = not _missing(b["ref_ratio"]) and not _missing(c["ref_ratio"])
    same_ref = b["reference"] == c["reference"]
    if has_ratio and same_ref and impl != c["reference"]:
        change = c["ref_ratio"] / b["ref_ratio"]
        worse = change > th.time_ratio and (
            not th.require_separation or c["ref_ratio_p20"] > b["ref_ratio_p80"]
        )
        better = change < 1 / th.time_ratio and (
            not th.require_separation or c["ref_ratio_p80"] < b["ref_ratio_p20"]
        )
        verdict = "worse" if worse else ("better" if better else "same")
        note = ""
        if not worse and change > th.time_ratio:
            note = "beyond the threshold but within the noise bands"
        return Line(
            label,
            f"time / {c['reference']}",
            f"{b['ref_ratio']:.3f} ({b['ref_ratio_p20']:.3f}-{b['ref_ratio_p80']:.3f})",
            f"{c['ref_ratio']:.3f} ({c['ref_ratio_p20']:.3f}-{c['ref_ratio_p80']:.3f})",
            change,
            verdict,
            note,
        )
    if _missing(b["matmul_flop_per_s"]) or _missing(c["matmul_flop_per_s"]):
        return Line(label, "time", "-", "-", None, "same", "no reference ratio or calibration")
    work_b = b["time_median_ms"] * b["matmul_flop_per_s"] / 1e12
    work_c = c["time_median_ms"] * c["matmul_flop_per_s"] / 1e12
    change = work_c / work_b
    verdict = (
        "worse"
        if change > th.ref_time_ratio
        else ("better" if change < 1 / th.ref_time_ratio else "same")
    )
    return Line(
        label,
        "time x matmul rate",
        f"{b['time_median_ms']:.3g} ms",
        f"{c['time_median_ms']:.3g} ms",
        change,
        verdict,
        "the reference itself: time x the rate of the matmul timed in the same rounds",
    )


def _memory_line(
    label: str, name: str, b: Mapping[str, Any], c: Mapping[str, Any], col: str, th: Thresholds
) -> Line | None:
    if _missing(b[col]) and _missing(c[col]):
        return None
    if _missing(b[col]) or _missing(c[col]):
        return Line(label, name, str(_plain(b[col]) or "-"), str(_plain(c[col]) or "-"), None,
                    "same", "measured in one run only")  # fmt: skip
    bb, cc = float(b[col]), float(c[col])
    if b["mem_method"] != c["mem_method"]:
        note = f"methods differ ({b['mem_method']} vs {c['mem_method']}): not compared"
        return Line(label, name, _bytes(bb), _bytes(cc), None, "same", note)
    if c["mem_method"] in DETERMINISTIC_MEMORY:
        limit_up = bb * (1 + th.mem_tolerance) + th.mem_slack_bytes
        limit_down = (bb - th.mem_slack_bytes) / (1 + th.mem_tolerance)
    else:
        limit_up = bb * (1 + th.mem_tolerance_other)
        limit_down = bb / (1 + th.mem_tolerance_other)
    verdict = "worse" if cc > limit_up else ("better" if cc < limit_down else "same")
    ratio = cc / bb if bb else None
    return Line(label, name, _bytes(bb), _bytes(cc), ratio, verdict)


def compare(
    current: Path,
    baseline: Path,
    thresholds: Thresholds | None = None,
    confirm: Sequence[Path] = (),
) -> Comparison:
    """Compare two results CSVs (see the module docstring); ``confirm``: re-runs of the same grid
    that a regression must repeat in. Raises AttnbenchError on bad input."""
    th = thresholds or Thresholds()
    out = _compare(current, baseline, th)
    if confirm and out.count("worse"):
        reruns = [_compare(path, baseline, th) for path in confirm]
        for path, rerun in zip(confirm, reruns, strict=True):
            if rerun.compared == 0:
                why = "; ".join(rerun.warnings) or "no case in common"
                raise AttnbenchError(f"--confirm {path}: not comparable with the baseline ({why})")
            out.provenance[str(path)] = rerun.provenance.get(str(path), "")
        out.confirmed_by = list(confirm)
        seen = [{(x.case, x.metric): x for x in rerun.lines} for rerun in reruns]
        out.lines = [_confirmed(line, seen) for line in out.lines]
    return out


def _confirmed(line: Line, reruns: Sequence[Mapping[tuple[str, str], Line]]) -> Line:
    """``line`` if it is not worse or every re-run (its lines by case and metric) says worse
    too; else an unconfirmed line."""
    if line.verdict != "worse":
        return line
    seen = []
    for rerun in reruns:
        match = rerun.get((line.case, line.metric))
        if match is None or match.verdict != "worse":
            got = "absent" if match is None else f"{match.verdict}"
            if match is not None and match.ratio is not None:
                got += f", {match.ratio:.3f}x"
            seen.append(got)
    if not seen:
        return line
    note = f"worse in this run only; the re-run: {'; '.join(seen)}"
    return Line(line.case, line.metric, line.baseline, line.current, line.ratio, "unconfirmed",
                note)  # fmt: skip


def _compare(current: Path, baseline: Path, th: Thresholds) -> Comparison:
    cur_df, base_df = read_results(current), read_results(baseline)
    out = Comparison(current=current, baseline=baseline, thresholds=th)
    sides = {}
    for path in (current, baseline):
        side = sides[path] = read_sidecar(path)
        if side is None:
            out.warnings.append(f"{path}: no sidecar {path.with_suffix('.json').name}")
        else:
            git = side.get("git") or {}
            dirty = " (dirty)" if git.get("dirty") else ""
            out.provenance[str(path)] = (
                f"git {str(git.get('sha') or '?')[:10]}{dirty}, {side.get('started', '?')}"
            )
    if sides[current] and sides[baseline]:
        sig_cur, sig_base = (
            (sides[p].get("machine") or {}).get("cpu_signature") for p in (current, baseline)
        )
        if sig_cur and sig_base and sig_cur != sig_base:
            out.warnings.append(
                f"baseline is from another CPU ({sig_base}; this run: {sig_cur}): skipped, "
                "not compared"
            )
            return out
        for what, get in (
            ("suite file", lambda d: (d.get("suite") or {}).get("sha256")),
            ("malloc setting", lambda d: d.get("malloc")),
        ):
            if get(sides[current]) != get(sides[baseline]):
                out.warnings.append(
                    f"the {what} differs from the baseline's: refresh the baseline if the grid "
                    "or its settings changed on purpose"
                )
    cur, base = _keyed(cur_df, current), _keyed(base_df, baseline)
    if cur_df.empty or base_df.empty:
        out.warnings.append("one of the files has no rows")
        return out
    m_cur, m_base = machine_of(cur_df), machine_of(base_df)
    if m_cur != m_base:
        out.warnings.append(
            f"baseline is from another machine class or torch version ({m_base}; this run: "
            f"{m_cur}): skipped, not compared"
        )
        return out
    for key, c in cur.items():
        b = base.get(key)
        if b is None:
            out.lines.append(Line(_label(c), "case", "-", c["status"], None, "new"))
            continue
        lines = compare_rows(b, c, th)
        out.lines.extend(lines)
        if any(line.verdict != "not run" for line in lines):
            out.compared += 1
    for key, b in base.items():
        if key not in cur:
            out.lines.append(Line(_label(b), "case", b["status"], "-", None, "missing"))
    if out.count("new"):
        out.warnings.append(
            f"{out.count('new')} cases are new (not in the baseline); refresh it to gate them"
        )
    if out.count("missing"):
        out.warnings.append(f"{out.count('missing')} baseline cases were not in this run")
    return out


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
        f"- thresholds: {cmp.thresholds.describe()}",
    ]
    lines += [f"- warning: {w}" for w in cmp.warnings]
    shown = cmp.shown(everything)
    if shown:
        lines += [
            "",
            "| case | metric | baseline | current | ratio | verdict | note |",
            "|---|---|---|---|---:|---|---|",
        ]
        for ln in shown:
            ratio = f"{ln.ratio:.3f}" if ln.ratio is not None else ""
            verdict = f"**{ln.verdict}**" if ln.verdict == "worse" else ln.verdict
            cells = (ln.case, ln.metric, ln.baseline, ln.current, ratio, verdict, ln.note)
            lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in cells) + " |")
    return "\n".join(lines) + "\n"
