"""One matched case: its label and key, its time (ratio to the reference, or in units of matmul
work), FLOPs, memory and status lines. See :mod:`attnbench.bench.compare`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.bench.compare.decision import Timing, judge
from attnbench.bench.compare.records import Limits, Line, Thresholds
from attnbench.bench.export import inference_tag
from attnbench.bench.results import CaseSamples, row_key
from attnbench.bench.results import plain as _plain
from attnbench.bench.thresholds import DETERMINISTIC_MEMORY, MACHINE_COLUMNS, WORK_METRIC
from attnbench.core.errors import AttnbenchError


def group_of(row: Mapping[str, Any]) -> str:
    """The cases timed in the same rounds against the same reference: ``fwd causal n=256 B1
    H4 D32 float32``."""
    tag = "causal" if row["causal"] else "bidir"
    return (
        f"{row['direction']} {tag} n={row['seq_len']} B{row['batch']} H{row['heads']} "
        f"D{row['head_dim']} {row['dtype']}{inference_tag(row)}"
    )


def label_of(row: Mapping[str, Any]) -> str:
    tag = "causal" if row["causal"] else "bidir"
    params = f" [{row['params']}]" if row["params"] else ""
    return (
        f"{row['mechanism']}:{row['path']}{params} {row['direction']} {tag} n={row['seq_len']} "
        f"B{row['batch']} H{row['heads']} D{row['head_dim']} {row['dtype']}{inference_tag(row)}"
    )


def keyed(df: pd.DataFrame, path: Path) -> dict[tuple, dict[str, Any]]:
    out: dict[tuple, dict[str, Any]] = {}
    for row in df.to_dict("records"):
        row = {c: _plain(v) for c, v in row.items()}
        key = row_key(row)
        if key in out:
            raise AttnbenchError(f"{path}: two rows for the same case ({label_of(row)})")
        out[key] = row
    return out


def missing(x: Any) -> bool:
    return _plain(x) is None


def machine_of(df: pd.DataFrame, columns: Sequence[str] = MACHINE_COLUMNS) -> str:
    """``device=cpu|device_name=AMD EPYC|torch_version=2.13.0+cpu`` (or several, ``; ``)."""
    kinds = df[list(columns)].drop_duplicates().astype(str).to_dict("records")
    return "; ".join("|".join(f"{c}={k[c]}" for c in columns) for k in kinds)


def _bytes(x: Any) -> str:
    x = float(x)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= size:
            return f"{x / size:.3g} {unit}"
    return f"{x:.0f} B"


def _usable(row: Mapping[str, Any], samples: CaseSamples | None) -> CaseSamples | None:
    """The case's samples if they belong to this row (as many as the row says it took)."""
    if samples is None or missing(row.get("samples")):
        return None
    return samples if len(samples.time_ms) == int(row["samples"]) else None


def _ratio_timing(row: Mapping[str, Any], samples: CaseSamples | None) -> Timing:
    kept = samples.ref_ratio if samples is not None else None
    return Timing(row["ref_ratio"], row["ref_ratio_p20"], row["ref_ratio_p80"], kept)


def work_timing(row: Mapping[str, Any], samples: CaseSamples | None) -> Timing:
    """The time in units of matmul work: per round, time / the matmul's time (samples); from
    the row, time x the matmul's rate."""
    rate = row["matmul_flop_per_s"] / 1e12
    kept = samples.matmul_ratio if samples is not None else None
    return Timing(row["time_median_ms"] * rate, row["time_p20_ms"] * rate,
                  row["time_p80_ms"] * rate, kept)  # fmt: skip


def is_reference(row: Mapping[str, Any]) -> bool:
    return f"{row['mechanism']}:{row['path']}" == row["reference"]


def uses_ref_ratio(b: Mapping[str, Any], c: Mapping[str, Any]) -> bool:
    """Compared as ratio to the reference (else: in units of matmul work)."""
    has_ratio = not missing(b["ref_ratio"]) and not missing(c["ref_ratio"])
    return has_ratio and b["reference"] == c["reference"] and not is_reference(c)


def time_change(b: Mapping[str, Any], c: Mapping[str, Any]) -> tuple[str, float] | None:
    """("ratio" | "work", current / baseline) of a matched ok pair; None if not comparable."""
    if uses_ref_ratio(b, c):
        return "ratio", c["ref_ratio"] / b["ref_ratio"]
    if missing(b["matmul_flop_per_s"]) or missing(c["matmul_flop_per_s"]):
        return None
    return "work", work_timing(c, None).median / work_timing(b, None).median


def _time_line(
    label: str,
    b: Mapping[str, Any],
    c: Mapping[str, Any],
    th: Thresholds,
    limits: Limits,
    samples: tuple[CaseSamples | None, CaseSamples | None],
) -> Line:
    sb, sc = _usable(b, samples[0]), _usable(c, samples[1])
    where = {"impl": f"{c['mechanism']}:{c['path']}", "group": group_of(c)}
    if uses_ref_ratio(b, c):
        base, cur = _ratio_timing(b, sb), _ratio_timing(c, sc)
        floors, centre = (limits.tested, limits.rule), limits.noise.centre(where["group"])
        verdict, change, p, test, note = judge(base, cur, floors, th, th.require_separation,
                                               centre)  # fmt: skip
        metric = f"time / {c['reference']}"
        return Line(label, metric, base.text(), cur.text(), change, verdict, note, p, test,
                    **where)  # fmt: skip
    if missing(b["matmul_flop_per_s"]) or missing(c["matmul_flop_per_s"]):
        return Line(label, "time", "-", "-", None, "same", "no reference ratio or calibration")
    base, cur = work_timing(b, sb), work_timing(c, sc)
    floors = (limits.reference, limits.reference)
    centre = limits.noise_reference.centre(where["group"])
    verdict, change, p, test, note = judge(base, cur, floors, th, False, centre)
    note = note or "the reference itself: time over the matmul timed in the same rounds"
    return Line(label, WORK_METRIC, f"{b['time_median_ms']:.3g} ms",
                f"{c['time_median_ms']:.3g} ms", change, verdict, note, p, test,
                **where)  # fmt: skip


def compare_rows(
    b: Mapping[str, Any],
    c: Mapping[str, Any],
    th: Thresholds,
    limits: Limits | None = None,
    samples: tuple[CaseSamples | None, CaseSamples | None] = (None, None),
) -> list[Line]:
    """Every compared quantity of one matched case (``samples``: the baseline's, the
    current's per-round samples of this case, when kept)."""
    label = label_of(c)
    bs, cs = b["status"], c["status"]
    if bs != "ok" or cs != "ok":
        if bs == cs:
            return [Line(label, "status", bs, cs, None, "not run", str(c["reason"] or ""))]
        if cs == "skipped":  # the sweep's time limit, predicted from a smaller n that is compared
            note = f"not measured in this run: {c['reason'] or 'skipped'}"
            return [Line(label, "status", bs, cs, None, "not run", note)]
        verdict = "worse" if bs == "ok" else ("better" if cs == "ok" else "same")
        return [Line(label, "status", bs, cs, None, verdict, str(c["reason"] or b["reason"]))]
    limits = limits or Limits(th.min_effect, th.time_ratio, th.ref_time_ratio)
    lines = [_time_line(label, b, c, th, limits, samples)]
    lines.append(_flops_line(label, b, c))
    for col, name in (("mem_fwd_bytes", "mem fwd"), ("mem_fwdbwd_bytes", "mem fwd+bwd")):
        line = _memory_line(label, name, b, c, col, th)
        if line is not None:
            lines.append(line)
    return lines


def _flops_line(label: str, b: Mapping[str, Any], c: Mapping[str, Any]) -> Line:
    bf, cf = _plain(b["flops"]), _plain(c["flops"])
    if bf == cf:
        return Line(label, "flops", str(bf), str(cf), 1.0, "same")
    ratio = cf / bf if bf and cf is not None else None
    note = "FLOP counts are exact: refresh the baseline if the count was meant to change"
    return Line(label, "flops", str(bf), str(cf), ratio, "worse", note)


def _memory_line(
    label: str, name: str, b: Mapping[str, Any], c: Mapping[str, Any], col: str, th: Thresholds
) -> Line | None:
    if missing(b[col]) and missing(c[col]):
        return None
    if missing(b[col]) or missing(c[col]):
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
