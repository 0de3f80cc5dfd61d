"""Kernel profiles of a speed run (suite table ``[profile]``): for each case set up and warmed
up, ``calls`` more calls under torch.profiler (:mod:`attnbench.measure.kernel_profile`), untimed,
before the group's timed rounds; what ran is written at once to ``kernels.csv`` beside the
results, one row per (case, kernel or operator), and, with ``trace = true``, a Chrome trace per
case under ``traces/``.

A profile must not cost the measurement: a case whose profiled calls fail keeps its timing (the
failure is a warning; the timed rounds then decide the case's row)."""

from __future__ import annotations

import contextlib
import csv
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnbench.bench.plan import Case
from attnbench.bench.results import KEY, LineFile, cell, csv_line, cut_unterminated_line
from attnbench.core.errors import AttnbenchError
from attnbench.measure.kernel_profile import CallProfile, profile_call
from attnbench.runtime.outputs import atomic_open

#: The files beside results.csv.
KERNELS_NAME = "kernels.csv"
TRACES_DIR = "traces"
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


def trace_name(case_key: dict[str, Any]) -> str:
    """A case's trace file name: its key's cells, filesystem-safe (``softmax-efficient-...``)."""
    text = "-".join(cell(case_key.get(c)) for c in KEY if cell(case_key.get(c)))
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", text)[:200] + ".json"


def clear(out_dir: Path) -> None:
    """A run that starts over (not a resumed one) removes the profiles of the run it replaces,
    so that none are left beside results they do not belong to."""
    with contextlib.suppress(FileNotFoundError):
        (out_dir / KERNELS_NAME).unlink()
    shutil.rmtree(out_dir / TRACES_DIR, ignore_errors=True)


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
    ) -> CallProfile | None:
        """Profile ``call`` (the case's, warmed up) and write its rows; ``row`` gives the case's
        key columns. A failure is passed to ``warn`` and returns None."""
        trace = self.traces / trace_name(row) if self.traces is not None else None
        try:
            found = profile_call(call, case.device, self.calls, trace)
        except Exception as e:  # a profile must not cost the measurement
            warn(f"{case.label()}: not profiled ({type(e).__name__}: {str(e)[:120]})")
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
