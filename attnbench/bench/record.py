"""The rows of a speed run as they are decided (:class:`Recorder`): each case's row built from its
record and measurements, written and flushed at once (CSV, per-round samples, progress), and what
the sweep needs to remember: which cases have a row, which series skip their longer lengths,
and what a resumed run already holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnbench.bench.config import SpeedSuite
from attnbench.bench.failures import (
    StickyDeviceError,
    is_oom,
    is_out_of_resources,
    is_sticky_cuda_error,
    one_line,
)
from attnbench.bench.inference import case_columns
from attnbench.bench.plan import Case, Group
from attnbench.bench.results import (
    COLUMNS,
    CaseSamples,
    ResultsWriter,
    SamplesWriter,
    params_text,
    row_key,
)
from attnbench.measure.flops import count_flops
from attnbench.measure.gpu_timing import effective_l2
from attnbench.measure.timing import per_round_ratios
from attnbench.runtime.progress import Progress


class Recorder:
    """Builds, writes and remembers the rows of one run."""

    def __init__(
        self,
        suite: SpeedSuite,
        writer: ResultsWriter,
        samples_writer: SamplesWriter | None,
        progress: Progress,
        *,
        threads: int,
        clock: str,
        device_name: str,
        recorded: set[str] | None = None,
    ) -> None:
        self.suite = suite
        self.writer = writer
        self.samples_writer = samples_writer  # per-round samples of every ok row
        self.progress = progress
        self.threads = threads
        self.clock = clock  # the clock column: wall, process-cpu or cuda-events
        self.device_name = device_name
        #: A unit's run: only these mechanisms' rows are written (the reference is timed beside
        #: them for ref_ratio; its own unit writes its rows). None: every row.
        self.recorded = recorded
        self.rows: list[dict[str, Any]] = []
        self.emitted = 0  # rows written by this run (not those resumed)
        self.done: set[int] = set()  # id() of cases that have a row
        self.skip: dict[tuple, str] = {}  # series -> why its longer lengths are skipped
        self.previous: dict[tuple[str, ...], str] = {}  # a resumed run's row keys -> status

    def resume_from(self, rows: list[dict[str, Any]]) -> None:
        """Take the rows of an earlier, unfinished run of the same suite: their cases are not
        run again, and a series that ran out of memory or hit the time limit stays skipped."""
        for row in rows:
            self.previous[row_key(row)] = row["status"]
            self.rows.append(row)

    def resumed(self, case: Case) -> bool:
        """Whether the resumed run already holds the case's row (then it is done; after an oom
        or a skip there, its longer lengths are skipped here too)."""
        if not self.previous:
            return False
        status = self.previous.get(row_key(self.row(case, "ok")))
        if status is None:
            return False
        self.done.add(id(case))
        if status in ("oom", "skipped"):
            self.skip.setdefault(case.series, "skipped in the resumed run")
        return True

    def row(self, case: Case, status: str, reason: str = "", **values: Any) -> dict[str, Any]:
        """The case's row: every column of COLUMNS, its record's and FLOPs filled in, then
        ``values``."""
        s = case.shape
        try:
            fc = count_flops(case.mech, s, case.causal, case.params, case.direction, case.path)
            flops, method, flops_fa = fc.flops, fc.method, fc.flops_fa
        except Exception as e:  # a bad formula must not stop the sweep; say so in the row
            flops, method, flops_fa = None, f"not counted ({one_line(e, 80)})", None
        row = {c: None for c in COLUMNS}
        row.update(
            suite=self.suite.name,
            mechanism=case.mech.name,
            family=case.mech.family,
            path=case.path.name,
            path_kind=case.path.kind,
            params=params_text(case.params),
            device=case.device.type,
            device_name=self.device_name,
            torch_version=torch.__version__,
            threads=self.threads,
            clock=self.clock,
            l2=effective_l2(self.suite.timing, case.device),
            dtype=str(case.dtype).removeprefix("torch."),
            batch=s.batch,
            heads=s.heads,
            kv_heads=s.hkv,
            seq_len=s.seq_len,
            head_dim=s.head_dim,
            value_dim=s.dv,
            causal=case.causal,
            direction=case.direction,
            status=status,
            reason=reason,
            flops=flops,
            flops_method=method,
            flops_fa=flops_fa,
            **case_columns(case),
        )
        row.update(values)
        return row

    def writes(self, case: Case) -> bool:
        return self.recorded is None or case.mech.name in self.recorded

    def emit(self, case: Case, row: dict[str, Any]) -> None:
        if not self.writes(case):
            self.done.add(id(case))
            return
        self.writer.write(row)
        self.rows.append(row)
        self.done.add(id(case))
        self.emitted += 1
        self.progress.advance(self.emitted, row=row)

    def fail(self, case: Case, e: BaseException) -> None:
        """An exception while setting up, warming up or timing a case: an oom or error row."""
        if is_sticky_cuda_error(e):
            self.emit(case, self.row(case, "error", one_line(e)))
            raise StickyDeviceError(one_line(e))
        if is_out_of_resources(e):
            self.emit(case, self.row(case, "unsupported", one_line(e)))
        elif is_oom(e):
            n = case.shape.seq_len
            self.skip[case.series] = f"out of memory at n={n}"
            self.emit(case, self.row(case, "oom", one_line(e)))
        else:
            self.emit(case, self.row(case, "error", one_line(e)))

    def write_samples(
        self,
        row: Mapping[str, Any],
        samples: list[float],
        ref_ratios: list[float] | None,
        anchor_samples: list[float],
    ) -> None:
        """The row's per-round samples, into the samples file (what ``compare`` tests)."""
        if self.samples_writer is None:
            return
        times_ms = [x * 1e3 for x in samples]
        matmul = per_round_ratios(samples, anchor_samples)
        self.samples_writer.write(row, CaseSamples(times_ms, ref_ratios, matmul))

    def not_run(self, groups: list[Group]) -> list[str]:
        """The cases of ``groups`` this run should have written and has no row for."""
        return [c.label() for g in groups for c in g.cases
                if id(c) not in self.done and self.writes(c)]  # fmt: skip
