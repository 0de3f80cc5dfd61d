"""``attnbench run extrapolate``: train at one length, evaluate at longer ones (Su 2021).

For every seed and every trained variant: build the encoder (:mod:`.model`), train it at L
(:mod:`.train`, checkpointed), evaluate masked-token accuracy at every evaluation length on the
same held-out span with the same masks (:mod:`.evaluate`). ``--train-only`` stops after the
training (evaluate later with ``--eval-only``); it is the one mode torchrun may start, each
training then data-parallel over its processes (:mod:`.distributed`).
The trained O model is also evaluated with each evaluation-time trick
(:mod:`.tricks`) loaded into the same weights. Results: one tidy CSV row per
(variant, seed, length), a JSON sidecar, a Markdown table (mean ± std over seeds, Su 2021's
published rows beside ours) and a figure.

What silently breaks such experiments, and what this run does about it: n is the
real length (no padding exists); the scaling lives in the mechanism, so training and evaluation
use the same code; one held-out stream, contiguous windows, masks fixed by a seed; a length guard
at every layer; several seeds; the chunk-L floor as a row.

The run reads as plan -> trainings -> evaluations -> results, one module each:
:mod:`.plan` (options, inputs, which checkpoints to train or load, processes and threads),
:mod:`.trainings` (training jobs here, as units of the runtime in worker processes or on Ray, or
under torchrun), :mod:`.evaluations` (evaluations as tasks, here or as units in worker processes,
and the rows they give) and :mod:`.results` (pieces, table, figure, sidecar).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.analysis import longrange_report, report
from attnbench.extrapolation.experiment.config import ExtrapConfig
from attnbench.extrapolation.experiment.evaluations import EvalTask, eval_task_count, evaluate_tasks
from attnbench.extrapolation.experiment.plan import (
    Plan,
    RunInputs,
    RunOptions,
    parallel_layout,
    read_inputs,
    threads_per_process,
)
from attnbench.extrapolation.experiment.results import CSV_NAME, write_results
from attnbench.extrapolation.experiment.trainings import (
    gather_curves,
    train_in_parallel,
    train_only,
    train_or_load,
)
from attnbench.extrapolation.training import curves, distributed, weights
from attnbench.extrapolation.training.batches import HeldoutProbe
from attnbench.measure import machine
from attnbench.runtime import engines
from attnbench.runtime.interrupts import Stopped, said_as
from attnbench.runtime.outputs import ensure_dir, remove_stale
from attnbench.runtime.progress import Silent


@dataclass
class RunResult:
    rows: list[dict[str, Any]]
    out: Path
    table: str
    notes: list[str]


def _quiet(msg: str) -> None:
    """The log of torchrun's ranks other than 0 (rank 0 says it all once)."""


def run_extrapolate(cfg: ExtrapConfig, opts: RunOptions) -> RunResult:
    """Train (or resume, or load) every variant and seed, evaluate, write the outputs (with
    ``opts.train_only``: train and stop, data-parallel when torchrun started this process)."""
    opts, world = _checked(cfg, opts)
    started = dt.datetime.now(dt.timezone.utc)
    inputs = read_inputs(cfg, opts)
    _check_keep_weights(opts, inputs.variants)
    probe = HeldoutProbe.from_stream(
        inputs.split.heldout,
        cfg.model.train_len,
        cfg.run.heldout_windows,
        cfg.train.mask_prob,
        cfg.eval.seed,
        cfg.run.heldout_every,
        causal=cfg.model.causal,
    )
    plan = Plan(cfg, inputs.variants, inputs.seeds, inputs.corpus.sha256, opts, probe)

    ensure_dir(opts.out, "--out folder")
    device = inputs.device
    dist = distributed.start(device) if world > 1 else None  # waits for every rank
    local_processes = 1
    if dist is not None:
        device, local_processes = dist.device, dist.local_world_size
        opts.log(f"data-parallel training over {dist.world_size} torchrun processes on {device}")
    _remove_stale(opts)
    threads = threads_per_process(cfg, local_processes)
    # the run keeps its threads busy on a CPU; on a GPU, one core per process feeds it
    busy = threads * local_processes if device.type == "cpu" else local_processes
    watch = machine.LoadWatch(busy).start()
    warnings = _load_warnings(watch, threads * local_processes, busy)
    for w in warnings:
        opts.log(f"warning: {w}")
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if opts.train_only:
            with _while_training(opts):
                train_only(cfg, opts, plan, inputs.split.train, device, dist)
            _keep_weights(opts, plan)
            return RunResult([], opts.out, "", inputs.notes)
        rows, trainings, curves_csv = _train_and_evaluate(cfg, opts, plan, inputs, device)
        _keep_weights(opts, plan)
    finally:
        torch.set_num_threads(old_threads)
        load = watch.stop()
        if dist is not None:
            dist.shutdown()
    if load and (during := machine.busy_reason(load["others_during"], busy)):
        warnings.append(f"during the run, {during}")
        opts.log(f"warning: during the run, {during}")
    table_md = write_results(cfg, opts, inputs, rows, trainings, curves_csv, started, device,
                             load=load, warnings=warnings)  # fmt: skip
    return RunResult(rows, opts.out, table_md, inputs.notes)


def _check_keep_weights(opts: RunOptions, variants) -> None:
    trained = [v.label for v in variants]
    if missing := [name for name in opts.keep_weights if name not in trained]:
        raise AttnbenchError(
            f"--keep-weights {','.join(missing)}: not a trained variant of this run; "
            f"accepted: {', '.join(trained)}"
        )


def _keep_weights(opts: RunOptions, plan: Plan) -> None:
    """``--keep-weights``: float16 copies of the listed variants' checkpoints in OUT/weights."""
    paths = [path for v, _, path, _, _ in plan.entries if v.label in opts.keep_weights]
    if paths and distributed.torchrun_is_main():  # under torchrun, rank 0 alone writes
        kept = weights.keep(paths, opts.out / weights.FOLDER)
        opts.log(f"kept the weights of {len(kept)} checkpoints in {opts.out / weights.FOLDER}")


def _load_warnings(watch: machine.LoadWatch, threads: int, busy: int) -> list[str]:
    """What makes this machine slow for the run, as it starts: more torch threads (all
    processes together) than usable cores, other processes keeping the cores busy. Said at
    the start and kept in the sidecar, as the speed suite does: the training times depend on
    them."""
    before = watch.before[0] if watch.before else None
    found = (machine.oversubscribed(threads), machine.busy_reason(before, busy))
    return [w for w in found if w]


def _remove_stale(opts: RunOptions) -> None:
    """The temporary files a killed run of this host left (a checkpoint or a curve written
    halfway when its process was killed): removed before this run writes there."""
    folders = (opts.out, opts.ckpt_dir, opts.ckpt_dir / curves.CURVES_DIR)
    stale = [p for folder in folders for p in remove_stale(folder)]
    if stale:
        opts.log(f"removed {len(stale)} temporary file{'s' * (len(stale) > 1)} of a killed "
                 f"run: {', '.join(str(p) for p in stale)}")  # fmt: skip


def _checked(cfg: ExtrapConfig, opts: RunOptions) -> tuple[RunOptions, int]:
    """Every refusal that needs no data, before any work; returns the options (quiet on
    torchrun's ranks other than 0) and torchrun's world size (1 without torchrun). The config
    was checked when it was made (its sections are Checked dataclasses)."""
    opts.check()
    if opts.executor == "ray" and not opts.eval_only:
        engines.check_ray_address(opts.ray_address)  # nothing answers there: said now, not later
    world = distributed.torchrun_world_size()
    if world > 1:
        distributed.shares(cfg.train.batch, world)  # a batch too small to split: refused now
        if not distributed.torchrun_is_main():
            opts = dataclasses.replace(opts, log=_quiet, progress=Silent)
    if opts.tensorboard is not None:
        curves.require_tensorboard()
    ensure_dir(opts.out, "--out folder", create=False)  # a mistake shows before any work
    ensure_dir(opts.ckpt_dir, "checkpoint folder", create=False)
    if cfg.train.steps < cfg.train.warmup:
        opts.log(
            f"warning: train.steps={cfg.train.steps} is below the learning-rate warm-up "
            f"(train.warmup={cfg.train.warmup}): the run never reaches the peak learning rate; "
            "fine for a smoke test, not for a result"
        )
    return opts, world


def _train_and_evaluate(cfg: ExtrapConfig, opts: RunOptions, plan: Plan, inputs: RunInputs,
                        device: torch.device):  # fmt: skip
    """Train (unless --eval-only) and evaluate every planned checkpoint, then the count
    baseline, rewriting extrapolate.csv as the rows come; returns the rows, each training's
    summary (for the sidecar) and the combined curves file (None when there is none)."""
    train_stream, eval_rows = inputs.split.train, inputs.eval_rows
    rows: list[dict[str, Any]] = []
    curves_csv: Path | None = None
    trainings: list[dict[str, Any]] = []
    if not opts.eval_only:
        with _while_training(opts):
            plan.reload(train_in_parallel(cfg, opts, plan, train_stream, device))
    tasks: list[EvalTask] = []
    layout = parallel_layout(cfg, device, eval_task_count(plan, eval_rows), opts)
    for v, seed, path, key, ckpt in plan.entries:
        with _while_training(opts):
            ckpt, info = train_or_load(cfg, opts, v, seed, path, key, ckpt, train_stream,
                                       device, probe=plan.probe)  # fmt: skip
        trainings.append(info)
        curves_csv = gather_curves(plan, opts)
        tasks += EvalTask.for_checkpoint(cfg, v, seed, path, eval_rows, str(device))
        if layout[0] < 2:  # one process: a checkpoint's rows as soon as it is trained
            _evaluate(tasks, inputs, layout, rows, opts)
            tasks = []
    tasks.append(EvalTask(cfg, "baseline", None, None, None, "cpu"))
    # Several processes: every evaluation is queued (rows come back in plan order).
    _evaluate(tasks, inputs, layout, rows, opts)
    return rows, trainings, curves_csv


def _evaluate(tasks: list[EvalTask], inputs: RunInputs, layout: tuple[int, int],
              rows: list[dict[str, Any]], opts: RunOptions) -> None:  # fmt: skip
    """Evaluate ``tasks`` (here or in ``layout``'s processes), adding their rows to ``rows``
    (all of them written already) and rewriting extrapolate.csv after each task. Ctrl-C raises
    :class:`Stopped`, saying how many finished rows the file keeps."""
    written = len(rows)

    def take(task_rows: list[dict[str, Any]]) -> None:
        nonlocal written
        rows.extend(task_rows)
        _write_rows(rows, opts)
        written = len(rows)

    try:
        evaluate_tasks(tasks, inputs.stream, inputs.split.train, layout, opts.log, take)
    except KeyboardInterrupt:
        raise Stopped("during evaluation", _rows_kept(written, opts)) from None


def _rows_kept(written: int, opts: RunOptions) -> str:
    """What a run stopped during its evaluation keeps: the rows extrapolate.csv holds."""
    where = f"{written} finished rows are in {opts.out / CSV_NAME}"
    return f"{where if written else 'no rows were written yet'}; {_go_on(opts)}"


def _while_training(opts: RunOptions):
    """Ctrl-C inside the block comes out as :class:`Stopped` naming the checkpoints kept."""
    return said_as("during training", lambda: _checkpoints_kept(opts))


def _checkpoints_kept(opts: RunOptions) -> str:
    """What a run stopped during its trainings keeps: the checkpoints written so far (a
    training's last periodic one included)."""
    return f"the checkpoints written so far are in {opts.ckpt_dir}; {_go_on(opts)}"


def _go_on(opts: RunOptions) -> str:
    """How to go on from a run that Ctrl-C stopped: --resume continues the checkpoints and
    evaluates them (an --eval-only run, which excludes --resume, is run again)."""
    return "run the same command again" if opts.eval_only else "continue with --resume"


def _write_rows(rows: list[dict[str, Any]], opts: RunOptions) -> None:
    """extrapolate.csv (and longrange.csv when the long-range span is on) from the rows so far."""
    report.write_csv(rows, opts.out / CSV_NAME)
    longrange_report.write_csv(rows, opts.out / longrange_report.CSV_NAME)
