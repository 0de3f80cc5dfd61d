"""Kernel profiles of a speed run (suite table ``[profile]``): once every group is timed, each
case with an ok row is set up again and runs ``calls`` more calls under torch.profiler
(:mod:`attnbench.measure.kernel_profile`; fewer when they would take over ``PROFILE_BUDGET_S``);
what ran is written at once to ``kernels.csv`` beside the results, one row per (case, kernel or
operator), and, with ``trace = true``, a Chrome trace per case under ``traces/``.

A profile must not cost the measurement: it runs after the last timed round, and a case whose
profile fails keeps its row (the failure is a warning)."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnbench.bench.failures import StickyDeviceError, is_sticky_cuda_error, one_line
from attnbench.bench.plan import Case
from attnbench.bench.results import KEY, LineFile, cell, csv_line, cut_unterminated_line
from attnbench.core.errors import AttnbenchError
from attnbench.measure.kernel_profile import CallProfile, profile_call
from attnbench.runtime.outputs import atomic_open

#: The files beside results.csv.
KERNELS_NAME = "kernels.csv"
TRACES_DIR = "traces"
#: A case's profiled calls are cut to what takes about this long (seconds; at least one call).
PROFILE_BUDGET_S = 5.0
#: The columns of kernels.csv: the case (its results row's key), then one kernel or operator.
KERNEL_COLUMNS: tuple[str, ...] = (
    "suite",
    *KEY,
    "device",
    "device_name",
    "calls_profiled",
    "busy_us_per_call",
    "wall_us_per_call",
    "rank",
    "kind",
    "name",
    "launches_per_call",
    "time_us_per_call",
    "share",
)


def calls_within(calls: int, per_call_s: float) -> int:
    """``calls``, or fewer (at least one) when they would take over PROFILE_BUDGET_S."""
    if per_call_s <= 0:
        return calls
    return max(1, min(calls, math.floor(PROFILE_BUDGET_S / per_call_s)))


def trace_name(case_key: dict[str, Any]) -> str:
    """A case's trace file name: its key's cells, filesystem-safe and cut to 160 characters,
    then a hash of the whole key (two cases whose names share the first 160 stay apart)."""
    cells = [cell(case_key.get(c)) for c in KEY]
    text = re.sub(r"[^A-Za-z0-9_.=+-]+", "_", "-".join(c for c in cells if c))[:160]
    digest = hashlib.sha1("\x1f".join(cells).encode("utf-8")).hexdigest()[:10]
    return f"{text}-{digest}.json"


def clear(out_dir: Path, sidecar: Path) -> None:
    """A run that starts over (not a resumed one) removes the profiles of the run it replaces,
    so that none are left beside results they do not belong to: the files that run's sidecar
    names (kernels.csv, the traces' ``.json`` files), nothing else."""
    try:
        files = json.loads(sidecar.read_text(encoding="utf-8")).get("files") or {}
    except (OSError, ValueError, AttributeError):
        return
    if files.get("kernels") == KERNELS_NAME:
        with contextlib.suppress(FileNotFoundError):
            (out_dir / KERNELS_NAME).unlink()
    traces = out_dir / TRACES_DIR
    if files.get("traces") == TRACES_DIR and traces.is_dir():
        for trace in traces.glob("*.json"):
            trace.unlink()
        with contextlib.suppress(OSError):
            traces.rmdir()  # only when nothing else is left in it


def _keep_only(path: Path, kept: set[tuple[str, ...]]) -> None:
    """Rewrite ``path`` (whole or not at all) with only the rows of the ``kept`` cases."""
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    if not rows or tuple(rows[0]) != KERNEL_COLUMNS:
        raise AttnbenchError(
            f"{path}: not a kernels file of this attnbench (other columns); move it away or "
            "start over with --overwrite"
        )
    where = [KERNEL_COLUMNS.index(c) for c in KEY]
    lines = [csv_line(r) for r in rows if r is rows[0] or tuple(r[i] for i in where) in kept]
    if len(lines) < len(rows):
        with atomic_open(path, "w", encoding="utf-8", newline="") as f:
            f.write("".join(lines))


class KernelsWriter:
    """Profiles cases and appends their rows to ``kernels.csv`` as each case is profiled."""

    def __init__(
        self, out_dir: Path, calls: int, trace: bool, kept: set[tuple[str, ...]] | None = None
    ) -> None:
        """``kept``: a resumed run's cases that have a results row (their row keys); the
        profiles of those are kept, any other (a case profiled, then interrupted before its row
        was written: it runs again) is dropped. None: a new file."""
        self.path = out_dir / KERNELS_NAME
        self.traces = out_dir / TRACES_DIR if trace else None
        self.calls = calls
        self.cases = 0
        append = kept is not None and self.path.is_file() and self.path.stat().st_size > 0
        if append:
            cut_unterminated_line(self.path)
            _keep_only(self.path, kept)
        self._file = LineFile(self.path, append=append)
        if not append:
            self._file.write(csv_line(KERNEL_COLUMNS))

    def profile(
        self,
        case: Case,
        row: dict[str, Any],
        call: Callable[[], object],
        warn: Callable[[str], None],
        calls: int | None = None,
    ) -> CallProfile | None:
        """Profile ``call`` (the case's, warmed up) ``calls`` times (default: the suite's) and
        write its rows; ``row`` gives the case's key columns. A failure, or a profile in which
        the GPU recorded nothing (profiling not permitted, another profiler attached), is passed
        to ``warn`` and returns None; a sticky CUDA error is raised (StickyDeviceError)."""
        trace = self.traces / trace_name(row) if self.traces is not None else None
        try:
            found = profile_call(call, case.device, calls or self.calls, trace)
        except Exception as e:  # a profile must not cost the measurement
            if is_sticky_cuda_error(e):
                raise StickyDeviceError(one_line(e)) from None
            warn(f"{case.label()}: not profiled ({one_line(e, 120)})")
            return None
        if not found.entries:
            warn(
                f"{case.label()}: not profiled (the profiler recorded no activity: {found.source})"
            )
            return None
        case_cells = {c: row.get(c) for c in ("suite", *KEY, "device", "device_name")}
        for rank, entry in enumerate(found.entries, start=1):
            values = {
                **case_cells,
                "calls_profiled": found.calls,
                "busy_us_per_call": found.busy_us,
                "wall_us_per_call": found.wall_us,
                "rank": rank,
                "kind": entry.kind,
                "name": entry.name,
                "launches_per_call": entry.launches,
                "time_us_per_call": entry.time_us,
                "share": entry.share,
            }
            self._file.write(csv_line([cell(values.get(c)) for c in KERNEL_COLUMNS]))
        self.cases += 1
        return found

    def close(self) -> None:
        self._file.close()


def top_entries(
    path: Path, count: int = 3
) -> list[tuple[str, float, float, list[tuple[str, float]]]]:
    """Each profiled case of a kernels.csv, in file order, as (label, busy us, wall us, its
    ``count`` largest entries as (name, share)): what a run's summary shows."""
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    cases: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for row in rows:
        cases.setdefault(tuple(row[c] for c in KEY), []).append(row)
    found = []
    for entries in cases.values():
        first = entries[0]
        tag = "causal" if first["causal"] == "true" else "bidir"
        query = f" q={first['query_len']}" if first["query_len"] else ""
        label = (f"{first['mechanism']}:{first['path']} {first['direction']} {tag} "
                 f"n={first['seq_len']}{query} d={first['head_dim']} {first['dtype']}")  # fmt: skip
        top = sorted(entries, key=lambda r: int(r["rank"]))[:count]
        found.append((label, float(first["busy_us_per_call"]), float(first["wall_us_per_call"]),
                      [(r["name"], float(r["share"])) for r in top]))  # fmt: skip
    return found
