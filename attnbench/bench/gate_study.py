"""Repeated gates: does the gate cry wolf, and does it catch a slowdown? (``attnbench gate --base
REV --trials K``)

Each trial is one measured-mode gate (:func:`attnbench.bench.gate.gate_measured`: the base
revision and the current code run alternately, each run in its own process, and a regression
must show in every pair), kept whole in ``OUT/trial-K/`` (every run's folder and log, the
comparisons, the gate's report ``gate.txt``) with its record ``trial.json``, written last. With
``--base HEAD`` and a clean working tree both sides run the same code: an **A/A** trial, where
anything worse is a false alarm. With ``--slow NAME:PATH`` the current runs' forward of that path
is made ``--factor`` times slower in their processes only (:mod:`attnbench.bench.slowdown`): the
**sensitivity check**, caught when the gate flags a case of that path. ``--load loaded`` keeps
neighbours busy for the whole trial: one process per usable core but one (one on a 2-core
machine), each a loop of float32 512^3 matmuls on one torch thread, i.e. another numerical job on
the machine (a pure Python loop would leave the memory system alone).

Besides the gate's verdict, each trial records every pair compared alone (``attnbench compare
CURRENT_K BASE_K``, no re-run to confirm): what a user comparing two runs would have been told.
The study is resumable: a trial whose record exists is skipped; one that was interrupted is run
again whole, so that its runs stay back to back. The report (``trials.csv``, ``summary.md``,
:mod:`attnbench.bench.gate_report`) is drawn from the records after every command.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnbench.bench import gate, gate_report
from attnbench.bench.compare import Comparison, compare
from attnbench.bench.provenance import write_json
from attnbench.bench.thresholds import EXIT_OK, EXIT_REGRESSION
from attnbench.core.errors import AttnbenchError
from attnbench.measure import machine

LOADS = ("quiet", "loaded")
TRIAL_RECORD = "trial.json"
#: The neighbour of ``--load loaded``: prints once set up, then multiplies until stopped.
NEIGHBOUR_SIZE = 512
NEIGHBOUR = f"""\
import torch
torch.set_num_threads(1)
a = torch.randn({NEIGHBOUR_SIZE}, {NEIGHBOUR_SIZE})
b = torch.randn({NEIGHBOUR_SIZE}, {NEIGHBOUR_SIZE})
print("ready", flush=True)
while True:
    a @ b
"""


@dataclass(frozen=True)
class Study:
    """``trials`` gates of revision ``base`` against the current code, beside ``load``;
    ``command``: the command line that asked for it (recorded)."""

    base: str
    trials: int
    load: str = "quiet"
    command: str = ""


# --- the neighbours of --load loaded -------------------------------------------------------------


def neighbour_count(load: str) -> int:
    """One per usable core but one (at least one) when loaded; none when quiet."""
    return max(1, machine.usable_cores() - 1) if load == "loaded" else 0


def neighbour_text(count: int) -> str:
    if not count:
        return "none"
    return f"{count} x float32 {NEIGHBOUR_SIZE}^3 matmul loop, 1 torch thread each"


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used, from /proc (None off Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def neighbours(count: int) -> Iterator[Callable[[], float | None]]:
    """``count`` neighbour processes, busy from entry (each has set up and begun) to exit. Yields
    a function giving the CPU seconds they have used so far."""
    procs = [
        subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdout=subprocess.PIPE, text=True)
        for _ in range(count)
    ]
    try:
        for proc in procs:
            if proc.stdout is None or proc.stdout.readline().strip() != "ready":
                raise AttnbenchError(f"--load loaded: neighbour process {proc.pid} did not start")

        def used() -> float | None:
            times = [cpu_seconds(p.pid) for p in procs]
            return None if not procs or None in times else round(sum(times), 1)

        yield used
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


# --- one trial -----------------------------------------------------------------------------------


def now_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def load_1min() -> float | None:
    """The 1-minute load average, rounded (None where the OS has none)."""
    avg = machine.load_average()
    return round(avg[0], 2) if avg is not None else None


def impl_of(case: str) -> str:
    """``gqa:efficient`` of a compared case's label (``gqa:efficient [kv_heads=2] fwd ...``)."""
    return case.split()[0]


def measured_cases(results: Path, impl: str) -> int:
    """The measured (``ok``) rows of ``impl`` in a results CSV."""
    import pandas as pd

    df = pd.read_csv(results)
    return int(((df["mechanism"] + ":" + df["path"] == impl) & (df["status"] == "ok")).sum())


def pair_record(cmp: Comparison) -> dict[str, Any]:
    """What ``attnbench compare`` alone said of one pair."""
    return {
        "exit_code": cmp.exit_code,
        "compared": cmp.compared,
        **{v.replace(" ", "_"): cmp.count(v) for v in gate_report.VERDICTS},
        "noise_sigma": round(cmp.limits.noise.sigma, 4),
        "worse_cases": sorted({ln.case for ln in cmp.lines if ln.verdict == "worse"}),
    }


def slowed_record(grid: gate.Grid, verdict: gate.Verdict, csv: dict[str, Path]) -> dict:
    """The sensitivity check's reading of a trial: was the slowed path caught, what else was
    flagged, how much its cases moved in pair 1."""
    worse = sorted(verdict.worse)
    if grid.slow is None:
        return {"caught": None, "other_worse": worse, "slowed_cases": None,
                "slowed_change_min": None, "slowed_change_max": None}  # fmt: skip
    impl = grid.slow.impl
    first = compare(csv["current1"], csv["base1"])
    changes = [ln.ratio for ln in first.lines
               if ln.impl == impl and ln.metric.startswith("time") and ln.ratio]  # fmt: skip
    return {
        "caught": any(impl_of(c) == impl for c in worse),
        "other_worse": [c for c in worse if impl_of(c) != impl],
        "slowed_cases": measured_cases(csv["base1"], impl),
        "slowed_change_min": round(min(changes), 3) if changes else None,
        "slowed_change_max": round(max(changes), 3) if changes else None,
    }


def run_trial(root: Path, study: Study, grid: gate.Grid, trial_dir: Path, say, warn) -> dict:
    """One measured-mode gate in ``trial_dir`` (beside the neighbours when loaded): its record."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    started, t0, count = now_utc(), time.monotonic(), neighbour_count(study.load)
    with neighbours(count) as neighbour_cpu:
        before = load_1min()
        verdict = gate.gate_measured(root, study.base, trial_dir / "gate", say, warn, grid)
        after, busy = load_1min(), neighbour_cpu()
    (trial_dir / "gate.txt").write_text(f"{verdict.text}\nbaseline {verdict.used}\n")
    runs = {label: trial_dir / f"gate-{label}" for label in gate.run_labels(grid.pairs)}
    csv = {label: run / "results.csv" for label, run in runs.items()}
    if verdict.code not in (EXIT_OK, EXIT_REGRESSION) or not all(p.is_file() for p in csv.values()):
        raise AttnbenchError(f"{trial_dir.name}: the gate did not run both sides: {verdict.text}")
    pairs = [
        pair_record(compare(csv[f"current{k}"], csv[f"base{k}"])) for k in range(1, grid.pairs + 1)
    ]
    sidecars = {k: json.loads((run / "results.json").read_text()) for k, run in runs.items()}
    return {
        "trial": int(trial_dir.name.split("-")[1]),
        "started_utc": started,
        "slow": grid.slow.label if grid.slow else "",
        "load": study.load,
        "gate_exit": verdict.code,
        "verdict": verdict.text,
        **slowed_record(grid, verdict, csv),
        "pairs": pairs,
        "loadavg_before_1min": before,
        "loadavg_after_1min": after,
        "wall_s": round(time.monotonic() - t0, 1),
        "run_wall_s": [sidecars[label].get("wall_s") for label in runs],
        "neighbours": neighbour_text(count),
        "neighbour_cpu_s": busy,
        "cpu_signature": sidecars["base1"].get("machine", {}).get("cpu_signature", ""),
    }


# --- the study -----------------------------------------------------------------------------------


def same_code(root: Path, base: str) -> bool:
    """Whether ``base`` is the checked-out commit and the working tree is clean (an A/A study)."""
    sha = gate.git(root, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}").stdout.strip()
    head = gate.git(root, "rev-parse", "HEAD").stdout.strip()
    dirty = gate.git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    return bool(sha) and sha == head and not dirty


def record_study(out: Path, root: Path, study: Study, grid: gate.Grid) -> None:
    """``OUT/study.json``: the command, the base, the grid, whether both sides run the same code,
    the machine as the speed sidecar records it, the gate's class for it and whether a baseline
    is saved for that class. Kept from the first command; a later one on another CPU warns."""
    info = machine.machine(torch.device("cpu"))
    slug = gate.machine_slug()
    record = {
        "command": study.command,
        "base": study.base,
        "base_sha": gate.git(root, "rev-parse", f"{study.base}^{{commit}}").stdout.strip(),
        "same_code": same_code(root, study.base),
        "suite": grid.suite or str(gate.CI_SUITE),
        "run_args": list(grid.args),
        "pairs": grid.pairs,
        "machine": info | {"torch": torch.__version__},
        "gate_class": slug,
        "saved_baseline": (root / "results" / "baselines" / slug / "ci.csv").is_file(),
    }
    path = out / gate_report.STUDY_RECORD
    if path.is_file():
        kept = json.loads(path.read_text())
        if kept["machine"].get("cpu_signature") != info["cpu_signature"]:
            print(f"warning: {path} is of another CPU ({kept['machine'].get('cpu_signature')}); "
                  f"this one is {info['cpu_signature']}", file=sys.stderr)  # fmt: skip
        return
    out.mkdir(parents=True, exist_ok=True)
    write_json(path, record)


def trial_folder(out: Path, grid: gate.Grid, load: str, k: int, same: bool) -> Path:
    """``OUT/aa-quiet/trial-01`` (``base-quiet`` when the base is other code),
    ``OUT/slow-gqa-efficient-x1.3-loaded/trial-01``, ..."""
    kind = "aa" if same else "base"
    if grid.slow:
        kind = f"slow-{grid.slow.impl.replace(':', '-')}-x{grid.slow.factor:g}"
    return out / f"{kind}-{load}" / f"trial-{k:02d}"


def run_study(root: Path, out: Path, study: Study, grid: gate.Grid, say, warn) -> gate.Outcome:
    """The trials not yet recorded, then the report over every trial in ``out``."""
    record_study(out, root, study, grid)
    same = same_code(root, study.base)
    for k in range(1, study.trials + 1):
        trial_dir = trial_folder(out, grid, study.load, k, same)
        if (trial_dir / TRIAL_RECORD).is_file():
            continue  # resume: a finished trial is kept
        say(f"gate study: {trial_dir.parent.name} trial {k}/{study.trials}")
        record = run_trial(root, study, grid, trial_dir, say, warn)
        write_json(trial_dir / TRIAL_RECORD, record)  # last: the trial's "done" mark
        say(f"gate study: trial {k}: {record['verdict']}")
    line = gate_report.write_report(out)
    return gate.Outcome(EXIT_OK, line)
