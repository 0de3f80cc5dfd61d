"""Does ``attnbench compare`` cry wolf, and does the speed gate still catch a slowdown?

    python scripts/compare_aa.py aa --pairs 10 --load quiet --out results/compare-aa
    python scripts/compare_aa.py aa --pairs 10 --load loaded --out results/compare-aa
    python scripts/compare_aa.py inject --trials 10 --factor 1.3 --out results/compare-aa
    python scripts/compare_aa.py table --out results/compare-aa

``aa``: the issue's complaint, as a user meets it. Each pair runs the default suite twice back to
back, each run in its own process through the installed executable (``attnbench run speed --out
OUT/aa-LOAD/pair-K/a``, then ``.../b``; ``--no-plot``: the figures are drawn after a run's
measurements, are not compared, and would only make the study's folders large), then
``attnbench compare b/results.csv a/results.csv --format json --markdown compare.md``. The code
is the same, so every regression it reports is false. ``--load loaded`` keeps a neighbour busy
from before run A until after run B: one process per usable core but one (one on a 2-core
machine), each a loop of float32 512^3 matmuls on one torch thread, i.e. another numerical job
on the machine (a pure Python loop would leave the memory system alone). The default suite runs
one thread per core, so one of its threads shares a core with the neighbour all along.

``inject``: the same code with the forward of one path (``--path NAME:PATH``, repeatable) made
``--factor`` times slower, inside the slowed runs' processes only (``scripts/regression_demo.py``'s
``inject``: a wrapper that busy-waits; the CI grid's clock is CPU time), judged as ``attnbench
gate`` judges a baseline it measures (``.ci/run`` on a machine class with no saved baseline):
the CI grid run base, current, base, current (current = slowed), each in its own process with
the gate's command line, and the gate's own decision (:func:`attnbench.bench.gate._both_pairs`:
each pair compared with the other current run as the confirming re-run; a regression must show
in both). Caught: a case of the slowed path is a regression; a false alarm: any other case is.

``table``: ``OUT/aa.csv``, ``OUT/inject.csv`` and ``OUT/summary.md`` (with the machine), printed.

Every run keeps its folder (results, samples, sidecar, log) and every pair or trial its
comparison, so the study can be audited. The study is resumable: a pair or trial whose record
(``pair.json`` / ``trial.json``, written last) exists is skipped; one that was interrupted is
run again whole, so that its runs stay back to back. ``--extra "ARGS"`` is passed on to every
``run speed`` (a smaller grid for a smoke test, e.g. ``--extra="--impl gqa:efficient --lengths
256"``) and recorded. Run the study on an otherwise idle machine; ``python
scripts/scrub_paths.py OUT`` before committing it.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from attnbench import registry
from attnbench.bench import gate
from attnbench.bench.compare import compare
from attnbench.bench.provenance import write_json
from attnbench.core.errors import AttnbenchError
from attnbench.measure import machine

ROOT = Path(__file__).resolve().parent.parent

#: The slowed path when none is given: in the CI grid, and mid-speed in it (regression_demo's).
DEFAULT_PATH = "gqa:efficient"
LOADS = ("quiet", "loaded")
#: The runs of an injection trial, in the order the gate's measured mode makes them.
GATE_ORDER = ("base1", "current1", "base2", "current2")
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

AA_COLUMNS = (
    "load", "pair", "started_utc", "exit_code", "compared", "worse", "suspect", "unconfirmed",
    "not_judged", "better", "noise_sigma", "worse_cases", "headline", "loadavg_before_1min",
    "loadavg_after_1min", "loadavg_after_5min", "wall_s", "run_a_wall_s", "run_b_wall_s",
    "neighbours", "neighbour_cpu_s", "extra", "cpu_signature",
)  # fmt: skip
INJECT_COLUMNS = (
    "path", "factor", "trial", "started_utc", "gate_exit", "verdict", "caught", "slowed_cases",
    "slowed_worse", "false_alarms", "false_alarm_cases", "slowed_change_min",
    "slowed_change_max", "loadavg_before_1min", "loadavg_after_1min", "wall_s", "extra",
    "cpu_signature",
)  # fmt: skip


# --- runs --------------------------------------------------------------------------------------


def attnbench_executable() -> str:
    """The ``attnbench`` a user of this environment types: beside this interpreter, else on PATH."""
    beside = Path(sys.executable).with_name("attnbench")
    found = str(beside) if beside.is_file() else shutil.which("attnbench")
    if not found:
        raise SystemExit("no attnbench executable here: pip install -e . first")
    return found


def finished(out: Path) -> bool:
    """Whether ``out`` holds a speed run that ended (its sidecar says when)."""
    side = out / "results.json"
    if not (side.is_file() and (out / "results.csv").is_file()):
        return False
    return bool(json.loads(side.read_text()).get("finished"))


def run_logged(cmd: Sequence[str], cwd: Path, log: Path, env: dict[str, str] | None = None):
    """Run ``cmd`` in ``cwd``, its output kept in ``log`` (the study's audit trail)."""
    done = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True)
    log.write_text(done.stdout + done.stderr)
    return done


def check_run(done: subprocess.CompletedProcess, out: Path) -> None:
    if done.returncode != 0 or not finished(out):
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        tail = lines[-1] if lines else "no output"
        raise SystemExit(f"the run into {out} failed (exit {done.returncode}): {tail}")


def default_run(exe: str, pair_dir: Path, name: str, extra: Sequence[str]) -> None:
    """``attnbench run speed`` (the default suite) into ``pair_dir/name``, as a user types it."""
    cmd = [exe, "run", "speed", "--out", name, "--overwrite", "--no-plot", *extra]
    check_run(run_logged(cmd, pair_dir, pair_dir / f"{name}.log"), pair_dir / name)


def launcher(argv: Sequence[str], slow: tuple[str, float] | None) -> str:
    """Python code that runs the attnbench command ``argv``, with NAME:PATH made FACTOR times
    slower first when ``slow`` is given (in that process only)."""
    lines = ["import sys"]
    if slow is not None:
        lines += ["from scripts.regression_demo import inject", f"inject({slow[0]!r}, {slow[1]!r})"]
    lines += ["from attnbench.cli import main", f"sys.argv = {list(argv)!r}", "main()"]
    return "\n".join(lines) + "\n"


def ci_run(trial_dir: Path, label: str, extra: Sequence[str], slow: tuple[str, float] | None):
    """The CI grid into ``trial_dir/label`` with the gate's command line (slowed when ``slow``)."""
    argv = ["attnbench", "run", "speed", "--suite", str(ROOT / gate.CI_SUITE), "--out", label,
            "--overwrite", "--no-plot", *extra]  # fmt: skip
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}  # scripts.regression_demo
    cmd = [sys.executable, "-c", launcher(argv, slow)]
    check_run(run_logged(cmd, trial_dir, trial_dir / f"{label}.log", env), trial_dir / label)


def sidecar(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())


# --- the neighbour of --load loaded -------------------------------------------------------------


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
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit(f"the neighbour process {proc.pid} did not start")

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
            proc.stdout.close()


# --- aa ------------------------------------------------------------------------------------------


def now_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def load_1_5(which: int) -> float | None:
    """The 1-minute (0) or 5-minute (1) load average, rounded (None where the OS has none)."""
    avg = machine.load_average()
    return round(avg[which], 2) if avg is not None else None


def compare_pair(exe: str, pair_dir: Path) -> tuple[int, dict[str, Any]]:
    """``attnbench compare b a`` through the executable: its exit code and its JSON (kept in
    compare.json, the markdown in compare.md, the messages in compare.log; a pair run again
    replaces its own)."""
    cmd = [exe, "compare", "b/results.csv", "a/results.csv", "--format", "json",
           "--markdown", "compare.md", "--overwrite"]  # fmt: skip
    done = subprocess.run(cmd, cwd=pair_dir, capture_output=True, text=True)
    (pair_dir / "compare.log").write_text(done.stderr)
    if done.returncode not in (0, 1, 3):
        raise SystemExit(f"attnbench compare in {pair_dir} failed (exit {done.returncode})")
    (pair_dir / "compare.json").write_text(done.stdout)
    return done.returncode, json.loads(done.stdout)


def aa_pair(exe: str, pair_dir: Path, load: str, extra: Sequence[str]) -> dict[str, Any]:
    """Runs A and B back to back (with the neighbours when loaded), then compare B with A."""
    pair_dir.mkdir(parents=True, exist_ok=True)
    started, t0 = now_utc(), time.monotonic()
    count = neighbour_count(load)
    with neighbours(count) as neighbour_cpu:
        before = load_1_5(0)
        for name in ("a", "b"):
            default_run(exe, pair_dir, name, extra)
        after, after_5, busy = load_1_5(0), load_1_5(1), neighbour_cpu()
    wall = time.monotonic() - t0
    code, cmp = compare_pair(exe, pair_dir)
    worse = sorted({ln["case"] for ln in cmp["lines"] if ln["verdict"] == "worse"})
    return {
        "load": load,
        "pair": int(pair_dir.name.split("-")[1]),
        "started_utc": started,
        "exit_code": code,
        "compared": cmp["compared"],
        **{
            v.replace(" ", "_"): cmp["counts"][v]
            for v in ("worse", "suspect", "unconfirmed", "not judged", "better")
        },  # fmt: skip
        "noise_sigma": round(cmp["limits"]["noise"]["sigma"], 4),
        "worse_cases": worse,
        "headline": cmp["headline"],
        "loadavg_before_1min": before,
        "loadavg_after_1min": after,
        "loadavg_after_5min": after_5,
        "wall_s": round(wall, 1),
        "run_a_wall_s": sidecar(pair_dir / "a").get("wall_s"),
        "run_b_wall_s": sidecar(pair_dir / "b").get("wall_s"),
        "neighbours": neighbour_text(count),
        "neighbour_cpu_s": busy,
        "extra": shlex.join(extra),
        "cpu_signature": sidecar(pair_dir / "a")["machine"]["cpu_signature"],
    }


def aa(args: argparse.Namespace) -> None:
    exe = attnbench_executable()
    record_machine(args.out)
    for k in range(1, args.pairs + 1):
        pair_dir = args.out / f"aa-{args.load}" / f"pair-{k:02d}"
        if (pair_dir / "pair.json").is_file():
            continue  # resume: a finished pair is kept
        print(f"aa {args.load}: pair {k}/{args.pairs}", file=sys.stderr, flush=True)
        record = aa_pair(exe, pair_dir, args.load, args.extra)
        write_json(pair_dir / "pair.json", record)  # last: the pair's "done" mark
        print(f"  exit {record['exit_code']}, {record['headline']}; load "
              f"{record['loadavg_before_1min']} -> {record['loadavg_after_1min']}; "
              f"{record['wall_s']:.0f} s", file=sys.stderr, flush=True)  # fmt: skip


# --- inject --------------------------------------------------------------------------------------


def checked_path(text: str) -> str:
    """``NAME:PATH`` of a registered path, spelled as results name it (an alias resolved)."""
    try:
        mech, path = registry.resolve(text)
    except AttnbenchError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if path is None:
        raise argparse.ArgumentTypeError(f"{text}: give NAME:PATH (one path to slow down)")
    return f"{mech.name}:{path.name}"


def impl_of(case: str) -> str:
    """``gqa:efficient`` of a compared case's label (``gqa:efficient [kv_heads=2] fwd ...``)."""
    return case.split()[0]


def cases_of(results: Path, impl: str) -> int:
    """The measured (``ok``) rows of ``impl`` in a results CSV."""
    with results.open(newline="") as f:
        rows = csv.DictReader(f)
        return sum(
            1 for r in rows if f"{r['mechanism']}:{r['path']}" == impl and r["status"] == "ok"
        )


def inject_trial(trial_dir: Path, impl: str, factor: float, extra: Sequence[str]) -> dict:
    """base, slowed, base, slowed; judged by the gate's measured-baseline decision."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    started, t0, before = now_utc(), time.monotonic(), load_1_5(0)
    csvs: dict[str, Path] = {}
    for label in GATE_ORDER:
        ci_run(trial_dir, label, extra, (impl, factor) if label.startswith("current") else None)
        csvs[label] = trial_dir / label / "results.csv"
        if label == "base1" and not cases_of(csvs[label], impl):
            raise SystemExit(f"--path {impl}: no measured case of it in the grid")
    after, wall = load_1_5(0), time.monotonic() - t0
    said: list[str] = []
    used = f"measured: the same code, {impl} forward x{factor:g} in the current runs"
    with contextlib.chdir(trial_dir):  # its compare.md and report name the runs relatively
        relative = {label: Path(label) / "results.csv" for label in GATE_ORDER}
        verdict = gate._both_pairs(relative, Path("."), used, said.append)  # the gate's decision
    (trial_dir / "gate.txt").write_text("\n".join([*said, verdict.text]) + "\n")
    first = compare(csvs["current1"], csvs["base1"])
    changes = [ln.ratio for ln in first.lines
               if ln.impl == impl and ln.metric.startswith("time") and ln.ratio]  # fmt: skip
    slowed = sorted(c for c in verdict.worse if impl_of(c) == impl)
    others = sorted(c for c in verdict.worse if impl_of(c) != impl)
    return {
        "path": impl,
        "factor": factor,
        "trial": int(trial_dir.name.split("-")[1]),
        "started_utc": started,
        "gate_exit": verdict.code,
        "verdict": verdict.text,
        "caught": bool(slowed),
        "slowed_cases": cases_of(csvs["base1"], impl),
        "slowed_worse": len(slowed),
        "false_alarms": len(others),
        "false_alarm_cases": others,
        "slowed_change_min": round(min(changes), 3) if changes else None,
        "slowed_change_max": round(max(changes), 3) if changes else None,
        "loadavg_before_1min": before,
        "loadavg_after_1min": after,
        "wall_s": round(wall, 1),
        "extra": shlex.join(extra),
        "cpu_signature": sidecar(trial_dir / "base1")["machine"]["cpu_signature"],
    }


def inject_dir(out: Path, impl: str, factor: float) -> Path:
    return out / "inject" / f"{impl.replace(':', '-')}-x{factor:g}"


def inject(args: argparse.Namespace) -> None:
    record_machine(args.out)
    for impl in args.path or [DEFAULT_PATH]:
        for k in range(1, args.trials + 1):
            trial_dir = inject_dir(args.out, impl, args.factor) / f"trial-{k:02d}"
            if (trial_dir / "trial.json").is_file():
                continue  # resume: a finished trial is kept
            print(f"inject {impl} x{args.factor:g}: trial {k}/{args.trials}", file=sys.stderr,
                  flush=True)  # fmt: skip
            record = inject_trial(trial_dir, impl, args.factor, args.extra)
            write_json(trial_dir / "trial.json", record)  # last: the trial's "done" mark
            print(f"  {'caught' if record['caught'] else 'MISSED'}, {record['false_alarms']} "
                  f"false alarms; {record['verdict']}", file=sys.stderr, flush=True)  # fmt: skip


# --- table ---------------------------------------------------------------------------------------


def record_machine(out: Path) -> None:
    """OUT/machine.json: the machine as the speed sidecar records it, the gate's class for it and
    whether a baseline is saved for that class (then ``.ci/run`` compares with it first). Kept
    from the first command; a later command on another CPU says so."""
    info = machine.machine(torch.device("cpu"))
    slug = gate.machine_slug()
    info |= {
        "torch": torch.__version__,
        "gate_class": slug,
        "saved_baseline": (ROOT / "results" / "baselines" / slug / "ci.csv").is_file(),
    }
    path = out / "machine.json"
    if path.is_file():
        kept = json.loads(path.read_text())
        if kept.get("cpu_signature") != info["cpu_signature"]:
            print(f"warning: {path} is of another CPU ({kept.get('cpu_signature')}); this one is "
                  f"{info['cpu_signature']}", file=sys.stderr)  # fmt: skip
        return
    out.mkdir(parents=True, exist_ok=True)
    write_json(path, info)


def records(pattern: str, out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(pattern))]


def write_csv(path: Path, columns: Sequence[str], rows: list[dict[str, Any]]) -> None:
    """One row per record; a list becomes ``a; b``."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "; ".join(v) if isinstance(v, list) else v for k, v in row.items()})


def span(values: list[Any]) -> str:
    """``1.2..3.4`` over the values given (``-`` when none)."""
    known = [v for v in values if v is not None]
    return f"{min(known):g}..{max(known):g}" if known else "-"


def goal(met: bool, n: int, needed: int = 10) -> str:
    """Whether the issue's goal is met, over at least ``needed`` pairs or trials."""
    return f"only {n} of {needed}" if n < needed else ("met" if met else "MISSED")


def aa_table(rows: list[dict[str, Any]]) -> list[str]:
    """Per load: pairs, their exit codes and what compare reported (goal: no regression)."""
    out = [
        "| load | pairs | exit 0 | exit 1 | false regressions | suspect | unconfirmed | "
        "not judged | cases compared | load avg before | load avg after | run wall s (median) | "
        "neighbours | goal (0 false regressions in 10) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|",
    ]
    for load in LOADS:
        of = [r for r in rows if r["load"] == load]
        if not of:
            continue
        worse = sum(r["worse"] for r in of)
        walls = [w for r in of for w in (r["run_a_wall_s"], r["run_b_wall_s"]) if w is not None]
        out.append(
            f"| {load} | {len(of)} | {sum(r['exit_code'] == 0 for r in of)} | "
            f"{sum(r['exit_code'] == 1 for r in of)} | {worse} | "
            f"{sum(r['suspect'] for r in of)} | {sum(r['unconfirmed'] for r in of)} | "
            f"{sum(r['not_judged'] for r in of)} | {span([r['compared'] for r in of])} | "
            f"{span([r['loadavg_before_1min'] for r in of])} | "
            f"{span([r['loadavg_after_1min'] for r in of])} | "
            f"{statistics.median(walls) if walls else '-'} | {of[0]['neighbours']} | "
            f"{goal(worse == 0, len(of))} |"
        )
    return out


def inject_table(rows: list[dict[str, Any]]) -> list[str]:
    """Per slowed path and factor: how often the gate caught it, and what else it flagged."""
    out = [
        "| path | factor | trials | caught | catch rate | trials with a false alarm | "
        "false alarm cases | slowed cases read (pair 1) | goal (caught >= 9 of 10) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for key in sorted({(r["path"], r["factor"]) for r in rows}):
        of = [r for r in rows if (r["path"], r["factor"]) == key]
        caught = sum(r["caught"] for r in of)
        needed = 9 * len(of) / 10
        out.append(
            f"| {key[0]} | {key[1]:g} | {len(of)} | {caught} | {caught / len(of):.0%} | "
            f"{sum(r['false_alarms'] > 0 for r in of)} | {sum(r['false_alarms'] for r in of)} | "
            f"x{span([r['slowed_change_min'] for r in of] + [r['slowed_change_max'] for r in of])}"
            f" | {goal(caught >= needed, len(of))} |"
        )
    return out


def machine_lines(out: Path, rows: list[dict[str, Any]]) -> list[str]:
    path = out / "machine.json"
    if not path.is_file():
        return ["- machine: not recorded"]
    m = json.loads(path.read_text())
    memory = f"{m['memory_bytes'] / 2**30:.0f} GiB" if m.get("memory_bytes") else "?"
    mode = (
        "a baseline is saved for this class: `.ci/run` compares with it first (threshold rule, "
        "re-run to confirm), then with one measured from HEAD~1 as here"
        if m["saved_baseline"]
        else "no baseline saved for this class: `.ci/run` measures one, as the injection trials do"
    )
    lines = [
        f"- CPU: {m['cpu_model']}; signature `{m['cpu_signature']}`; {m['logical_cores']} logical "
        f"cores; {memory}; {m['platform']}; torch {m['torch']}",
        f"- gate class `{m['gate_class']}`: {mode}",
    ]
    seen = sorted({r["cpu_signature"] for r in rows})
    if len(seen) > 1:
        lines.append(f"- warning: the runs were made on {len(seen)} CPUs: {'; '.join(seen)}")
    return lines


def summary(out: Path, aa_rows: list[dict], inject_rows: list[dict]) -> str:
    extras = sorted({r["extra"] for r in aa_rows + inject_rows if r["extra"]})
    lines = [
        "# Does `attnbench compare` cry wolf? A/A pairs and an injected slowdown",
        "",
        "Made by `scripts/compare_aa.py` (its docstring says how); every run's folder, log and "
        "comparison are under `aa-LOAD/pair-K/` and `inject/PATH-xFACTOR/trial-K/`; one row per "
        "pair in `aa.csv`, per trial in `inject.csv`.",
        "",
        *machine_lines(out, aa_rows + inject_rows),
        *(f"- grid restricted by `--extra {e}`: NOT the study's grid" for e in extras),
        "",
        "## A/A: the default suite twice back to back, then `attnbench compare B A`",
        "",
        *(aa_table(aa_rows) if aa_rows else ["(no pairs yet)"]),
        "",
        "## An injected slowdown: the CI grid, judged as `attnbench gate` judges a measured "
        "baseline",
        "",
        *(inject_table(inject_rows) if inject_rows else ["(no trials yet)"]),
    ]
    return "\n".join(lines) + "\n"


def table(args: argparse.Namespace) -> None:
    aa_rows = records("aa-*/pair-*/pair.json", args.out)
    inject_rows = records("inject/*/trial-*/trial.json", args.out)
    write_csv(args.out / "aa.csv", AA_COLUMNS, aa_rows)
    write_csv(args.out / "inject.csv", INJECT_COLUMNS, inject_rows)
    text = summary(args.out, aa_rows, inject_rows)
    (args.out / "summary.md").write_text(text)
    print(text, end="")


# --- command line --------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    extra = {
        "type": shlex.split,
        "default": [],
        "help": 'arguments for every "attnbench run speed" (--extra="--lengths 256")',
    }
    one = sub.add_parser("aa", help="A/A pairs of the default suite, compared")
    one.add_argument("--pairs", type=int, default=10)
    one.add_argument("--load", choices=LOADS, default="quiet")
    one.add_argument("--extra", **extra)
    slow = sub.add_parser("inject", help="a slowed path, judged as the CI gate judges")
    slow.add_argument("--trials", type=int, default=10)
    slow.add_argument("--factor", type=float, default=1.3)
    slow.add_argument(
        "--path",
        type=checked_path,
        action="append",
        help=f"NAME:PATH to slow down (repeatable; default {DEFAULT_PATH})",
    )
    slow.add_argument("--extra", **extra)
    sub.add_parser("table", help="aa.csv, inject.csv and summary.md")
    for p in sub.choices.values():
        p.add_argument("--out", type=Path, default=Path("runs/compare-aa"))
    return ap


def main(argv: Sequence[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    if min(getattr(args, "pairs", 1), getattr(args, "trials", 1)) < 1:
        ap.error("--pairs / --trials: at least 1")
    if getattr(args, "factor", 2.0) <= 1:
        ap.error(f"--factor {args.factor}: a slowdown is a factor > 1 (e.g. 1.3)")
    args.out = args.out.resolve()
    {"aa": aa, "inject": inject, "table": table}[args.command](args)


if __name__ == "__main__":
    main()
