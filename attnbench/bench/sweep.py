"""Running a speed sweep unit by unit (:mod:`attnbench.bench.units`), on this machine or on Ray,
through the runtime's one way to run units (:func:`attnbench.runtime.execute.run_units`): this
module says what one unit does (:func:`_unit`, :func:`_ray_unit`) and what its end leaves (its
folder and record: :func:`_record_end`).

Each unit runs in a worker process, never in the process that drives the sweep: a unit that
crashes (a segfault, a sticky CUDA error, an ``exit``) fails only itself. A failed unit is retried
once in a fresh process; if it fails again its record says how (status ``failed``, the exit code
or the error) and ``attnbench merge`` turns its cases into ``error`` rows naming it.

Executors:

- ``local``: one worker process on this machine, units one after another (what ``--shard I/N``
  uses on each node of a batch scheduler's array job).
- ``ray``: one Ray task per unit (``num_gpus=1`` on a GPU, so two timings never share a GPU; the
  unit's threads as ``num_cpus`` on a CPU). Each task runs in a scratch folder of its node and
  returns its files to this process, so the nodes need no shared file system.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnbench.bench.units import (
    PLAN_NAME,
    RECORD_NAME,
    UNITS_DIR,
    Unit,
    is_done,
    now,
    plan_document,
    publish,
    read_record,
    record,
    speed_units,
    staging_dir,
    unit_dir,
    write_json_atomic,
    write_plan,
)
from attnbench.core.errors import AttnbenchError
from attnbench.measure import machine
from attnbench.runtime.engines import check_executor, check_ray_address, require_ray
from attnbench.runtime.execute import Executor, UnitEnd, Work, run_units
from attnbench.runtime.outputs import remove_stale, write_failed
from attnbench.runtime.ray_tasks import error_reason
from attnbench.runtime.units import shard_units


@dataclass
class SweepOutcome:
    """What a unit-wise run did in this process."""

    out: Path
    units: list[Unit]  # the whole plan
    mine: list[Unit]  # this shard's
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> record, run now
    skipped: list[str] = field(default_factory=list)  # ids already done (--resume)
    interrupted: bool = False
    wall_s: float = 0.0

    @property
    def failed(self) -> list[str]:
        return [i for i, r in self.records.items() if r["status"] != "ok"]

    @property
    def complete(self) -> bool:
        """Every unit of the plan has ended in ``out``, done or failed twice (nothing is left
        for another shard)."""
        return all(read_record(unit_dir(self.out, u)) is not None for u in self.units)


# --------------------------------------------------------------------------------------------
# The worker side: one unit, in whatever process runs it
# --------------------------------------------------------------------------------------------


def run_unit(suite, index: int, unit_id: str, out: Path, attempt: int,
             mechanisms=None) -> dict[str, Any]:  # fmt: skip
    """Run unit ``index`` of ``suite`` into a staging folder under ``out``, then move it to
    ``out/units/<id>`` if it completed; returns its record. An interrupted or stopped unit
    (sticky CUDA error) is not published: its record says ``failed``. The staging folder is
    gone when this returns or raises (a full disk, say): published, or removed."""
    units = speed_units(suite, mechanisms)
    unit = units[index] if index < len(units) else None
    if unit is None or unit.id != unit_id:
        raise AttnbenchError(
            f"unit {index} here is {unit.id if unit else 'missing'}, not {unit_id}: this "
            "process's attnbench or registry differs from the driver's"
        )
    staging = staging_dir(out, unit)
    staging.mkdir(parents=True)
    try:
        rec = _run_staged(suite, unit, staging, attempt, mechanisms)
        if rec["status"] == "ok":
            publish(staging, unit_dir(out, unit))
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # not there any more once published
    return rec


def _run_staged(suite, unit: Unit, staging: Path, attempt: int, mechanisms) -> dict[str, Any]:
    """Run ``unit`` into ``staging`` and write its record there; returns the record."""
    import torch

    from attnbench.bench.run import run_speed

    started = now()
    command = ["attnbench", "run", "speed", "--unit", unit.id]
    run = run_speed(suite, staging, mechanisms=mechanisms, unit=unit, command=command)
    reason = run.stopped or ("interrupted (Ctrl-C)" if run.interrupted else "")
    rec = record(
        unit,
        "failed" if reason else "ok",
        exit_code=0,
        attempts=attempt,
        reason=reason,
        started=started,
        rows=len(run.rows),
        extra={
            "device_name": run.rows[0]["device_name"] if run.rows else None,
            "torch_version": torch.__version__,
            "wall_s": round(run.wall_s, 2),
            "restart": bool(run.stopped),  # the CUDA context is broken: a fresh process
        },
    )
    write_json_atomic(staging / RECORD_NAME, rec)
    return rec


def _unit(unit: Unit, attempt: int, suite, out: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """A worker process's unit, run into ``out``: its record (and no files: the unit published
    its own folder). An error fails the unit, and the sweep goes on."""
    try:
        return run_unit(suite, unit.index, unit.id, out, attempt), {}
    except Exception as e:  # a bug or bad state: the unit fails (in a fresh process next)
        from attnbench.bench.failures import one_line

        return {"status": "failed", "reason": one_line(e), "exit_code": 1, "restart": True}, {}


def _failed(result: tuple[dict[str, Any], dict[str, str]]) -> str | None:
    """Why a unit's record says it failed (None: it did not)."""
    rec = result[0]
    return None if rec["status"] == "ok" else rec.get("reason", "failed")


def _failed_record(unit: Unit, attempts: int, exit_code: int | None, reason: str) -> dict:
    return record(unit, "failed", exit_code=-1 if exit_code is None else exit_code,
                  attempts=attempts, reason=reason)  # fmt: skip


def _keep_failure(out: Path, unit: Unit, rec: dict[str, Any]) -> None:
    """A unit that failed twice leaves a folder holding only its record (no rows)."""
    _publish_files(out, unit, {RECORD_NAME: json.dumps(rec, indent=1, default=str) + "\n"})


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


def plan_sweep(suite, out: Path, shard, resume: bool, overwrite: bool, mechanisms=None):
    """The plan (written to, or checked against, ``out/plan.json``), this shard's units, and
    which of them are to run."""
    from attnbench import registry

    units = speed_units(suite, mechanisms)
    if not units:
        raise AttnbenchError("nothing to run: the suite and options select no case")
    if (out / "results.csv").exists() and not (out / PLAN_NAME).exists() and not overwrite:
        raise AttnbenchError(
            f"--out {out} already holds the results.csv of a single-process run; choose another "
            "directory or pass --overwrite"
        )
    names = [m.name for m in (mechanisms if mechanisms is not None else registry.MECHANISMS)]
    out.mkdir(parents=True, exist_ok=True)
    write_plan(out, plan_document(suite, units, names))
    mine = shard_units(units, shard)
    done = [u for u in mine if unit_dir(out, u).exists()]
    if done and not (resume or overwrite):
        raise AttnbenchError(
            f"--out {out} already holds {len(done)} of these units ({done[0].id}, ...); pass "
            "--resume to run only the missing ones, or --overwrite to run them all again"
        )
    todo = [u for u in mine if overwrite or not is_done(out, u)]
    return units, mine, todo


def run_sweep(
    suite,
    out: Path,
    *,
    executor: str = "local",
    shard: tuple[int, int] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    ray_address: str | None = None,
    log: Callable[[str], None] = print,
) -> SweepOutcome:
    """Run this shard's units of ``suite`` into ``out`` with ``executor``."""
    check_executor(executor)
    if executor == "ray":
        require_ray()  # before any work: a missing Ray is a one-line error
        check_ray_address(ray_address)  # and an address nothing answers at
    units, mine, todo = plan_sweep(suite, out, shard, resume, overwrite)
    _remove_stale(out, log)
    if executor == "local" and (too_many := machine.oversubscribed(suite.thread_count())):
        log(f"warning: {too_many}")  # as a single-process run says (Ray refuses such tasks)
    outcome = SweepOutcome(out, units, mine)
    outcome.skipped = [u.id for u in mine if u not in todo]
    where = f"shard {shard[0]}/{shard[1]}: " if shard else ""
    log(f"{where}{len(todo)} of {len(units)} units to run ({len(outcome.skipped)} done already)"
        f" with the {executor} executor, into {out / UNITS_DIR}")  # fmt: skip
    started = time.perf_counter()
    try:
        _run_units(suite, out, todo, outcome, executor, ray_address, log)
    except KeyboardInterrupt:
        outcome.interrupted = True
    outcome.wall_s = time.perf_counter() - started
    return outcome


def _run_units(suite, out: Path, todo, outcome: SweepOutcome, executor: str,
               ray_address: str | None, log) -> None:  # fmt: skip
    """Run the units ``todo`` with ``executor``, recording each end in ``outcome`` and ``out``."""
    work = Work(_unit, (suite, out), remote_fn=_ray_unit, failed=_failed, unit_id=_unit_id,
                reason_of=_ray_error)  # fmt: skip
    where = Executor(executor, keep_workers=True, driver_stops=True, report=Exception,
                     ray_address=ray_address,
                     resources=_ray_resources(suite) if executor == "ray" else {})  # fmt: skip
    try:
        run_units(
            todo,
            work,
            where,
            lambda end: _record_end(end, out, outcome, log),
            on_retry=lambda end: log(
                f"{end.job.id}: {end.reason}; retrying once in a fresh process"
            ),  # fmt: skip
            log=log,
        )
    finally:
        if executor == "local":  # a worker killed halfway leaves its staging folder
            with contextlib.suppress(OSError):  # never in place of the error that got here
                remove_stale(out / UNITS_DIR)


def _unit_id(unit: Unit) -> str:
    return unit.id


def _record_end(end: UnitEnd, out: Path, outcome: SweepOutcome, log) -> None:
    """A unit's final end: its folder published (a Ray task's files written here), or a folder
    holding only its failed record; the record kept in ``outcome`` and a progress line."""
    unit = end.job
    if end.died or end.error is not None:
        rec, files = _failed_record(unit, end.attempt, end.exit_code, end.reason), {}
    else:
        rec, files = end.result
        if rec["status"] != "ok":
            rec = _failed_record(unit, end.attempt, rec.get("exit_code"), rec.get("reason", ""))
    if rec["status"] == "ok":
        if files:
            _publish_files(out, unit, files)
    else:
        _keep_failure(out, unit, rec)
    outcome.records[unit.id] = rec
    log(_progress(end, unit, rec))


def _remove_stale(out: Path, log) -> None:
    """The staging folders of units whose process was killed on this host (a ``kill -9`` of the
    run, a machine that went down): never published, removed."""
    stale = remove_stale(out / UNITS_DIR)
    if stale:
        log(f"removed {len(stale)} unfinished unit folder{'s' * (len(stale) > 1)} of a killed "
            f"run: {', '.join(p.name for p in stale)}")  # fmt: skip


def _progress(end: UnitEnd, unit: Unit, rec: dict) -> str:
    how = "ok" if rec["status"] == "ok" else f"FAILED: {rec.get('reason', '')}"
    extra = f", {rec['wall_s']:.0f} s" if rec.get("wall_s") is not None else ""
    return f"{end.tally()} {unit.id}: {how}{extra}"


# --------------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------------


def _ray_unit(unit: Unit, attempt: int, suite, out: Path) -> tuple[dict, dict[str, str]]:
    """A Ray task: run the unit in a scratch folder of this node (not ``out``, which the node may
    not see); return its record and files, which the driver writes (no shared file system)."""
    scratch = Path(tempfile.mkdtemp(prefix="attnbench-unit-"))
    try:
        rec = run_unit(suite, unit.index, unit.id, scratch, attempt)
        files = {}
        if rec["status"] == "ok":
            folder = scratch / UNITS_DIR / rec["unit"]
            files = {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir() if p.is_file()}
        return rec, files
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _ray_resources(suite) -> dict[str, float]:
    if suite.torch_device().type == "cuda":
        return {"num_gpus": 1, "num_cpus": 1}
    return {"num_cpus": suite.thread_count(), "num_gpus": 0}


def _publish_files(out: Path, unit: Unit, files: dict[str, str]) -> None:
    """A Ray task's unit folder, written here: whole, or (a full disk) not at all, with the
    file that could not be written named."""
    staging = staging_dir(out, unit)
    try:
        staging.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            try:
                (staging / name).write_text(text, encoding="utf-8")
            except OSError as e:
                raise write_failed(unit_dir(out, unit) / name, e) from None
        publish(staging, unit_dir(out, unit))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _ray_error(e: BaseException) -> str:
    from attnbench.bench.failures import one_line

    reason = error_reason(e)
    return reason if reason.startswith("the process") else one_line(e)
