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

The parts, in that order: :mod:`~attnbench.bench.plan` (groups and cases),
:mod:`~attnbench.bench.runner` (the sweep: admitting, timing), :mod:`~attnbench.bench.member`
(one case made ready to time), :mod:`~attnbench.bench.record` (rows, written as they are known),
:mod:`~attnbench.bench.failures` (what an exception means for a row),
:mod:`~attnbench.bench.provenance` (the sidecar) and :mod:`~attnbench.bench.summary` (a finished
run in a few numbers). This module puts them together: :func:`run_speed`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path as FilePath
from typing import Any

import pandas as pd
import torch

from attnbench import registry
from attnbench.bench.complexity import fit_exponents
from attnbench.bench.config import SpeedSuite, reference_pair
from attnbench.bench.plan import Group, plan
from attnbench.bench.profiles import KERNELS_NAME, TRACES_DIR, KernelsWriter
from attnbench.bench.profiles import clear as clear_profiles
from attnbench.bench.provenance import (
    calibration,
    finish_sidecar,
    load_warnings,
    start_sidecar,
    write_json,
)
from attnbench.bench.record import Recorder
from attnbench.bench.results import (
    COLUMNS,
    SAMPLES_NAME,
    ResultsWriter,
    SamplesWriter,
    plain,
    read_results,
    row_key,
)
from attnbench.bench.runner import SweepRunner
from attnbench.bench.summary import (
    COMPLEXITY_NAME,
    CSV_NAME,
    SIDECAR_NAME,
    WARNINGS_NAME,
    SpeedRun,
)
from attnbench.bench.units import Unit
from attnbench.bench.warmup_notes import autotune_notes
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Mechanism
from attnbench.measure import machine
from attnbench.measure.gpu_timing import gpu_only_options, make_clock
from attnbench.measure.timing import retain_freed_memory
from attnbench.runtime.outputs import ensure_dir, os_error_words, refuse_to_replace, write_csv
from attnbench.runtime.progress import Progress, Silent
from attnbench.runtime.schema import key_difference
from attnbench.runtime.warning_log import WarningLog


def prepare_out_dir(
    out: FilePath, overwrite: bool, profiles: bool = False, start_over: bool = False
) -> None:
    """Create ``out`` and make sure it can be written; never clobber results unless told
    (:func:`~attnbench.runtime.outputs.refuse_to_replace`, the rule of every command).
    ``start_over`` (a run keeping no earlier rows): the profile files of the run it replaces
    (those its sidecar names) are removed, since they go with its rows."""
    names = (CSV_NAME, SAMPLES_NAME, COMPLEXITY_NAME) + (KERNELS_NAME, TRACES_DIR) * profiles
    refuse_to_replace([out / name for name in names], option="--out", folder=out,
                      overwrite=overwrite)  # fmt: skip
    ensure_dir(out, "--out folder")
    try:
        probe = out / ".attnbench-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise AttnbenchError(
            f"--out {out}: cannot write there ({os_error_words(e)}); choose a writable folder"
        ) from None
    if start_over:
        clear_profiles(out, out / SIDECAR_NAME)


def run_speed(
    suite: SpeedSuite,
    out_dir: FilePath,
    *,
    mechanisms: Sequence[Mechanism] | None = None,
    progress: Progress | None = None,
    overwrite: bool = False,
    command: Sequence[str] | None = None,
    resume: bool = False,
    unit: Unit | None = None,
) -> SpeedRun:
    """Run ``suite``, writing ``results.csv`` (rows as produced), ``results.json`` (provenance)
    and ``complexity.csv`` into ``out_dir``. Never raises on a failing case; raises
    AttnbenchError only for bad input, before anything runs. ``unit``: run only that unit of
    the sweep (:mod:`attnbench.bench.units`), its rows only."""
    progress = progress or Silent()
    device = suite.torch_device()
    groups, ref = _planned(suite, mechanisms, device, unit)
    csv_path, side_path = out_dir / CSV_NAME, out_dir / SIDECAR_NAME
    previous = _previous_rows(csv_path) if resume else []
    if previous:
        refuse_other_settings(out_dir, suite, previous)
    prepare_out_dir(out_dir, overwrite or resume, bool(suite.profile_calls), not previous)
    new_files = _new_files(out_dir, suite)
    retained = retain_freed_memory() if suite.timing.retain_memory else False
    threads_before = torch.get_num_threads()
    threads = suite.thread_count()
    torch.set_num_threads(threads)
    started = time.perf_counter()
    busy_threads = threads if device.type == "cpu" else 1  # a GPU run keeps one core busy
    watch = machine.LoadWatch(busy_threads).start()
    before = load_warnings(watch, threads, busy_threads)
    sidecar = start_sidecar(suite, device, threads, command, retained, watch, before)
    try:
        write_json(side_path, sidecar)
        writer, samples_writer, kernels = _open_writers(out_dir, previous, suite)
    except BaseException:  # a full disk: no file of this run is left behind, and no thread
        torch.set_num_threads(threads_before)
        watch.stop()
        _remove(new_files)
        raise
    clock = make_clock(device, suite.timing)
    book = Recorder(suite, writer, samples_writer, progress, threads=threads, clock=clock.name,
                    device_name=machine.device_name(device),
                    recorded=None if unit is None else {unit.mechanism})  # fmt: skip
    runner = SweepRunner(suite, groups, book, progress, ref, clock, kernels)
    if unit is not None:
        sidecar["unit"] = unit.id
    total = sum(1 for g in groups for c in g.cases if book.writes(c))
    if previous:
        book.resume_from(previous)
        sidecar["resumed_with_rows"] = len(previous)
    caught = WarningLog(out_dir / WARNINGS_NAME)
    try:
        for w in before:
            progress.warning(w)
        progress.start(run_title(suite, device, threads), total)
        # torch's warnings into a file of the run, not between the progress lines; Triton's
        # autotuning said as it happens
        with caught, autotune_notes(device, progress.note):
            interrupted = runner.run()
    except BaseException:  # e.g. a full disk at the first row: no empty results file is kept
        new_files = new_files if writer.rows == 0 and not previous else []
        raise
    else:
        new_files = []
    finally:
        _close(writer, samples_writer, kernels)
        torch.set_num_threads(threads_before)
        load = watch.stop()
        progress.finish()
        _remove(new_files)
    wall = time.perf_counter() - started
    sidecar["torch_warnings"] = caught.summary()
    run = _finish(suite, runner, out_dir, sidecar, interrupted, wall, load, before, busy_threads)
    run.warnings = caught.count
    run.warnings_file = caught.path if caught.count else None
    run.kernels, run.profiled = (kernels.path, kernels.cases) if kernels else (None, 0)
    return run


def _new_files(out_dir: FilePath, suite: SpeedSuite) -> list[FilePath]:
    """The files this run will create that are not there yet (removed again if it fails
    before its first row)."""
    names = [CSV_NAME, SIDECAR_NAME, SAMPLES_NAME] + [KERNELS_NAME] * bool(suite.profile_calls)
    return [out_dir / name for name in names if not (out_dir / name).exists()]


def _planned(
    suite: SpeedSuite,
    mechanisms: Sequence[Mechanism] | None,
    device: torch.device,
    unit: Unit | None,
) -> tuple[list, Any]:
    """The sweep's groups (only ``unit``'s, when given) and its reference pair; a timing option
    this device cannot honour is refused first."""
    refused = gpu_only_options(suite.timing, device)
    if refused:
        raise AttnbenchError(refused)
    mechanisms = list(mechanisms if mechanisms is not None else registry.MECHANISMS)
    groups = plan(suite, mechanisms)
    ref = reference_pair(suite, mechanisms)
    if unit is not None:
        groups = unit_groups(groups, unit, ref)
    return groups, ref


def run_title(suite: SpeedSuite, device: torch.device, threads: int) -> str:
    """The progress title: the suite and the device, and on the CPU the threads it runs on when
    that is fewer than the cores (``max_threads``)."""
    title = f"{suite.name} on {machine.device_name(device)}"
    cores = os.cpu_count() or 1
    if device.type == "cpu" and threads < cores:
        why = " (the suite's max_threads)" if not suite.threads else ""
        title += f", {threads} thread{'s' * (threads > 1)} of {cores} cores{why}"
    return title


def _close(*files: Any) -> None:
    for f in files:
        if f is not None:
            f.close()


def _open_writers(
    out_dir: FilePath, previous: list[dict[str, Any]], suite: SpeedSuite
) -> tuple[ResultsWriter, SamplesWriter, KernelsWriter | None]:
    """The results file (a new one starts with its header, written whole or not at all; a
    resumed run's ``previous`` rows kept), the samples file and, with ``[profile] calls``, the
    kernel profiles' file, open for rows; those opened are closed again when the next cannot be
    opened."""
    append = bool(previous)
    kept = {row_key(r) for r in previous} if previous else None
    opened: list = []
    try:
        opened.append(ResultsWriter(out_dir / CSV_NAME, append=append))
        opened.append(SamplesWriter(out_dir / SAMPLES_NAME, append=append))
        kernels = None
        if suite.profile_calls:
            kernels = KernelsWriter(out_dir, suite.profile_calls, suite.profile_trace, kept)
        return opened[0], opened[1], kernels
    except BaseException:
        _close(*opened)
        raise


def _remove(paths: Sequence[FilePath]) -> None:
    """The files a run made before it failed without a row (its sidecar, a results file with
    a header alone, an empty samples file): removed, so that no empty results file is left."""
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


def _finish(
    suite: SpeedSuite,
    runner: SweepRunner,
    out_dir: FilePath,
    sidecar: dict[str, Any],
    interrupted: bool,
    wall: float,
    load: dict[str, Any] | None,
    before: list[str],
    busy_threads: int,
) -> SpeedRun:
    """After the sweep: the exponents fitted and written, the sidecar completed and written."""
    rows = runner.book.rows
    cx_path = out_dir / COMPLEXITY_NAME
    exponents = fit_exponents(pd.DataFrame(rows, columns=list(COLUMNS)))
    write_csv(exponents, cx_path, index=False, float_format="%.4g")
    not_run = runner.book.not_run(runner.groups)
    rates = calibration(suite, runner.mm_rates, runner.anchor_sizes)
    finish_sidecar(sidecar, wall=wall, interrupted=interrupted, stopped=runner.stopped,
                   calibration=rates, rows=rows, not_run=not_run, load=load)  # fmt: skip
    busy = machine.busy_reason(load["others_during"], busy_threads) if load else None
    if busy:
        sidecar["warnings"] = [*before, f"during the run, {busy}"]
    write_json(out_dir / SIDECAR_NAME, sidecar)
    return SpeedRun(
        out_dir=out_dir,
        csv=out_dir / CSV_NAME,
        sidecar=out_dir / SIDECAR_NAME,
        complexity=cx_path,
        rows=rows,
        exponents=exponents,
        calibration=rates,
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
            out.append(replace(g, cases=cases))
    return out


#: Settings a resumed run may differ in: they do not change what a row means.
NOT_COMPARED = ("description", "file", "sha256", "profile")


def refuse_other_settings(out: FilePath, suite: SpeedSuite, previous: list[dict[str, Any]]) -> None:
    """``--resume`` continues the run in ``out`` only with the settings it was started with (its
    sidecar's suite): rows of two suites, or timed two ways, in one results.csv would compare
    like with unlike. Refused with the keys that differ, as a resumed training is."""
    wanted = {k: v for k, v in suite.settings().items() if k not in NOT_COMPARED}
    try:
        sidecar = json.loads((out / SIDECAR_NAME).read_text(encoding="utf-8"))
        saved = {k: v for k, v in sidecar["suite"].items() if k not in NOT_COMPARED}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none, or not readable
        names = sorted({str(r.get("suite")) for r in previous} - {suite.name})
        saved = {**wanted, "name": names[0]} if names else wanted
    diff = key_difference(json.loads(json.dumps(saved, default=str)),
                          json.loads(json.dumps(wanted, default=str)))  # fmt: skip
    if diff:
        raise AttnbenchError(
            f"--resume: {out} holds a run with other settings ({diff}); resume with the same "
            "suite and options, or choose another --out (or --overwrite instead of --resume)"
        )


def _previous_rows(csv_path: FilePath) -> list[dict[str, Any]]:
    """The rows of an earlier run in the same folder (``--resume``); none when there is none."""
    if not csv_path.is_file():
        return []
    df = read_results(csv_path)
    return [{c: plain(v) for c, v in row.items()} for row in df.to_dict("records")]
