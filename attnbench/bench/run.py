"""The speed suite: time, throughput, FLOPs, roofline and peak memory of every mechanism's paths.

How a run goes (``run_speed``):

1. The suite (:mod:`attnbench.bench.config`) expands into *groups*: one per (dtype, head
   dim, causal flag, length n), in increasing n. A group holds a case for every selected
   (mechanism, path, direction), the reference mechanism included. Every mechanism is consumed
   through its registry record alone: ``shape_for``, ``make_inputs`` (extra inputs included),
   ``forward_flops``, ``Path.unavailable`` and its capability flags.
2. In each group, every case is checked (a path that cannot run here, a causal-only mechanism
   asked for bidirectional attention, no backward, a dtype it does not take: an ``unsupported``
   row with the reason), warmed up (compilation and autotuning happen here, untimed; the first
   call's time is kept), and its peak memory measured in its own untimed pass. Then all cases of
   the group are timed together in interleaved rounds (M A B C M A B C ...), so that time can be
   reported as a ratio to the reference measured in the same rounds, and FLOP/s as a fraction of
   the matmul M timed in the same rounds (the roofline, see :class:`MatmulAnchor`).
3. Each case becomes one CSV row, written and flushed as soon as it is known. An out-of-memory
   case is an ``oom`` row and its longer lengths become ``skipped`` rows; any other exception is
   an ``error`` row with its one-line message, and the sweep goes on. Ctrl-C stops cleanly: every
   finished row is on disk and the result lists what was not run.
4. Exponents of time and memory against n are fitted (:mod:`attnbench.bench.complexity`) and
   written beside the rows, with a JSON sidecar holding the provenance.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any, Protocol

import pandas as pd
import torch

from attnbench import api, registry
from attnbench.bench.complexity import fit_exponents
from attnbench.bench.config import SpeedSuite, reference_pair
from attnbench.bench.plan import Case, Group, plan, unsupported_reason
from attnbench.bench.results import (
    COLUMNS,
    SAMPLES_NAME,
    CaseSamples,
    ResultsWriter,
    SamplesWriter,
    params_text,
    plain,
    read_results,
    row_key,
)
from attnbench.bench.units import Unit
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Mechanism
from attnbench.measure import machine
from attnbench.measure.flops import BACKWARD_FACTOR, MatmulAnchor, count_flops
from attnbench.measure.memory import PeakMemory, peak_memory
from attnbench.measure.timing import (
    NOISY_SPREAD,
    Clock,
    WarmUp,
    block_calls,
    per_round_ratios,
    retain_freed_memory,
    round_order,
    stats,
    warm_up,
)
from attnbench.runtime.outputs import ensure_dir

SCHEMA_VERSION = 1
CSV_NAME = "results.csv"
SIDECAR_NAME = "results.json"
COMPLEXITY_NAME = "complexity.csv"

CONVENTIONS = {
    "time": (
        "milliseconds per call (clock column: wall = elapsed, process-cpu = CPU time of the "
        "process, cuda-events = GPU time): median and p20/p80 over interleaved rounds, each "
        "sample the mean of a block of calls; fwd runs under torch.no_grad(); fwdbwd is forward + "
        "autograd.grad of all inputs for a fixed random output gradient. On CUDA the L2 cache "
        "is not flushed between samples: a sample is a block of calls lasting at least the "
        "suite's block_s (20 ms on the GPU suites), whose calls reuse the same inputs as a "
        "layer's repeated calls would, so one flush per block would change little and a flush "
        "per call would time the flush's launch with it"
    ),
    "noisy": f"(p80 - p20) / median > {NOISY_SPREAD}",
    "ref_ratio": (
        "median over rounds of (this case's sample / the reference's sample in the same round), "
        "reference = the same direction, causal flag, shape and dtype"
    ),
    "flops": (
        "forward: Mechanism.forward_flops, 2*B*H*pairs*(D+Dv) with attended pairs counted exactly "
        "('pairs') unless the mechanism declares its formula ('formula'); "
        f"fwdbwd: (1 + {BACKWARD_FACTOR}) x forward (backward = {BACKWARD_FACTOR}x forward, "
        "no recomputation counted)"
    ),
    "roofline": (
        "median over rounds of (achieved FLOP/s / FLOP/s of a square matmul timed in the same "
        "round, same device, dtype and threads); matmul_flop_per_s is that matmul's rate over "
        "the group's rounds"
    ),
    "memory": (
        "peak bytes above the inputs in an untimed pass: mem_fwd without autograd, mem_fwdbwd "
        "forward with autograd + backward; method dispatch-live-bytes (CPU: live tensor storage "
        "counted by a dispatch mode) or cuda-max-allocated (CUDA allocator peak)"
    ),
}


def _oom_error_types() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = [MemoryError]
    for holder, name in ((torch, "OutOfMemoryError"), (torch.cuda, "OutOfMemoryError")):
        kind = getattr(holder, name, None)
        if isinstance(kind, type):
            kinds.append(kind)
    return tuple(kinds)


OOM_TYPES = _oom_error_types()


def is_oom(e: BaseException) -> bool:
    """torch's OutOfMemoryError, MemoryError, or the CPU allocator's RuntimeError when it cannot
    get memory. Triton's OutOfResources is not one: see :func:`is_out_of_resources`."""
    if isinstance(e, OOM_TYPES):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text
    )


def is_out_of_resources(e: BaseException) -> bool:
    """Triton's OutOfResources: a kernel configuration that does not fit this GPU's shared
    memory or registers. A property of the kernel and the GPU, not of the length: the case is
    ``unsupported`` with the reason, and longer lengths are still tried."""
    return type(e).__name__ == "OutOfResources"


#: Messages of CUDA errors that leave the process's CUDA context unusable: every later call
#: fails too, so the sweep stops and the rest is run in a fresh process (``--resume``).
STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "illegal instruction",
    "misaligned address",
    "unspecified launch failure",
    "device-side assert",
    "cudaErrorLaunchFailure",
)


def is_sticky_cuda_error(e: BaseException) -> bool:
    text = str(e)
    return isinstance(e, RuntimeError) and any(m in text for m in STICKY_CUDA_ERRORS)


class StickyDeviceError(Exception):
    """Raised inside the runner after a sticky CUDA error's row is written: the sweep stops."""


def one_line(e: BaseException, limit: int = 240) -> str:
    """``TypeName: first line of the message`` (what an error row's reason says)."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    text = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------


class Reporter(Protocol):
    """What the runner tells its caller while it works (the CLI draws a bar or prints lines)."""

    def start(self, total: int, description: str) -> None: ...
    def note(self, text: str) -> None: ...
    def warning(self, text: str) -> None: ...
    def group(self, label: str) -> None: ...
    def row(self, row: Mapping[str, Any]) -> None: ...
    def finish(self) -> None: ...


class Silent:
    def start(self, total: int, description: str) -> None: ...
    def note(self, text: str) -> None: ...
    def warning(self, text: str) -> None: ...
    def group(self, label: str) -> None: ...
    def row(self, row: Mapping[str, Any]) -> None: ...
    def finish(self) -> None: ...


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)  # compared by identity: a group's members are distinct objects
class _Member:
    """A case being timed within its group."""

    case: Case
    call: Callable[[], object]
    warm: WarmUp
    mem: PeakMemory | None = None  # of its own direction
    mem_fwd: PeakMemory | None = None  # fwdbwd members only, when the run has no fwd direction
    block: int = 1
    samples: list[float] = field(default_factory=list)


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

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row["status"]] = out.get(row["status"], 0) + 1
        return out

    @property
    def noisy(self) -> int:
        return sum(1 for r in self.rows if r.get("noisy"))


def prepare_out_dir(out: FilePath, overwrite: bool) -> None:
    """Create ``out`` and make sure it can be written; never clobber results unless told."""
    ensure_dir(out, "--out folder")
    try:
        probe = out / ".attnbench-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise AttnbenchError(
            f"--out {out}: cannot write there ({e.strerror or e}); choose a writable directory"
        ) from None
    if (out / CSV_NAME).exists() and not overwrite:
        raise AttnbenchError(
            f"--out {out} already holds {CSV_NAME}; choose another directory or pass --overwrite"
        )


class _Runner:
    def __init__(
        self,
        suite: SpeedSuite,
        groups: list[Group],
        writer: ResultsWriter,
        reporter: Reporter,
        ref: tuple[str, str] | None,
        threads: int,
    ) -> None:
        self.suite = suite
        self.groups = groups
        self.writer = writer
        self.reporter = reporter
        self.ref = ref
        self.threads = threads
        self.anchors: dict[torch.dtype, tuple[MatmulAnchor, int]] = {}  # dtype -> (matmul, block)
        self.mm_rates: dict[str, list[float]] = {}  # dtype -> the matmul rate of every group
        self.device = suite.torch_device()
        self.device_name = machine.device_name(self.device)
        self.clock = Clock(self.device, suite.timing.clock)
        self.rows: list[dict[str, Any]] = []
        self.done: set[int] = set()  # id() of cases that have a row
        self.skip: dict[tuple, str] = {}  # series -> why its longer lengths are skipped
        self.stopped: str | None = None  # why the sweep ended early (not Ctrl-C)
        self.previous: dict[tuple[str, ...], str] = {}  # a resumed run's row keys -> status
        self.samples_writer: SamplesWriter | None = None  # per-round samples of every ok row
        #: A unit's run: only these mechanisms' rows are written (the reference is timed beside
        #: them for ref_ratio; its own unit writes its rows). None: every row.
        self.recorded: set[str] | None = None

    def resume_from(self, rows: list[dict[str, Any]]) -> None:
        """Take the rows of an earlier, unfinished run of the same suite: their cases are not
        run again, and a series that ran out of memory or hit the time limit stays skipped."""
        for row in rows:
            self.previous[row_key(row)] = row["status"]
            self.rows.append(row)

    # -- rows ----------------------------------------------------------------------------------
    def _row(self, case: Case, status: str, reason: str = "", **values: Any) -> dict[str, Any]:
        s = case.shape
        try:
            fc = count_flops(case.mech, s, case.causal, case.params, case.direction)
            flops, method = fc.flops, fc.method
        except Exception as e:  # a bad formula must not stop the sweep; say so in the row
            flops, method = None, f"not counted ({one_line(e, 80)})"
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
            clock=self.clock.name,
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
        )
        row.update(values)
        return row

    def writes(self, case: Case) -> bool:
        return self.recorded is None or case.mech.name in self.recorded

    def _emit(self, case: Case, row: dict[str, Any]) -> None:
        if not self.writes(case):
            self.done.add(id(case))
            return
        self.writer.write(row)
        self.rows.append(row)
        self.done.add(id(case))
        self.reporter.row(row)

    def _fail(self, case: Case, e: BaseException) -> None:
        """An exception while setting up, warming up or timing a case: an oom or error row."""
        if is_sticky_cuda_error(e):
            self._emit(case, self._row(case, "error", one_line(e)))
            raise StickyDeviceError(one_line(e))
        if is_out_of_resources(e):
            self._emit(case, self._row(case, "unsupported", one_line(e)))
        elif is_oom(e):
            n = case.shape.seq_len
            self.skip[case.series] = f"out of memory at n={n}"
            self._emit(case, self._row(case, "oom", one_line(e)))
        else:
            self._emit(case, self._row(case, "error", one_line(e)))

    # -- one group -----------------------------------------------------------------------------
    def run_group(self, group: Group) -> None:
        self.reporter.group(group.label())
        inputs_cache: dict[tuple, dict[str, torch.Tensor]] = {}
        members: list[_Member] = []
        directions = {c.direction for c in group.cases}
        for case in group.cases:
            if self.previous:
                status = self.previous.get(row_key(self._row(case, "ok")))
                if status is not None:
                    self.done.add(id(case))
                    if status in ("oom", "skipped"):
                        self.skip.setdefault(case.series, "skipped in the resumed run")
                    continue
            if case.series in self.skip:
                self._emit(case, self._row(case, "skipped", self.skip[case.series]))
                continue
            reason = unsupported_reason(case)
            if reason:
                self._emit(case, self._row(case, "unsupported", reason))
                continue
            try:
                member = self._set_up(case, inputs_cache, need_fwd_memory="fwd" not in directions)
            except AttnbenchError as e:  # the mechanism rejects this shape or these params
                self._emit(case, self._row(case, "unsupported", str(e)))
                continue
            except Exception as e:
                self._fail(case, e)
                member = None
            if member is None:
                # Out of the except block: the traceback no longer pins the failed call's tensors.
                free_memory(self.device)
                continue
            members.append(member)
        if members:
            anchor, block = self._anchor(group.dtype)
            anchor_samples = self._time(members, anchor, block)
            self._write_group(members, anchor, anchor_samples)
        inputs_cache.clear()

    def _anchor(self, dtype: torch.dtype) -> tuple[MatmulAnchor, int]:
        """The group's matmul (built and warmed once per dtype) and its calls per sample."""
        if dtype not in self.anchors:
            self.reporter.note(f"warming up the {str(dtype).removeprefix('torch.')} matmul")
            anchor = MatmulAnchor(self.device, dtype, self.suite.matmul_size)
            warm = warm_up(anchor, self.clock, self.suite.timing)
            self.anchors[dtype] = (anchor, block_calls(warm.per_call_s, self.suite.timing))
        return self.anchors[dtype]

    def _set_up(
        self, case: Case, cache: dict[tuple, dict[str, torch.Tensor]], need_fwd_memory: bool
    ) -> _Member | None:
        backward = case.direction == "fwdbwd"
        inputs = self._inputs(case, cache, backward)
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        extras = {name: t for name, t in inputs.items() if name not in ("q", "k", "v")}
        with torch.set_grad_enabled(backward):
            api.prepare(case.mech, q, k, v, causal=case.causal, path=case.path.name,
                        **case.params, **extras)  # fmt: skip
        fn = case.path.fn  # called directly, its own arguments chosen once, outside the timing
        kwargs = case.path.arguments({"causal": case.causal, **case.params, **extras})

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return fn(q, k, v, **kwargs)

        if backward:
            leaves = [t for t in inputs.values() if t.requires_grad]
            s = case.shape
            gen = torch.Generator(device="cpu").manual_seed(1)
            dout = torch.randn((s.batch, s.heads, s.seq_len, s.dv), generator=gen)
            dout = dout.to(device=case.device, dtype=case.dtype)

            def call() -> object:
                out = fn(q, k, v, **kwargs)
                return torch.autograd.grad(out, leaves, dout, allow_unused=True)
        else:
            call = forward

        warm = warm_up(call, self.clock, self.suite.timing)
        member = _Member(case, call, warm)
        member.mem = peak_memory(call, case.device)
        if backward and need_fwd_memory:
            member.mem_fwd = peak_memory(forward, case.device)
        member.block = block_calls(warm.per_call_s, self.suite.timing)
        return member

    def _inputs(
        self, case: Case, cache: dict[tuple, dict[str, torch.Tensor]], backward: bool
    ) -> dict[str, torch.Tensor]:
        """make_inputs, shared by every case of the group that needs identical tensors (same
        shape, dtype, grad flag and extra inputs), so a group holds one copy of q, k, v."""
        extras = tuple(
            (e.name, tuple(e.shape(case.shape, case.params)), e.init_std)
            for e in case.mech.extras_for(case.params)
        )
        key = (case.shape, case.dtype, backward, extras)
        if key not in cache:
            cache[key] = make_inputs(
                case.mech,
                case.shape,
                case.params,
                dtype=case.dtype,
                device=case.device,
                seed=0,
                requires_grad=backward,
            )
        return cache[key]

    def _time(self, members: list[_Member], anchor: MatmulAnchor, block: int) -> list[float]:
        """Interleaved rounds: the matmul and every live member, once per round, in the order
        of ``[timing] order`` (default: rotated one place each round, so no member keeps the
        first or the last place; :func:`round_order`); rounds go on until ``group_budget_s``
        has elapsed (at least ``min_rounds``, at most ``rounds``), so the rounds a group gets
        follow what its rounds really took on this machine, now."""
        policy = self.suite.timing
        anchor_samples: list[float] = []
        started = time.perf_counter()
        for r in range(policy.rounds):
            if r >= policy.min_rounds and time.perf_counter() - started >= policy.group_budget_s:
                break
            self.reporter.note(f"round {r + 1}")
            slots: list[_Member | None] = [None, *members]  # None: the matmul
            for i in round_order(len(slots), r, policy.order):
                m = slots[i]
                if m is None:
                    anchor_samples.append(self.clock.time_block(anchor, block))
                    continue
                try:
                    m.samples.append(self.clock.time_block(m.call, m.block))
                    continue
                except Exception as e:
                    members.remove(m)
                    self._fail(m.case, e)
                free_memory(self.device)
        return anchor_samples

    def _write_group(
        self, members: list[_Member], anchor: MatmulAnchor, anchor_samples: list[float]
    ) -> None:
        mm_rate = anchor.flops / stats(anchor_samples).median
        self.mm_rates.setdefault(anchor.dtype, []).append(mm_rate)
        by_impl = {(m.case.impl, m.case.direction): m for m in members}
        refs = {}
        if self.ref is not None:
            ref_impl = f"{self.ref[0]}:{self.ref[1]}"
            refs = {d: by_impl.get((ref_impl, d)) for d in ("fwd", "fwdbwd")}
        for m in members:
            case = m.case
            t = stats(m.samples)
            sibling = by_impl.get((case.impl, "fwd" if case.direction == "fwdbwd" else "fwdbwd"))
            if case.direction == "fwd":
                mem_fwd, mem_fwdbwd = m.mem, sibling.mem if sibling else None
            else:
                mem_fwdbwd = m.mem
                mem_fwd = m.mem_fwd or (sibling.mem if sibling else None)
            method = (m.mem or mem_fwd).method if (m.mem or mem_fwd) else None
            values: dict[str, Any] = dict(
                time_median_ms=t.median * 1e3,
                time_p20_ms=t.p20 * 1e3,
                time_p80_ms=t.p80 * 1e3,
                samples=t.n,
                calls_per_sample=m.block,
                first_call_ms=m.warm.first_s * 1e3,
                noisy=t.noisy,
                tokens_per_s=case.shape.batch * case.shape.seq_len / t.median,
                mem_fwd_bytes=mem_fwd.bytes if mem_fwd else None,
                mem_fwdbwd_bytes=mem_fwdbwd.bytes if mem_fwdbwd else None,
                mem_method=method,
            )
            ref = refs.get(case.direction)
            ref_ratios = None
            if ref is not None and len(ref.samples) == len(m.samples):
                ref_ratios = per_round_ratios(m.samples, ref.samples)
                r = stats(ref_ratios)
                values.update(
                    reference=f"{self.ref[0]}:{self.ref[1]}",
                    ref_ratio=r.median,
                    ref_ratio_p20=r.p20,
                    ref_ratio_p80=r.p80,
                )
            row = self._row(case, "ok", **values)
            if row["flops"] is not None:
                row["flop_per_s"] = row["flops"] / t.median
                row["matmul_flop_per_s"] = mm_rate
                per_round = [
                    (row["flops"] / x) / (anchor.flops / a)
                    for x, a in zip(m.samples, anchor_samples, strict=True)
                ]
                row["roofline"] = stats(per_round).median
            self._emit(case, row)
            if self.writes(case):
                self._write_samples(row, m.samples, ref_ratios, anchor_samples)
            limit = self.suite.max_call_s
            n = case.shape.seq_len
            longer = [x for x in self.suite.lengths if x > n]
            # Predict the next length's call as if the path were quadratic (the worst case here):
            # a sweep that waits to see a slow call has already spent it. The prediction starts
            # from the median of the timed samples, never from one call or a warm-up call (which
            # may still compile, autotune or grow the allocator: seen on an H100, 0.6 s for a
            # warm-up call whose timed median was 0.2 ms).
            per_call = t.median
            predicted = per_call * (min(longer) / n) ** QUADRATIC if longer else 0.0
            if limit and max(per_call, predicted) > limit:
                self.skip[case.series] = (
                    f"a call took {per_call:.2g} s (median of {t.n}) at n={n}, "
                    f"{predicted:.2g} s predicted at n={min(longer) if longer else n} "
                    f"(suite limit max_call_s = {limit:g})"
                )

    def _write_samples(
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

    # -- the sweep -----------------------------------------------------------------------------
    def run(self) -> bool:
        """Run every group; returns True when interrupted by Ctrl-C."""
        try:
            for group in self.groups:
                self.run_group(group)
        except KeyboardInterrupt:
            return True
        except StickyDeviceError as e:
            self.stopped = (
                f"the CUDA context broke ({e}); every later call in this process would fail: "
                "run the same command again with --resume, in a fresh process"
            )
            return True
        return False

    def not_run(self) -> list[str]:
        return [c.label() for g in self.groups for c in g.cases
                if id(c) not in self.done and self.writes(c)]  # fmt: skip


#: Exponent used to predict a path's next call time from its current one (dense attention's n^2;
#: linear paths are over-predicted, which only skips them earlier under a tight limit).
QUADRATIC = 2.0


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_speed(
    suite: SpeedSuite,
    out_dir: FilePath,
    *,
    mechanisms: Sequence[Mechanism] | None = None,
    reporter: Reporter | None = None,
    overwrite: bool = False,
    command: Sequence[str] | None = None,
    resume: bool = False,
    unit: Unit | None = None,
) -> SpeedRun:
    """Run ``suite``, writing ``results.csv`` (rows as produced), ``results.json`` (provenance)
    and ``complexity.csv`` into ``out_dir``. Never raises on a failing case; raises
    AttnbenchError only for bad input, before anything runs. ``unit``: run only that unit of
    the sweep (:mod:`attnbench.bench.units`), its rows only."""
    reporter = reporter or Silent()
    mechanisms = list(mechanisms if mechanisms is not None else registry.MECHANISMS)
    device = suite.torch_device()
    groups = plan(suite, mechanisms)
    ref = reference_pair(suite, mechanisms)
    if unit is not None:
        groups = unit_groups(groups, unit, ref)
    csv_path, side_path = out_dir / CSV_NAME, out_dir / SIDECAR_NAME
    previous = _previous_rows(csv_path) if resume else []
    prepare_out_dir(out_dir, overwrite or resume)
    cx_path = out_dir / COMPLEXITY_NAME
    retained = retain_freed_memory() if suite.timing.retain_memory else False
    threads_before = torch.get_num_threads()
    threads = suite.thread_count()
    torch.set_num_threads(threads)
    started = time.perf_counter()
    busy_threads = threads if device.type == "cpu" else 1  # a GPU run keeps one core busy
    watch = machine.LoadWatch(busy_threads).start()
    before = [
        w
        for w in (
            machine.oversubscribed(threads),
            machine.busy_reason(watch.before[0] if watch.before else None, busy_threads),
        )
        if w
    ]
    sidecar: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "kind": "attnbench-speed",
        "suite": suite.settings(),
        "command": shlex.join(command if command is not None else command_line()),
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "finished": None,
        "machine": machine.machine(device),
        "malloc": "glibc: freed memory retained" if retained else "default",
        "machine_class": machine.machine_class(
            device, threads, Clock(device, suite.timing.clock).name
        ),
        "versions": machine.versions(),
        "git": machine.git_state(),
        "conventions": CONVENTIONS,
        "files": {"rows": CSV_NAME, "complexity": COMPLEXITY_NAME, "samples": SAMPLES_NAME},
        "load": {"before_1_5_15min": list(watch.before) if watch.before else None},
        "warnings": before,
    }
    if device.type == "cuda":
        sidecar["cuda"] = cuda_state(suite, device)
    _write_json(side_path, sidecar)
    writer = ResultsWriter(csv_path, append=bool(previous))
    samples_writer = SamplesWriter(out_dir / SAMPLES_NAME, append=bool(previous))
    runner = _Runner(suite, groups, writer, reporter, ref, threads)
    if unit is not None:
        runner.recorded = {unit.mechanism}
        sidecar["unit"] = unit.id
    total = sum(1 for g in groups for c in g.cases if runner.writes(c))
    runner.samples_writer = samples_writer
    if previous:
        runner.resume_from(previous)
        sidecar["resumed_with_rows"] = len(previous)
    try:
        for w in before:
            reporter.warning(w)
        reporter.start(total, f"{suite.name} on {machine.device_name(device)}")
        interrupted = runner.run()
    finally:
        writer.close()
        samples_writer.close()
        torch.set_num_threads(threads_before)
        load = watch.stop()
        reporter.finish()
    wall = time.perf_counter() - started
    exponents = fit_exponents(pd.DataFrame(runner.rows, columns=list(COLUMNS)))
    exponents.to_csv(cx_path, index=False, float_format="%.4g")
    not_run = runner.not_run()
    calibration = {
        dtype: {
            "matmul_size": suite.matmul_size,
            "flop_per_s_median": float(pd.Series(rates).median()),
            "flop_per_s_min": min(rates),
            "flop_per_s_max": max(rates),
            "groups": len(rates),
        }
        for dtype, rates in runner.mm_rates.items()
    }
    sidecar.update(
        finished=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        wall_s=round(wall, 2),
        interrupted=interrupted,
        stopped=runner.stopped,
        calibration=calibration,
        counts={s: sum(1 for r in runner.rows if r["status"] == s) for s in _statuses(runner.rows)},
        noisy_rows=sum(1 for r in runner.rows if r.get("noisy")),
        not_run=not_run,
        load=load,
    )
    busy = machine.busy_reason(load["others_during"], busy_threads) if load else None
    if busy:
        sidecar["warnings"] = [*before, f"during the run, {busy}"]
    _write_json(side_path, sidecar)
    return SpeedRun(
        out_dir=out_dir,
        csv=csv_path,
        sidecar=side_path,
        complexity=cx_path,
        rows=runner.rows,
        exponents=exponents,
        calibration=calibration,
        interrupted=interrupted,
        not_run=not_run,
        wall_s=wall,
        stopped=runner.stopped,
        load=load,
        busy=busy,
    )


def unit_groups(groups: list[Group], unit: Unit, ref: tuple[str, str] | None) -> list[Group]:
    """The groups of one unit: its (dtype, head dim, causal flag), its mechanism's cases and
    the reference's, which is timed in the same rounds (for ref_ratio) but not written."""
    out = []
    for g in groups:
        if (str(g.dtype).removeprefix("torch."), g.head_dim, g.causal) != (
            unit.dtype, unit.head_dim, unit.causal,
        ):  # fmt: skip
            continue
        cases = tuple(c for c in g.cases if c.mech.name == unit.mechanism
                      or (ref is not None and (c.mech.name, c.path.name) == ref))  # fmt: skip
        if any(c.mech.name == unit.mechanism for c in cases):
            out.append(Group(g.dtype, g.head_dim, g.causal, g.seq_len, cases))
    return out


def _previous_rows(csv_path: FilePath) -> list[dict[str, Any]]:
    """The rows of an earlier run in the same folder (``--resume``); none when there is none."""
    if not csv_path.is_file():
        return []
    df = read_results(csv_path)
    return [{c: plain(v) for c, v in row.items()} for row in df.to_dict("records")]


def cuda_state(suite: SpeedSuite, device: torch.device) -> dict[str, Any]:
    """What decides CUDA timings besides the code: TF32 flags, the kernel SDPA's own dispatch
    picks for each (dtype, head dim) of the suite (what ``softmax:efficient`` runs), and the SM
    clock after a spin-up of the GPU (one second of matmuls, so the first group is not timed on
    an idle clock)."""
    from attnbench.kernels.sdpa import default_backend

    state: dict[str, Any] = {
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }
    anchor = MatmulAnchor(device, torch.bfloat16, min(suite.matmul_size, 4096))
    t_end = time.perf_counter() + 1.0
    while time.perf_counter() < t_end:
        anchor()
    torch.cuda.synchronize(device)
    try:
        state["sm_clock_mhz"] = torch.cuda.clock_rate(device)
    except Exception as e:  # needs pynvml; not essential
        state["sm_clock_mhz"] = f"not read ({one_line(e, 80)})"
    picks = {}
    for dtype in suite.torch_dtypes():
        for d in suite.head_dims:
            for causal in suite.causal:
                q = torch.randn(1, 2, 1024, d, device=device, dtype=dtype)
                tag = f"{str(dtype).removeprefix('torch.')} d={d} {'causal' if causal else 'bidir'}"
                try:
                    picks[tag] = default_backend(q, q, q, causal=causal)
                except Exception as e:
                    picks[tag] = f"not read ({one_line(e, 80)})"
    state["sdpa_default_backend"] = picks
    return state


def command_line() -> list[str]:
    """sys.argv as the user typed it: ``attnbench run speed ...`` also for ``python -m``."""
    argv = list(sys.argv)
    if argv and (argv[0].endswith("__main__.py") or FilePath(argv[0]).name == "attnbench"):
        argv[0] = "attnbench"
    return argv


def _statuses(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["status"] for r in rows))


def _write_json(path: FilePath, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------

#: The order in which a series is picked to headline a (mechanism, path) in the summary.
HEADLINE = (("fwd", False), ("fwd", True), ("fwdbwd", False), ("fwdbwd", True))


def summary_rows(run: SpeedRun) -> list[dict[str, Any]]:
    """Per mechanism:path, the headline numbers at its largest measured n, and its exponents."""
    df = pd.DataFrame(run.rows, columns=list(COLUMNS))
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
