"""Does ``attnbench compare`` cry wolf? A/A comparisons and an injected slowdown, side by side.

    python scripts/compare_aa.py --trials 10 --out runs/compare-aa/quiet
    python scripts/compare_aa.py --trials 10 --out runs/compare-aa/loaded --load

Each trial runs the grid three times in a row, each in its own process: A, B (the same code),
then S, the same code with the forward of one path (``--slow``) made ``--factor`` times slower.
It compares B with A (an A/A comparison: every alarm is false) and S with B (the slowdown must
be caught), so every comparison is between runs made one after the other, never against a run
from much earlier. The slowdown exists only inside S's process: the path's function in the
registry record is wrapped by one that busy-waits (factor - 1) x the time the real call took, on
the suite's clock (CPU time for ``clock = "cpu"``, elapsed time otherwise). ``--load`` runs a
second process for the whole experiment, a Python busy loop that keeps one core busy.

The grid is ``attnbench run speed --suite SUITE`` restricted to the ``--impl`` list (default: 7
mechanisms of 5 families and the reference). Prints one line per trial and the totals, and
writes them to OUT/summary.md and OUT/summary.json. Finished runs are kept: the same command
continues an interrupted experiment.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnbench import registry  # noqa: E402
from attnbench.bench.compare import CORROBORATED_Z, NOISE_Z, Comparison, compare  # noqa: E402
from attnbench.bench.config import load_suite  # noqa: E402

DEFAULT_IMPLS = (
    "flash-tiled:efficient",
    "gqa:efficient",
    "local:efficient",
    "strided:efficient",
    "aft-full:efficient",
    "gau:efficient",
    "linear:chunkwise",
)


def slowed(fn, factor: float, cpu_clock: bool):
    """``fn``, then a busy wait of (factor - 1) x the time ``fn`` took on the suite's clock."""
    now = time.process_time if cpu_clock else time.perf_counter

    @functools.wraps(fn)  # the same signature: a path gets only the parameters it declares
    def slow(*args, **kwargs):
        t0 = now()
        out = fn(*args, **kwargs)
        until = now() + (factor - 1) * (now() - t0)
        while now() < until:  # busy: a slow kernel holds its core
            pass
        return out

    return slow


def inject(impl: str, factor: float, cpu_clock: bool) -> None:
    """Replace NAME:PATH in the registry (this process only) by a slower copy."""
    name, _, path_name = impl.partition(":")
    mech = registry.get(name)
    paths = tuple(
        dataclasses.replace(p, fn=slowed(p.fn, factor, cpu_clock)) if p.name == path_name else p
        for p in mech.paths
    )
    slow = dataclasses.replace(mech, paths=paths)
    registry.MECHANISMS = tuple(slow if m is mech else m for m in registry.MECHANISMS)
    registry._BY_NAME = registry._index()


def run_args(args: argparse.Namespace, out: Path) -> list[str]:
    cmd = ["attnbench", "run", "speed", "--suite", args.suite, "--out", str(out), "--overwrite"]
    for impl in args.impl:
        cmd += ["--impl", impl]
    if args.lengths:
        cmd += ["--lengths", args.lengths]
    if args.direction:
        cmd += ["--direction", args.direction]
    return cmd


def finished(out: Path) -> bool:
    side = out / "results.json"
    return side.is_file() and bool(json.loads(side.read_text()).get("finished"))


def child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_grid(args: argparse.Namespace, out: Path, slow: bool) -> None:
    """One run of the grid in its own process (with the slowdown when ``slow``)."""
    if finished(out):
        return
    argv = run_args(args, out)
    code = "from attnbench.cli import main; import sys; "
    if slow:
        cpu_clock = load_suite(args.suite).timing.clock == "cpu"
        code += (
            f"sys.path.insert(0, {str(ROOT / 'scripts')!r}); from compare_aa import inject; "
            f"inject({args.slow!r}, {args.factor}, {cpu_clock}); "
        )
    code += f"sys.argv = {argv!r}; main()"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0 or not finished(out):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"the run into {out} failed (exit {done.returncode}): {tail}")


def case_of(label: str, impl: str, direction: str | None = None) -> bool:
    """Whether a compared case's label (``gau:efficient [s=128;...] fwd bidir n=256 ...``) is
    of ``impl`` (and ``direction``)."""
    words = label.split()
    shown = next((w for w in words if w in ("fwd", "fwdbwd")), None)
    return words[0] == impl and (direction is None or shown == direction)


def suspects(cmp: Comparison) -> list[str]:
    """Single cases reported as suspect (not failed: a re-run would have to show them again)."""
    return sorted({ln.case for ln in cmp.lines if ln.verdict == "suspect"})


def worse_cases(cmp: Comparison) -> list[str]:
    return sorted({ln.case for ln in cmp.lines if ln.verdict == "worse"})


def time_changes(cmp: Comparison, impl: str | None = None) -> list[float]:
    """The time changes of every case (of ``impl``'s forward cases only, when given)."""
    lines = [ln for ln in cmp.lines if ln.metric.startswith("time") and ln.ratio]
    return [ln.ratio for ln in lines if impl is None or case_of(ln.case, impl, "fwd")]


def judge_trial(args: argparse.Namespace, trial: Path) -> dict:
    """Compare B with A and S with B; what each found."""
    a, b, s = (trial / name / "results.csv" for name in ("a", "b", "slow"))
    aa, slow = compare(b, a), compare(s, b)
    flagged = worse_cases(slow)
    slowed_fwd = [c for c in flagged if case_of(c, args.slow, "fwd")]
    aa_changes, slow_changes = time_changes(aa), time_changes(slow, args.slow)
    return {
        "trial": trial.name,
        "aa_exit": aa.exit_code,
        "aa_alarms": worse_cases(aa),
        "aa_change_min": round(min(aa_changes), 3),
        "aa_change_max": round(max(aa_changes), 3),
        **{f"aa_{k}": v for k, v in noise_of(aa).items()},
        "slow_exit": slow.exit_code,
        "slow_caught": bool(slowed_fwd),
        "slow_flagged_slowed_fwd": len(slowed_fwd),
        "slow_flagged_others": [c for c in flagged if not case_of(c, args.slow)],
        "aa_suspects": suspects(aa),
        "slow_suspects": suspects(slow),
        "slow_fwd_changes": [round(x, 3) for x in slow_changes],
        **{f"slow_{k}": v for k, v in noise_of(slow).items()},
        "cases_compared": aa.compared,
        "notes": aa.notes,
    }


def noise_of(cmp: Comparison) -> dict:
    """The comparison's noise: common change, sigma, and the limits for a case alone and for
    two cases of a path."""
    n = cmp.limits.noise
    return {
        "common": round(n.common, 3),
        "sigma": round(n.sigma, 3),
        "alone": round(n.factor(NOISE_Z), 3),
        "two": round(n.factor(CORROBORATED_Z), 3),
    }


def line_of(r: dict) -> str:
    aa = "no alarm" if not r["aa_alarms"] else f"{len(r['aa_alarms'])} alarms"
    if r["aa_suspects"]:
        aa += f", {len(r['aa_suspects'])} suspect"
    others = f", {len(r['slow_flagged_others'])} others flagged" if r["slow_flagged_others"] else ""
    fwd = ", ".join(f"{x:.2f}" for x in r["slow_fwd_changes"])
    return (
        f"{r['trial']}: A/A {aa} (changes x{r['aa_change_min']:.2f}..x{r['aa_change_max']:.2f}, "
        f"sigma {r['aa_sigma']:.3f}); slowdown {'caught' if r['slow_caught'] else 'MISSED'} "
        f"({r['slow_flagged_slowed_fwd']} of its fwd cases flagged{others}; changes {fwd}; "
        f"sigma {r['slow_sigma']:.3f})"
    )


def totals(results: list[dict], factor: float) -> str:
    n = len(results)
    alarms = sum(1 for r in results if r["aa_alarms"])
    caught = sum(1 for r in results if r["slow_caught"])
    others = sum(1 for r in results if r["slow_flagged_others"])
    return (
        f"A/A: {alarms} of {n} comparisons raised an alarm; slowdown x{factor:g}: caught in "
        f"{caught} of {n} ({others} also flagged another mechanism)"
    )


def start_load() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def load_cpu_s(proc: subprocess.Popen) -> float | None:
    """CPU seconds the busy loop got (from /proc, Linux), read before it is stopped."""
    try:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def write_summary(args, results: list[dict], meta: dict) -> None:
    head = totals(results, args.factor)
    lines = [f"# {args.out.name}", "", f"**{head}**", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", *(f"- {line_of(r)}" for r in results)]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    (args.out / "summary.json").write_text(json.dumps({**meta, "trials": results}, indent=1))
    print("\n".join(line_of(r) for r in results))
    print(head)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("runs/compare-aa"))
    ap.add_argument("--suite", default="ci")
    ap.add_argument("--impl", action="append", help=f"(repeatable; default {DEFAULT_IMPLS})")
    ap.add_argument("--lengths", help="e.g. 256,1024 (default: the suite's)")
    ap.add_argument("--direction", help="fwd, fwdbwd or both (default: the suite's)")
    ap.add_argument("--slow", default="gau:efficient")
    ap.add_argument("--factor", type=float, default=1.3)
    ap.add_argument("--load", action="store_true", help="keep one core busy meanwhile")
    args = ap.parse_args()
    args.impl = args.impl or list(DEFAULT_IMPLS)
    args.out = args.out.resolve()
    runs = [args.out / f"trial{i:02d}" / name for i in range(1, args.trials + 1)
            for name in ("a", "b", "slow")]  # fmt: skip
    to_run = not all(map(finished, runs))
    load = start_load() if args.load and to_run else None
    started, cpu0, load_avg = time.time(), child_cpu_s(), os.getloadavg()
    try:
        for i in range(1, args.trials + 1):
            trial = args.out / f"trial{i:02d}"
            for name in ("a", "b", "slow"):
                print(f"trial {i}/{args.trials}: run {name}", file=sys.stderr, flush=True)
                run_grid(args, trial / name, slow=name == "slow")
        busy = load_cpu_s(load) if load else None
        runs_cpu = child_cpu_s() - cpu0  # before the busy loop is reaped (it would count)
    finally:
        if load is not None:
            load.terminate()
            load.wait()
    meta = {
        "command": " ".join(run_args(args, Path("OUT"))),
        "slowed": f"{args.slow} forward x{args.factor:g}",
        "load": "a Python busy loop on one core" if args.load else "none added",
        "loadavg_1_5_15_at_start": [round(x, 2) for x in load_avg],
        "loadavg_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.time() - started),
        "runs_cpu_s": round(runs_cpu),
        "busy_loop_cpu_s": round(busy) if busy is not None else None,
    }
    previous = args.out / "summary.json"
    if not to_run and previous.is_file():  # judged again: how the runs were made stays
        old = json.loads(previous.read_text())
        meta = {k: v for k, v in old.items() if k != "trials"}
    trials = sorted(p for p in args.out.glob("trial*") if p.is_dir())[: args.trials]
    write_summary(args, [judge_trial(args, t) for t in trials], meta)


if __name__ == "__main__":
    main()
