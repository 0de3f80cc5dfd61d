"""The sweep of a speed run (:class:`SweepRunner`), group after group: each case admitted or given
its row at once (done in a resumed run, skipped, unsupported, failed to set up), the admitted
ones timed together in interleaved rounds with the group's matmul, then their ``ok`` rows
written, with the reference's ratio and the roofline from the same rounds. The rows go through
a :class:`~attnbench.bench.record.Recorder`."""

from __future__ import annotations

import time
from typing import Any

import torch

from attnbench.bench.config import SpeedSuite
from attnbench.bench.failures import StickyDeviceError, is_sticky_cuda_error, one_line
from attnbench.bench.inference import (
    add_bandwidth,
    padded_work,
    set_up_decode,
    set_up_packed,
    tokens_per_call,
)
from attnbench.bench.member import Member, free_memory, set_up
from attnbench.bench.plan import Case, Group, unsupported_reason
from attnbench.bench.profiles import KernelsWriter, calls_within
from attnbench.bench.record import Recorder
from attnbench.bench.warmup_notes import note_first_call, slow_first_call
from attnbench.core.errors import AttnbenchError
from attnbench.measure.bandwidth import CopyAnchor, copy_anchor
from attnbench.measure.flops import MatmulAnchor, executed_flops, sized_anchor
from attnbench.measure.timing import (
    Clock,
    Stats,
    WarmUp,
    block_calls,
    per_round_ratios,
    round_order,
    stats,
    warm_up,
)
from attnbench.runtime import logs
from attnbench.runtime.progress import Progress

#: Exponent used to predict a path's next call time from its current one (dense attention's n^2;
#: linear paths are over-predicted, which only skips them earlier under a tight limit).
QUADRATIC = 2.0


class SweepRunner:
    """Runs the groups of a plan, in order, into a :class:`Recorder`."""

    def __init__(
        self,
        suite: SpeedSuite,
        groups: list[Group],
        book: Recorder,
        progress: Progress,
        ref: tuple[str, str] | None,
        clock: Clock,
        kernels: KernelsWriter | None = None,
    ) -> None:
        self.suite = suite
        self.groups = groups
        self.book = book
        self.progress = progress
        self.ref = ref
        self.clock = clock
        self.kernels = kernels  # [profile]: the ok cases profiled once every group is timed
        self.ok_cases: list[Case] = []  # this run's ok rows' cases, in plan order
        self.device = suite.torch_device()
        self.anchors: dict[torch.dtype, tuple[MatmulAnchor, int]] = {}  # dtype -> (matmul, block)
        self.mm_rates: dict[str, list[float]] = {}  # dtype -> the matmul rate of every group
        self.copy: tuple[CopyAnchor, WarmUp, int] | None = None  # decoding's copy, built once
        self.copy_samples: list[float] = []  # the copy's samples in the group being written
        self.stopped: str | None = None  # why the sweep ended early (not Ctrl-C)

    @property
    def anchor_sizes(self) -> dict[str, int]:
        """dtype -> the size of the matmul the run timed (sized by time, at most matmul_size)."""
        return {anchor.dtype: anchor.size for anchor, _ in self.anchors.values()}

    def run(self) -> bool:
        """Run every group; returns True when interrupted by Ctrl-C."""
        try:
            for group in self.groups:
                self.run_group(group)
            if self.kernels is not None:
                self.profile_cases()
        except KeyboardInterrupt:
            return True
        except StickyDeviceError as e:
            self.stopped = (
                f"the CUDA context broke ({e}); every later call in this process would fail: "
                "run the same command again with --resume, in a fresh process"
            )
            return True
        return False

    # -- one group -----------------------------------------------------------------------------
    def run_group(self, group: Group) -> None:
        self.progress.stage(group.label())
        inputs_cache: dict[tuple, dict[str, torch.Tensor]] = {}
        members: list[Member] = []
        need_fwd_memory = "fwd" not in {c.direction for c in group.cases}
        for case in group.cases:
            member = self._admit(case, inputs_cache, need_fwd_memory)
            if member is not None:
                members.append(member)
        if members:
            anchor, block = self._anchor(group.dtype)
            copy = self._copy_member() if group.query_len is not None else None
            timed = members + [copy] if copy is not None else members
            anchor_samples = self._time(timed, anchor, block)
            members = [m for m in timed if m is not copy]
            self.copy_samples = copy.samples if copy is not None else []
            self._write_group(members, anchor, anchor_samples)
        inputs_cache.clear()

    def _admit(
        self, case: Case, cache: dict[tuple, dict[str, torch.Tensor]], need_fwd_memory: bool
    ) -> Member | None:
        """The case set up and warmed up, ready to time; or None once its row is settled here
        (or it has one from the resumed run)."""
        book = self.book
        if book.resumed(case):
            return None
        if case.series in book.skip:
            book.emit(case, book.row(case, "skipped", book.skip[case.series]))
            return None
        reason = unsupported_reason(case)
        if reason:
            book.emit(case, book.row(case, "unsupported", reason))
            return None
        try:
            with slow_first_call(case, self.progress.note):  # says so while it compiles
                member = self._set_up(case, cache, need_fwd_memory)
            note_first_call(case, member, self.progress.note)
            return member
        except AttnbenchError as e:  # the mechanism rejects this shape or these params
            book.emit(case, book.row(case, "unsupported", str(e)))
            return None
        except Exception as e:
            book.fail(case, e)
        # Out of the except block: the traceback no longer pins the failed call's tensors.
        free_memory(self.device)
        return None

    def _set_up(
        self, case: Case, cache: dict[tuple, dict[str, torch.Tensor]], need_fwd_memory: bool
    ) -> Member:
        if case.decoding or case.packing:  # an inference shape (bench/inference.py)
            setup = set_up_decode if case.decoding else set_up_packed
            return setup(case, cache, self.clock, self.suite.timing)
        return set_up(case, cache, self.clock, self.suite.timing, need_fwd_memory=need_fwd_memory)

    # -- the profiles, once every group is timed -----------------------------------------------
    def profile_cases(self) -> None:
        """``[profile] calls`` > 0: every case this run wrote an ok row for, set up again group
        by group and profiled into kernels.csv (:mod:`attnbench.bench.profiles`). After the
        last timed round, never before one: on a GPU, CUPTI may stay attached to the process
        after a profile and slow every later launch (pytorch/pytorch#144455), so no timed
        sample runs after a profile."""
        ok = {id(c) for c in self.ok_cases}
        for group in self.groups:
            cases = [c for c in group.cases if id(c) in ok]
            if not cases:
                continue
            self.progress.stage(f"profiling {group.label()}")
            cache: dict[tuple, dict[str, torch.Tensor]] = {}
            for case in cases:
                self._profile_case(case, cache)
            cache.clear()
            free_memory(self.device)

    def _profile_case(self, case: Case, cache: dict[tuple, dict[str, torch.Tensor]]) -> None:
        try:
            member = self._set_up(case, cache, need_fwd_memory=False)
        except Exception as e:  # timed a moment ago: a profile's failure is a warning only
            if is_sticky_cuda_error(e):
                raise StickyDeviceError(one_line(e)) from None
            self.progress.warning(f"{case.label()}: not profiled ({one_line(e, 120)})")
            free_memory(self.device)
            return
        self.progress.note(f"profiling {case.label()}")
        self.kernels.profile(case, self.book.row(case, "ok"), member.call, self.progress.warning,
                             calls_within(self.kernels.calls, member.warm.per_call_s))  # fmt: skip

    def _anchor(self, dtype: torch.dtype) -> tuple[MatmulAnchor, int]:
        """The group's matmul (sized by wall time, built and warmed once per dtype:
        :func:`sized_anchor`) and its calls per sample."""
        if dtype not in self.anchors:
            suite, note = self.suite, self.progress.note
            anchor = sized_anchor(
                self.device, dtype, suite.matmul_size, suite.matmul_max_s, Clock(self.device), note
            )
            self.progress.note(f"warming up the {anchor.dtype} matmul ({anchor.size}^3)")
            warm = warm_up(anchor, self.clock, self.suite.timing)
            self.anchors[dtype] = (anchor, block_calls(warm.per_call_s, self.suite.timing))
        return self.anchors[dtype]

    def _copy_member(self) -> Member:
        """Decoding's memory roofline: the copy (:class:`CopyAnchor`), built once, warmed up,
        and timed as one more member of the group's rounds."""
        if self.copy is None:
            copy = copy_anchor(self.device, self.suite.copy_mib)
            self.progress.note(f"warming up the copy ({self.suite.copy_mib} MiB)")
            warm = warm_up(copy, self.clock, self.suite.timing)
            self.copy = (copy, warm, block_calls(warm.per_call_s, self.suite.timing))
        copy, warm, block = self.copy
        return Member(None, copy, warm, block=block)  # type: ignore[arg-type]

    def _time(self, members: list[Member], anchor: MatmulAnchor, block: int) -> list[float]:
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
            self.progress.note(f"round {r + 1}")
            slots: list[Member | None] = [None, *members]  # None: the matmul
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
                    self.book.fail(m.case, e)
                free_memory(self.device)
        return anchor_samples

    # -- the group's rows ----------------------------------------------------------------------
    def _write_group(
        self, members: list[Member], anchor: MatmulAnchor, anchor_samples: list[float]
    ) -> None:
        mm_rate = anchor.flops / stats(anchor_samples).median
        self.mm_rates.setdefault(anchor.dtype, []).append(mm_rate)
        by_impl = {(m.case.variant, m.case.direction): m for m in members}
        refs: dict[tuple, Member | None] = {}
        if self.ref is not None:
            ref_impl = f"{self.ref[0]}:{self.ref[1]}"
            for m in members:  # per direction, and a packed batch's packed or padded run
                if m.case.impl == ref_impl:
                    refs.setdefault((m.case.direction, layout(m.case)), m)
        for m in members:
            case = m.case
            t = stats(m.samples)
            other = "fwd" if case.direction == "fwdbwd" else "fwdbwd"
            sibling = by_impl.get((case.variant, other))
            values = measured_values(m, sibling, t)
            ref = refs.get((case.direction, layout(case)))
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
            row = self.book.row(case, "ok", **values, **m.values)
            if row["flops"] is not None:
                add_rates(row, m.samples, t, anchor, anchor_samples, mm_rate)
            add_executed(row, case, t)
            if case.decoding and self.copy is not None and self.copy_samples:
                add_bandwidth(row, case, m.samples, t, self.copy[0], self.copy_samples)
            padded_work(row, case, t)
            self.book.emit(case, row)
            if self.book.writes(case):
                self.book.write_samples(row, m.samples, ref_ratios, anchor_samples)
                self.ok_cases.append(case)
            self._limit_longer_lengths(case, t)

    def _limit_longer_lengths(self, case: Case, t: Stats) -> None:
        """Under the suite's ``max_call_s``: skip the series' longer lengths once a call takes,
        or the next length's call is predicted to take, longer than that."""
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
            self.book.skip[case.series] = (
                f"a call took {per_call:.2g} s (median of {t.n}) at n={n}, "
                f"{predicted:.2g} s predicted at n={min(longer) if longer else n} "
                f"(suite limit max_call_s = {limit:g})"
            )


def layout(case: Case) -> str | None:
    """``padded`` or ``packed`` for a packed batch's case (its own entry or the loop alike),
    None for any other: what a case's reference must share to be timed against it."""
    if not case.packing:
        return None
    return "padded" if case.packing == "padded" else "packed"


def measured_values(m: Member, sibling: Member | None, t: Stats) -> dict[str, Any]:
    """An ok row's time and memory columns. The other direction's peak memory comes from the
    sibling (same path, other direction), when the run has it."""
    case = m.case
    if case.direction == "fwd":
        mem_fwd, mem_fwdbwd = m.mem, sibling.mem if sibling else None
    else:
        mem_fwdbwd = m.mem
        mem_fwd = m.mem_fwd or (sibling.mem if sibling else None)
    method = (m.mem or mem_fwd).method if (m.mem or mem_fwd) else None
    return dict(
        time_median_ms=t.median * 1e3,
        time_p20_ms=t.p20 * 1e3,
        time_p80_ms=t.p80 * 1e3,
        samples=t.n,
        calls_per_sample=m.block,
        first_call_ms=m.warm.first_s * 1e3,
        noisy=t.noisy,
        tokens_per_s=tokens_per_call(case) / t.median,
        mem_fwd_bytes=mem_fwd.bytes if mem_fwd else None,
        mem_fwdbwd_bytes=mem_fwdbwd.bytes if mem_fwdbwd else None,
        mem_method=method,
        graph=m.graph,
        graph_reason=m.graph_reason or None,
    )


def add_executed(row: dict[str, Any], case: Case, t: Stats) -> None:
    """A block-sparse path's executed FLOPs (whole blocks, :func:`executed_flops`) and their
    rate; left empty, with a warning, when the count itself fails (the row still stands)."""
    try:
        flops = executed_flops(
            case.path, case.shape, case.causal, case.params, case.direction, case.device
        )
    except Exception as e:  # a count must not cost the measurement
        logs.warn(f"{case.impl}: executed FLOPs not counted ({one_line(e, 80)})")
        return
    if flops is not None:
        row["flops_executed"] = flops
        row["flop_per_s_executed"] = flops / t.median


def add_rates(
    row: dict[str, Any],
    samples: list[float],
    t: Stats,
    anchor: MatmulAnchor,
    anchor_samples: list[float],
    mm_rate: float,
) -> None:
    """The row's FLOP/s, the matmul's, and the roofline: the median over rounds of this case's
    FLOP/s over the matmul's in the same round (``roofline_fa``: in flash-attention's
    convention, fwd+bwd = 3.5x the forward)."""
    row["flop_per_s"] = row["flops"] / t.median
    if row["flops_fa"] is not None:
        row["flop_per_s_fa"] = row["flops_fa"] / t.median
    row["matmul_flop_per_s"] = mm_rate

    def roofline(flops: float) -> float:
        per_round = [
            (flops / x) / (anchor.flops / a) for x, a in zip(samples, anchor_samples, strict=True)
        ]
        return stats(per_round).median

    row["roofline"] = roofline(row["flops"])
    if row["flops_fa"] is not None:
        row["roofline_fa"] = roofline(row["flops_fa"])
