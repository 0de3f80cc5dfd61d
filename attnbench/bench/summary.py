"""What a speed run produced (:class:`SpeedRun`, from :func:`~attnbench.bench.run.run_speed` or
:func:`~attnbench.bench.merge.merge_runs`), and the same in a few numbers: per mechanism:path,
its headline measurements at the largest n it reached and its fitted exponents (what the CLI's
summary table and JSON show), and what an interrupted run did not measure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Any

import pandas as pd

from attnbench.bench.results import COLUMNS

#: The files of a run's folder besides the samples (``results.SAMPLES_NAME``).
CSV_NAME = "results.csv"
SIDECAR_NAME = "results.json"
COMPLEXITY_NAME = "complexity.csv"
#: Torch's and the libraries' warnings during the sweep (:mod:`attnbench.runtime.warning_log`).
WARNINGS_NAME = "warnings.log"


@dataclass
class SpeedRun:
    """What a run produced; files are already on disk."""

    out_dir: FilePath
    csv: FilePath
    sidecar: FilePath
    complexity: FilePath
    rows: list[dict[str, Any]]
    exponents: pd.DataFrame
    calibration: dict[str, dict[str, float]]  # dtype -> the matmul rate over the groups
    interrupted: bool
    not_run: list[str]
    wall_s: float
    stopped: str | None = None  # why the sweep ended early other than Ctrl-C (sticky CUDA error)
    #: The machine's load before and during the run (sidecar ``load``), and what it says.
    load: dict[str, Any] | None = None
    busy: str | None = None
    #: Warnings of torch and the libraries kept out of the terminal, and the file holding them.
    warnings: int = 0
    warnings_file: FilePath | None = None
    #: ``[profile]``: the kernel profiles' file, and how many cases this run profiled.
    kernels: FilePath | None = None
    profiled: int = 0

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row["status"]] = out.get(row["status"], 0) + 1
        return out

    @property
    def noisy(self) -> int:
        return sum(1 for r in self.rows if r.get("noisy"))


#: The order in which a series is picked to headline a (mechanism, path) in the summary.
HEADLINE = (("fwd", False), ("fwd", True), ("fwdbwd", False), ("fwdbwd", True))


def summary_rows(run: SpeedRun) -> list[dict[str, Any]]:
    """Per mechanism:path, the headline numbers at its largest measured n, and its exponents
    (the inference shapes' rows have their own: :mod:`attnbench.bench.inference_summary`)."""
    df = pd.DataFrame(run.rows, columns=list(COLUMNS))
    inference = df["query_len"].notna() | df["packing"].fillna("").astype(str).ne("")
    df = df[~inference]
    if df.empty:
        return []
    cx = run.exponents
    out = []
    for (mech, path), g in df.groupby(["mechanism", "path"], sort=False):
        counts = g["status"].value_counts()
        other = ", ".join(f"{n} {s}" for s, n in counts.items() if s != "ok")
        entry: dict[str, Any] = {
            "impl": f"{mech}:{path}",
            "ok": f"{counts.get('ok', 0)}/{len(g)}",
            "other": other,
        }
        ok = g[g["status"] == "ok"]
        for direction, causal in HEADLINE:
            s = ok[(ok["direction"] == direction) & (ok["causal"] == causal)]
            if s.empty:
                continue
            top = s.loc[s["seq_len"].idxmax()]
            fit = cx[
                (cx["mechanism"] == mech)
                & (cx["path"] == path)
                & (cx["direction"] == direction)
                & (cx["causal"] == causal)
            ]
            entry.update(
                series=f"{direction} {'causal' if causal else 'bidir'}",
                n=int(top["seq_len"]),
                ms=top["time_median_ms"],
                ref_ratio=top["ref_ratio"],
                roofline=top["roofline"],
                mem_fwd=top["mem_fwd_bytes"],
                mem_fwdbwd=top["mem_fwdbwd_bytes"],
                # an exponent the fit cannot vouch for is not printed as a finding
                time_exp=fit["time_exponent"].iloc[0]
                if len(fit) and fit["time_reliable"].iloc[0]
                else None,
                time_exp_note=fit["time_note"].iloc[0] if len(fit) else "",
                mem_exp=fit["mem_fwd_exponent"].iloc[0] if len(fit) else None,
                mem_bwd_exp=fit["mem_fwdbwd_exponent"].iloc[0] if len(fit) else None,
            )
            break
        out.append(entry)
    return out


def describe_not_run(not_run: list[str], limit: int = 8) -> str:
    """``37 cases: softmax:reference (12), ...``: what an interrupted run did not measure."""
    if not not_run:
        return "nothing"
    per_impl: dict[str, int] = {}
    for label in not_run:
        impl = label.split(" ", 1)[0]
        per_impl[impl] = per_impl.get(impl, 0) + 1
    parts = [f"{impl} ({n})" for impl, n in list(per_impl.items())[:limit]]
    more = len(per_impl) - limit
    return f"{len(not_run)} cases: " + ", ".join(parts) + (f", and {more} more" if more > 0 else "")
