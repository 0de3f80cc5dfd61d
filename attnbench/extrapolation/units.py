"""An extrapolation run as units, the contract every engine uses (as the speed sweep's,
:mod:`attnbench.bench.units`): one unit per (variant, seed) training, in plan order (seed by seed,
variant by variant), each one its checkpoint; then one evaluation unit, which needs them all.

``--shard I/N`` trains the trainings whose unit number is I mod N into a checkpoint folder every
shard sees; the evaluation unit is ``--eval-only`` with the same options, once every shard is done.
``--executor ray`` runs each training as a Ray task (:func:`train_on_ray`), then evaluates here.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError
from attnbench.runtime.engines import (
    check_fits,
    died_reason,
    inject_fault,
    ray_session,
)


def unit_list(entries: Sequence[tuple], shard: tuple[int, int] | None) -> list[dict[str, Any]]:
    """The run's units (``--list-units``): its trainings, then the evaluation."""
    units: list[dict[str, Any]] = []
    for i, (v, seed, path, _key, ckpt) in enumerate(entries):
        done = ckpt is not None and ckpt.get("done")
        units.append({"index": i, "id": f"train-{v.file_stem}-seed{seed}", "kind": "training",
                      "variant": v.label, "seed": seed, "checkpoint": str(path),
                      "done": bool(done)})  # fmt: skip
    units.append({"index": len(entries), "id": "evaluate", "kind": "evaluation",
                  "needs": [u["id"] for u in units], "done": False})  # fmt: skip
    if shard is not None:
        for u in units:
            u["shard"] = u["index"] % shard[1]
    return units


# --------------------------------------------------------------------------------------------
# Worker processes on this machine
# --------------------------------------------------------------------------------------------


def _job_main(conn, fn, job, args) -> None:
    """A worker process: one job; its result, or its exception, goes back through ``conn``."""
    try:
        reply = ("ok", fn(job, *args))
    except BaseException as e:
        try:
            pickle.dumps(e)
            reply = ("error", e)
        except Exception:
            reply = ("error", AttnbenchError(f"{type(e).__name__}: {e}"))
    conn.send(reply)


class _JobProcess:
    def __init__(self, ctx, fn, job, args):
        self.job = job
        self.conn, child = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_job_main, args=(child, fn, job, args), daemon=True)
        self.proc.start()
        child.close()

    def outcome(self) -> tuple[str, Any] | None:
        """("ok", result), ("error", exception), ("died", exit code), or None while running."""
        if self.conn.poll():
            try:
                reply = self.conn.recv()
                self.proc.join()
                return reply
            except EOFError:
                pass
        if self.proc.is_alive():
            return None
        self.proc.join()
        return ("died", self.proc.exitcode)

    def stop(self, wait_s: float) -> None:
        self.proc.join(wait_s)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()


def train_in_processes(jobs, workers: int, fn, args: tuple, log) -> list:
    """``fn(job, *args)`` for every job, ``workers`` at once, each in its own spawned process (a
    segfault or an exit fails only its own job); logs each result. Returns the jobs whose process
    died. A job that raises makes this raise, after the others running have stopped (Ctrl-C
    reaches them too: they checkpoint and stop; otherwise they are terminated)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue, running, died = list(jobs), [], []
    try:
        while queue or running:
            while queue and len(running) < workers:
                running.append(_JobProcess(ctx, fn, queue.pop(0), args))
            time.sleep(0.05)
            for proc in list(running):
                outcome = proc.outcome()
                if outcome is None:
                    continue
                running.remove(proc)
                kind, value = outcome
                if kind == "ok":
                    log(value)
                elif kind == "died":
                    log(f"{proc.job.variant.label} seed {proc.job.seed}: "
                        f"{_died(value)}")  # fmt: skip
                    died.append(proc.job)
                else:
                    raise value
    except KeyboardInterrupt:
        for proc in running:  # they got the Ctrl-C too: let them write their checkpoints
            proc.stop(wait_s=60)
        raise
    except BaseException:
        for proc in running:
            proc.stop(wait_s=0)
        raise
    return sorted(died, key=jobs.index)


def _died(exit_code: int | None) -> str:
    return died_reason(exit_code, "training it")


# --------------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------------


def _train_task(job, train_stream: Tensor, threads: int, retry_since: float | None):
    """A Ray task: one training (its checkpoints written as it goes, where the driver said);
    returns the summary line and the finished checkpoint's and curve's bytes, which the driver
    writes where they belong when its node does not see them (no shared file system).

    ``retry_since``: this is the retry of a training whose process died; continue from the
    checkpoint it left if that was written during this run (never from an older file)."""
    from attnbench.extrapolation import curves
    from attnbench.extrapolation.progress import NoProgress

    torch.set_num_threads(threads)
    inject_fault(job.unit_id, retry_since is None)
    line = job.after_crash(retry_since).run(train_stream, NoProgress())
    curve = curves.curve_path(job.path)
    return line, job.path.read_bytes(), curve.read_bytes() if curve.exists() else None


def _put(path: Path, data: bytes | None) -> None:
    """Write ``data`` at ``path`` atomically, unless the file there already holds it."""
    if data is None or (path.exists() and path.read_bytes() == data):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def train_on_ray(jobs, train_stream: Tensor, threads: int, device: torch.device,
                 address: str | None, log: Callable[[str], None]) -> set[Path]:  # fmt: skip
    """Each training a Ray task (one GPU each on a GPU; ``threads`` CPUs each on a CPU). A task
    whose process dies is retried once in a fresh process, from its last checkpoint; a training
    that fails twice fails alone, and is reported once the others are done."""
    with ray_session(address, log) as ray:
        log(f"{len(jobs)} trainings as Ray tasks")
        return _train_tasks(ray, jobs, train_stream, threads, device, log)


def _train_tasks(ray, jobs, train_stream, threads, device, log) -> set[Path]:
    if device.type == "cuda":
        resources = {"num_gpus": 1, "num_cpus": 1}
    else:
        resources = {"num_cpus": threads, "num_gpus": 0}
    check_fits(ray, resources)
    task = ray.remote(max_retries=0, **resources)(_train_task)
    retry = ray.remote(max_retries=0, max_calls=1, **resources)(_train_task)
    stream = ray.put(train_stream)
    started = time.time()
    pending = {task.remote(job, stream, threads, None): (job, 1) for job in jobs}
    done, failed, written = 0, [], set()
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            job, attempt = pending.pop(ready[0])
            name = f"{job.variant.label} seed {job.seed}"
            try:
                line, ckpt_bytes, curve_bytes = ray.get(ready[0])
            except Exception as e:
                text = str(e).strip()
                reason = text.splitlines()[0][:200] if text else type(e).__name__
                if attempt == 1:
                    log(f"{name}: {type(e).__name__}: {reason}; retrying once in a fresh process")
                    pending[retry.remote(job, stream, threads, started)] = (job, 2)
                    continue
                failed.append(f"{name} ({type(e).__name__}: {reason})")
                line = f"{name}: FAILED twice"
            else:
                from attnbench.extrapolation import curves

                _put(job.path, ckpt_bytes)
                _put(curves.curve_path(job.path), curve_bytes)
                written.add(job.path)
                done += 1
            log(f"[{done} done, {len(pending)} running, {len(failed)} failed of {len(jobs)}] "
                f"{line}")  # fmt: skip
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    if failed:
        raise AttnbenchError(
            f"{len(failed)} of {len(jobs)} trainings failed twice: {'; '.join(failed)}; the "
            "others are saved: run again with --resume"
        )
    return written
