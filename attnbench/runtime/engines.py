"""What both experiments share to run beyond one process (the one way to run units:
:mod:`attnbench.runtime.execute`; the processes and Ray tasks themselves:
:mod:`attnbench.runtime.processes`, :mod:`attnbench.runtime.ray_tasks`): shard specs, Ray's
start-up and resource check, and how a dead worker process is described. No torch here.

Fault injection, for the tests of crash isolation: ``ATTNBENCH_FAULT=crash:UNIT_ID`` makes the
process running that unit die (exit code 70) on every attempt, ``crash-once:UNIT_ID`` on its
first attempt only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from attnbench.core.errors import AttnbenchError

EXECUTORS = ("local", "ray")
FAULT_ENV = "ATTNBENCH_FAULT"
FAULT_EXIT = 70
RAY_INSTALL = 'pip install "attnbench[ray]"'
#: Seconds to reach a Ray cluster given by --ray-address before giving up with one line: an
#: address nothing answers at would otherwise hang for minutes.
RAY_CONNECT_TIMEOUT_S = 30.0
#: What the child process that tries an address first runs (argv[1]: the address).
RAY_PROBE = (
    "import sys, ray; ray.init(address=sys.argv[1], include_dashboard=False, "
    "log_to_driver=False, configure_logging=False); ray.shutdown()"
)
#: Ray's own setting for how many seconds it retries reaching a cluster's head.
RAY_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"
#: The port of a Ray head when an address names none (``ray start --head``'s default).
RAY_PORT = 6379
RAY_CLIENT_PORT = 10001


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
    shut down on the way out if started here; logs how long the start took.

    SIGTERM keeps meaning what it meant before Ray (the CLI's: stop as Ctrl-C does). Ray
    replaces it while it starts (``sys.exit(15)`` in Python, then a C++ handler that prints a
    crash dump and aborts: exit 134); it is put back once Ray has started, and a SIGTERM that
    came during the start reads as Ctrl-C."""
    ray = require_ray()
    started_here = not ray.is_initialized()
    t0 = time.perf_counter()
    try:
        if started_here:
            with _sigterm_kept():
                start_ray(ray, address)
        how = f"joined {address}" if address else "a local Ray instance started"
        log(f"ray: {how} in {time.perf_counter() - t0:.1f} s; "
            f"resources {ray.cluster_resources()}")  # fmt: skip
        yield ray
    finally:
        if started_here and ray.is_initialized():
            with _sigterm_kept():
                ray.shutdown()


@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """SIGTERM's handler as it was before the block (Ray's start and shutdown install theirs);
    Ray's ``sys.exit(SIGTERM)`` during the block becomes KeyboardInterrupt, the CLI's SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; Ray sets none elsewhere
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    except SystemExit as e:
        if e.code != signal.SIGTERM:
            raise
        raise KeyboardInterrupt from None
    finally:
        if before is not None:  # None: set outside Python, nothing to put back
            signal.signal(signal.SIGTERM, before)


def start_ray(ray, address: str | None) -> None:
    """Join the cluster at ``address``, or start a local Ray instance. Ray starts its workers
    at niceness 15: on a machine where anything else runs, a timing or a training would get
    the leftovers of the CPU (measured here: a matmul 25x slower beside two busy processes). A
    local instance started here runs them at the priority of this process; a cluster decides
    for its nodes (start them with RAY_worker_niceness=0)."""
    if address:
        join_ray(ray, address)
        return
    os.environ.setdefault("RAY_worker_niceness", "0")
    # "local": a new instance here, never a cluster RAY_ADDRESS or an earlier `ray start` names
    ray.init(address="local", include_dashboard=False, log_to_driver=False,
             configure_logging=False)  # fmt: skip


def join_ray(ray, address: str, timeout_s: float | None = None) -> None:
    """Join the Ray cluster at ``address`` within ``timeout_s`` (RAY_CONNECT_TIMEOUT_S) in all,
    or raise one line naming it. First a plain TCP connection to its head (an address nothing
    answers at, a closed port or an unknown host fails here); then a child process joins and
    leaves, killed at the time limit: Ray's own connection cannot be given one (where a port
    answers but no Ray head does, it retried for 70 to 120 s here whatever its settings); then
    this process joins, its retries bounded by Ray's own setting. What Ray prints while it
    retries is shown only when it joins."""
    timeout_s = RAY_CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    check_ray_address(address, timeout_s)
    _probe(address, timeout_s, max(1.0, deadline - time.monotonic()))
    wait = os.environ.get(RAY_WAIT_ENV)
    os.environ[RAY_WAIT_ENV] = wait or str(max(1, round(timeout_s)))  # Ray's retries, bounded
    with _stderr_held() as held, contextlib.ExitStack() as restore:
        restore.callback(_put_env, RAY_WAIT_ENV, wait)
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)  # fmt: skip
        except (ConnectionError, RuntimeError, TimeoutError) as e:
            held.drop()
            raise _unreachable(address, timeout_s, f"Ray: {e}") from None


def check_ray_address(address: str | None, timeout_s: float | None = None) -> None:
    """Refuse, before any work, a ``--ray-address`` whose head cannot be reached: a TCP
    connection to it within ``timeout_s`` (RAY_CONNECT_TIMEOUT_S), refused, or a host name that
    does not resolve. None (start Ray here), ``auto`` and ``local`` pass."""
    timeout_s = RAY_CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    head = _head(address) if address else None
    if head is None:
        return
    try:
        socket.create_connection(head, timeout=timeout_s).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise _unreachable(address, timeout_s, why) from None


def _probe(address: str, timeout_s: float, left_s: float) -> None:
    """Join ``address`` from a child process, killed after ``left_s``: an error naming the
    address when it does not join in time, or fails."""
    try:
        done = subprocess.run([sys.executable, "-c", RAY_PROBE, address], capture_output=True,
                              text=True, timeout=left_s, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise _unreachable(address, timeout_s, "Ray did not connect in time") from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
        why = lines[-1].strip()[:200] if lines else f"exit code {done.returncode}"
        raise _unreachable(address, timeout_s, f"Ray: {why}")


def _put_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _head(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``HOST[:PORT]`` or ``ray://HOST[:PORT]`` address; None for the
    addresses Ray resolves itself (``auto``, ``local``)."""
    _, scheme, rest = address.rpartition("://")
    text = rest if scheme else address
    if text in ("auto", "local", ""):
        return None
    host, colon, port = text.rpartition(":")
    if not colon:  # ray://HOST: Ray's client server, on its own port
        return text, RAY_CLIENT_PORT if scheme else RAY_PORT
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def _unreachable(address: str, timeout_s: float, why: str) -> AttnbenchError:
    return AttnbenchError(
        f"--ray-address {address}: cannot join a Ray cluster there ({why}; connecting is given "
        f"{timeout_s:g} s); accepted: the HOST:PORT of a running head node (`ray start --head` "
        "prints it), or no --ray-address to start Ray here"
    )


class _Held:
    """Standard error written while Ray connects, shown afterwards unless dropped."""

    def __init__(self, file) -> None:
        self.file, self.shown = file, True

    def drop(self) -> None:
        self.shown = False


@contextlib.contextmanager
def _stderr_held() -> Iterator[_Held]:
    """Hold what is written to file descriptor 2 (Ray's C++ retries log a line a second
    there) in a temporary file for the block; it reaches standard error afterwards, unless
    the block dropped it (a failed connection, said in one line instead)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (a test's capture): as is
        yield _Held(None)
        return
    with tempfile.TemporaryFile() as file:
        held = _Held(file)
        sys.stderr.flush()
        saved = os.dup(fd)
        os.dup2(file.fileno(), fd)
        try:
            yield held
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            if held.shown:
                file.seek(0)
                sys.stderr.write(file.read().decode("utf-8", "replace"))
                sys.stderr.flush()


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
