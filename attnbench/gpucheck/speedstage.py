"""The speed suites of ``attnbench gpu-check``: each one ``attnbench run speed`` in its own
process, stopped cleanly at the command's deadline, continued by the next run.

A suite's results go to ``OUT/speed/<suite>/``. When that folder holds an unfinished run of the
same suite file, made on the same GPU and CPU model with the same versions and commit
(:func:`same_setup`), the next run continues it (``--resume``: finished rows kept); anything else
starts it over (``--overwrite``), so rows of another machine or other code are never mixed in.
At the deadline the run is sent SIGINT, which ends it with every finished row on disk (exit 130);
a sticky CUDA error ends it with exit 75, and it is continued at once in a fresh process while
time is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``attnbench run speed``'s exits: a sticky CUDA error (continue with --resume), Ctrl-C.
STICKY_EXIT = 75
INTERRUPTED = 130
#: After SIGINT at the deadline, how long a run gets to write its files before SIGKILL.
KILL_AFTER_S = 30.0
#: A continuation after a sticky error is not started with less time than this left.
MIN_LEFT_S = 30.0
#: The keys of a sidecar's machine that must match for rows to be continued.
MACHINE_KEYS = ("gpu", "cpu_model")


def suite_folder(suite: str) -> str:
    """A suite's results folder name: ``gpu/flex`` -> ``gpu-flex``, a file -> its stem."""
    if suite.endswith(".toml"):
        return Path(suite).stem
    return suite.replace("/", "-").replace("\\", "-")


def same_setup(sidecar: Mapping[str, Any], here: Mapping[str, Any]) -> bool:
    """Whether a stopped run's sidecar was written with ``here``'s machine (GPU and CPU model),
    versions, commit and suite file (its sha256): only then are its rows continued."""
    old_machine, new_machine = sidecar.get("machine") or {}, here.get("machine") or {}
    return (
        all(old_machine.get(k) == new_machine.get(k) for k in MACHINE_KEYS)
        and sidecar.get("versions") == here.get("versions")
        and (sidecar.get("git") or {}).get("sha") == (here.get("git") or {}).get("sha")
        and (sidecar.get("suite") or {}).get("sha256") == (here.get("suite") or {}).get("sha256")
    )


def continues(folder: Path, here: Mapping[str, Any]) -> bool:
    """Whether the run in ``folder`` is one to continue (:func:`same_setup`, and rows to keep)."""
    if not (folder / "results.csv").is_file():
        return False
    try:
        sidecar = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return same_setup(sidecar, here)


def speed_command(
    suite: str, folder: Path, resume: bool, python: str = sys.executable
) -> list[str]:
    return [
        python,
        "-m",
        "attnbench",
        "run",
        "speed",
        "--suite",
        suite,
        "--out",
        str(folder),
        "--resume" if resume else "--overwrite",
    ]


@dataclass
class SpeedOutcome:
    suite: str
    folder: Path
    code: int  # the last process's exit: 0 done, 130 stopped at the deadline, else failed
    resumed: bool
    wall_s: float

    @property
    def status(self) -> str:
        if self.code == 0:
            return "done"
        if self.code == INTERRUPTED:
            return "stopped at the deadline (run gpu-check again to continue it)"
        return f"failed (exit {self.code}; see its log)"


Spawn = Callable[[Sequence[str], Path, float, Callable[[str], None]], int]


def run_logged(
    cmd: Sequence[str],
    log: Path,
    deadline: float,
    echo: Callable[[str], None],
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> int:
    """Run ``cmd`` with its output in ``log`` and each line passed to ``echo``; SIGINT at
    ``deadline`` (``time.monotonic``), SIGKILL KILL_AFTER_S later. Returns its exit code."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
        )
        stop = threading.Timer(max(0.0, deadline - time.monotonic()), _send, (proc, signal.SIGINT))
        kill = threading.Timer(
            max(0.0, deadline - time.monotonic()) + KILL_AFTER_S, _send, (proc, signal.SIGKILL)
        )
        stop.start()
        kill.start()
        try:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                echo(line.rstrip("\n"))
            return proc.wait()
        except KeyboardInterrupt:
            _send(proc, signal.SIGINT)
            proc.wait()
            raise
        finally:
            stop.cancel()
            kill.cancel()


def _send(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)


def run_suite(
    suite: str,
    out: Path,
    deadline: float,
    here: Mapping[str, Any],
    spawn: Spawn,
    echo: Callable[[str], None],
) -> SpeedOutcome:
    """One suite into ``out/speed/<suite>/`` (continued when :func:`continues` says so), again
    with ``--resume`` after a sticky CUDA error while MIN_LEFT_S or more is left."""
    folder = out / "speed" / suite_folder(suite)
    log = out / "speed" / f"{suite_folder(suite)}.log"
    resumed = continues(folder, here)
    started = time.monotonic()
    code = spawn(speed_command(suite, folder, resumed), log, deadline, echo)
    while code == STICKY_EXIT and deadline - time.monotonic() >= MIN_LEFT_S:
        echo(f"{suite}: a sticky CUDA error ended the run; continuing it in a fresh process")
        code = spawn(speed_command(suite, folder, True), log, deadline, echo)
    return SpeedOutcome(suite, folder, code, resumed, time.monotonic() - started)


def here_now(suite_sha256: str | None) -> dict[str, Any]:
    """This machine, versions and commit as a sidecar records them, and the suite file's hash."""
    import torch

    from attnbench.measure import machine

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return {
        "machine": machine.machine(device),
        "versions": machine.versions(),
        "git": machine.git_state(),
        "suite": {"sha256": suite_sha256},
    }


def child_environment(caches_env: Mapping[str, str], package_root: Path) -> dict[str, str]:
    """The environment of the processes gpu-check starts: the compile caches, this attnbench
    importable (a checkout run as ``python -m attnbench`` needs no install), output unbuffered,
    and the CUDA allocator's segments growing instead of fragmenting across lengths (a sweep's
    peak-memory rows)."""
    env = dict(os.environ)
    env.update(caches_env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_root), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    return env
