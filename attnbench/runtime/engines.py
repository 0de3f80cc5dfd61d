"""What both experiments share to run beyond one process (:mod:`attnbench.bench.sweep` for speed
sweeps, :mod:`attnbench.extrapolation.units` for trainings; the processes and Ray tasks
themselves: :mod:`attnbench.runtime.processes`, :mod:`attnbench.runtime.ray_tasks`): shard specs,
Ray's start-up and resource check, and how a dead worker process is described. No torch here.

Fault injection, for the tests of crash isolation: ``ATTNBENCH_FAULT=crash:UNIT_ID`` makes the
process running that unit die (exit code 70) on every attempt, ``crash-once:UNIT_ID`` on its
first attempt only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from attnbench.core.errors import AttnbenchError

EXECUTORS = ("local", "ray")
FAULT_ENV = "ATTNBENCH_FAULT"
FAULT_EXIT = 70
RAY_INSTALL = 'pip install "attnbench[ray]"'


def parse_shard(text: str) -> tuple[int, int]:
    """``"3/8"`` -> (3, 8): shard 3 of 8 (0 <= I < N)."""
    head, sep, tail = text.partition("/")
    try:
        i, n = int(head), int(tail)
    except ValueError:
        i = n = -1
    if not sep or n < 1 or not 0 <= i < n:
        raise AttnbenchError(
            f"--shard {text!r}: accepted: I/N with 0 <= I < N, e.g. 0/4 "
            "(on SLURM: --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT with --array=0-N-1)"
        )
    return i, n


def in_shard(index: int, shard: tuple[int, int] | None) -> bool:
    """Unit ``index`` goes to shard ``index mod N``."""
    return shard is None or index % shard[1] == shard[0]


def check_executor(executor: str) -> None:
    if executor not in EXECUTORS:
        raise AttnbenchError(f"--executor {executor!r}: accepted: {', '.join(EXECUTORS)}")


def inject_fault(unit_id: str, first_attempt: bool) -> None:
    """Die here, as a crash looks from outside (no cleanup, no record), when FAULT_ENV names
    this unit."""
    kind, _, target = os.environ.get(FAULT_ENV, "").partition(":")
    if target == unit_id and (kind == "crash" or (kind == "crash-once" and first_attempt)):
        os._exit(FAULT_EXIT)


def died_reason(exit_code: int | None, doing: str = "running it") -> str:
    if exit_code is not None and exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"the process {doing} was killed by {name}"
    return f"the process {doing} exited with code {exit_code}"


def require_ray():
    try:
        import ray
    except ImportError:
        raise AttnbenchError(
            f"--executor ray: Ray is not installed; install it with {RAY_INSTALL}"
        ) from None
    return ray


@contextlib.contextmanager
def ray_session(address: str | None, log):
    """Ray, started here (or joined at ``address``) unless this process already holds it, and
    shut down on the way out if started here; logs how long the start took."""
    ray = require_ray()
    started_here = not ray.is_initialized()
    t0 = time.perf_counter()
    if started_here:
        start_ray(ray, address)
    how = f"joined {address}" if address else "a local Ray instance started"
    log(f"ray: {how} in {time.perf_counter() - t0:.1f} s; resources {ray.cluster_resources()}")
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


def start_ray(ray, address: str | None) -> None:
    """Join the cluster at ``address``, or start a local Ray instance. Ray starts its workers
    at niceness 15: on a machine where anything else runs, a timing or a training would get
    the leftovers of the CPU (measured here: a matmul 25x slower beside two busy processes). A
    local instance started here runs them at the priority of this process; a cluster decides
    for its nodes (start them with RAY_worker_niceness=0)."""
    if not address:
        os.environ.setdefault("RAY_worker_niceness", "0")
    # "local": a new instance here, never a cluster RAY_ADDRESS or an earlier `ray start` names
    ray.init(address=address or "local", include_dashboard=False, log_to_driver=False,
             configure_logging=False)  # fmt: skip


def check_fits(ray, resources: dict[str, float]) -> None:
    """Refuse, before submitting, a task no node of the cluster can ever run (Ray would wait
    for it forever): more CPUs or GPUs than the largest node has."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    need_cpu, need_gpu = resources.get("num_cpus", 0), resources.get("num_gpus", 0)
    if any(n.get("CPU", 0) >= need_cpu and n.get("GPU", 0) >= need_gpu for n in nodes):
        return
    biggest = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)), default={})
    raise AttnbenchError(
        f"--executor ray: each task needs {need_cpu:g} CPUs and {need_gpu:g} GPUs, and no node "
        f"of this Ray cluster has that (largest: {biggest.get('CPU', 0):g} CPUs, "
        f"{biggest.get('GPU', 0):g} GPUs); on a CPU give --threads at most its CPUs"
    )
