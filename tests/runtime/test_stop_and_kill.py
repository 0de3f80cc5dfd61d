"""Runs stopped from outside, through the real executable: ``kill -9`` leaves no worker process
behind (and the next run removes what the killed one left half-done); SIGTERM sent to the driver
alone stops its worker processes as Ctrl-C does (work kept, the same message, exit 130), under
the local executor and under Ray; an unreachable ``--ray-address`` is one line within a time
limit."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from attnbench.core.errors import AttnbenchError
from attnbench.runtime import engines
from attnbench.runtime.outputs import private_name, remove_stale
from attnbench.runtime.processes import WorkerProcess
from tests.helpers.extrapolation import make_corpus
from tests.helpers.processes import ENV, start, wait_for

#: One unit of two lengths, timed quickly.
ONE_UNIT = ["--impl", "softmax", "--no-causal", "--direction", "fwd", "--lengths", "16,32",
            "--rounds", "2", "--device", "cpu", "--threads", "1", "--no-plot"]  # fmt: skip


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie nobody reaps counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


# --------------------------------------------------------------------------------------------
# Worker processes and their driver
# --------------------------------------------------------------------------------------------

DRIVER = """
import time
from attnbench.runtime.processes import WorkerProcess

if __name__ == "__main__":
    worker = WorkerProcess(time.sleep)
    worker.send(60)
    print(worker.proc.pid, flush=True)
    time.sleep(120)
"""


def test_a_worker_dies_with_its_killed_driver(tmp_path):
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, text=True
    )
    worker = int(driver.stdout.readline())
    driver.kill()
    driver.wait()
    wait_for(lambda: gone(worker), "end of the orphaned worker", timeout=5)


def test_a_worker_whose_driver_is_gone_ends_quietly(capfd):
    worker = WorkerProcess(time.sleep)
    worker.send(0.5)
    worker.conn.close()  # as a dead driver's end of the pipe: the reply cannot be sent
    worker.proc.join(30)
    assert worker.proc.exitcode == 0
    assert "Traceback" not in capfd.readouterr().err


def test_remove_stale_takes_only_what_dead_processes_of_this_host_left(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname().replace(".", "_")  # private_name's form of it
    left = {
        "dead_dir": f".unit-a.{host}.{dead.pid}.0123abcd.tmp",
        "dead_file": f".results.csv.{host}.{dead.pid}.89abcdef.tmp",
        "alive": f".unit-b.{host}.{os.getppid()}.0123abcd.tmp",
        "mine": private_name("unit-c"),
        "other_host": f".unit-d.{host}x.{dead.pid}.0123abcd.tmp",
        "longer_host": f".unit-e.n1_{host}.{dead.pid}.0123abcd.tmp",  # n1.HOST is another host
        "unit": "cpu-float32-d32-bidir-softmax",
    }
    for key, name in left.items():
        if key.endswith("file"):
            (tmp_path / name).write_text("half")
        else:
            (tmp_path / name).mkdir()
            (tmp_path / name / "results.csv").write_text("half")
    removed = remove_stale(tmp_path)
    assert sorted(p.name for p in removed) == sorted([left["dead_dir"], left["dead_file"]])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        v for k, v in left.items() if not k.startswith("dead")
    )
    assert remove_stale(tmp_path / "no-such-folder") == []


def test_kill_9_of_a_unit_wise_run_leaves_no_worker_and_the_next_run_cleans_up(tmp_path):
    out, err = tmp_path / "run", tmp_path / "err.txt"
    args = ["run", "speed", "--executor", "local", *ONE_UNIT, "--out", str(out)]
    driver = start(args, tmp_path, err)
    units = out / "units"
    staging = wait_for(
        lambda: [p for p in units.glob(".*.tmp")] if units.is_dir() else [], "staging folder"
    )[0]
    driver.kill()
    driver.wait()
    worker = int(staging.name.rsplit(".", 3)[1])  # .NAME.HOST.PID.RANDOM.tmp
    wait_for(lambda: gone(worker), "end of the orphaned worker", timeout=5)
    time.sleep(1)
    assert "Traceback" not in err.read_text() and "BrokenPipe" not in err.read_text()
    assert staging.exists()  # killed halfway: nothing published
    again = subprocess.run([sys.executable, "-m", "attnbench", *args, "--resume"], cwd=tmp_path,
                           env=ENV, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"removed 1 unfinished unit folder of a killed run: {staging.name}" in again.stderr
    assert sorted(p.name for p in units.iterdir()) == ["cpu-float32-d32-bidir-softmax"]


def test_sigterm_to_the_driver_alone_stops_parallel_trainings_like_ctrl_c(tmp_path):
    """Two trainings in worker processes; SIGTERM to the driver only (what ``timeout`` and a
    scheduler send): both checkpoint and stop at once, the Ctrl-C message, exit 130."""
    corpus = make_corpus(tmp_path / "c.txt")
    out, err = tmp_path / "x", tmp_path / "err.txt"
    args = ["run", "extrapolate", "--corpus", str(corpus), "--d-model", "32", "--layers", "1",
            "--heads", "2", "--train-len", "16", "--batch", "8", "--steps", "1000000",
            "--warmup", "2", "--eval-lengths", "16,32", "--eval-tokens", "384", "--threads", "2",
            "--ckpt-every", "5", "--variants", "O,E", "--eval-time", "none",
            "--out", str(out)]  # fmt: skip
    driver = start(args, tmp_path, err)
    ckpts = [out / "checkpoints" / name for name in ("O-seed0.pt", "E-seed0.pt")]
    wait_for(lambda: all(p.exists() for p in ckpts), "checkpoints of both trainings")
    started = time.monotonic()
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=60) == 130, err.read_text()
    assert time.monotonic() - started < 30  # not the minute each worker was given to end
    said = err.read_text()
    assert "Traceback" not in said
    assert said.rstrip().splitlines()[-1].startswith("interrupted at step "), said
    assert said.rstrip().endswith("continue with --resume"), said
    assert "2 at once" in said


# --------------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------------


def test_sigterm_under_ray_stops_like_ctrl_c(tmp_path):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    out, err = tmp_path / "run", tmp_path / "err.txt"
    # a unit long enough (lengths to 2048, 30 rounds) that it cannot end before the signal lands:
    # with ONE_UNIT a quiet machine finished it first and exited 0 (a clean-clone CI run)
    unit = ["--impl", "softmax", "--no-causal", "--direction", "fwd", "--lengths",
            "16,32,64,128,256,512,1024,2048", "--rounds", "30", "--device", "cpu", "--threads",
            "1", "--no-plot"]  # fmt: skip
    driver = start(["run", "speed", "--executor", "ray", *unit, "--out", str(out)],
                   tmp_path, err)  # fmt: skip
    wait_for(lambda: "ray: a local Ray instance started" in err.read_text(), "Ray's start")
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=120) == 130, err.read_text()
    said = err.read_text()
    assert "SIGTERM received" not in said and "Traceback" not in said, said
    assert "interrupted: finished units are kept" in said


@pytest.mark.parametrize("command", ["speed", "extrapolate"])
def test_an_unreachable_ray_address_is_one_line_before_any_work(tmp_path, command):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    extra = ONE_UNIT if command == "speed" else ["--steps", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "attnbench", "run", command, "--executor", "ray", "--ray-address",
         address, *extra, "--out", str(tmp_path / "out")],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: --ray-address {address}: cannot join a Ray cluster")
    assert "Connection refused" in lines[0] and "30 s" in lines[0]
    assert not (tmp_path / "out").exists()


def test_joining_a_port_that_answers_but_is_no_ray_head_has_a_time_limit():
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    server = socket.create_server(("0.0.0.0", 0))  # accepts, never answers
    held = []
    threading.Thread(target=lambda: held.extend(server.accept() for _ in range(64)),
                     daemon=True).start()  # fmt: skip
    address = f"127.0.0.1:{server.getsockname()[1]}"
    started = time.monotonic()
    try:
        with pytest.raises(AttnbenchError, match=rf"--ray-address {address}: cannot join"):
            engines.join_ray(ray, address, timeout_s=4)
    finally:
        server.close()
    assert time.monotonic() - started < 15
    assert not ray.is_initialized()


def test_a_worker_stopped_before_training_does_not_cut_the_others_saves(tmp_path):
    """One worker's own Ctrl-C (before its training began) stops the run as Ctrl-C does: the
    other workers are asked to stop and their checkpoints are written, not killed half-way."""
    from attnbench.extrapolation.experiment.units import train_in_processes
    from attnbench.extrapolation.training.loop import Interrupted
    from tests.helpers.stopping_jobs import Job, Variant, ctrl_c_or_save

    jobs = [Job(Variant("O"), seed, tmp_path / f"O-seed{seed}.pt") for seed in (0, 1)]
    lines: list[str] = []
    with pytest.raises(Interrupted) as stopped:
        train_in_processes(jobs, 2, ctrl_c_or_save, (), lines.append)
    assert stopped.value.path == jobs[1].saved and jobs[1].saved.read_text() == "checkpoint"
    assert any("O seed 0: stopped before its first checkpoint" in line for line in lines)
