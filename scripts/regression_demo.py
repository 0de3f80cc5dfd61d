"""Does the speed gate work? A/A runs raise no alarm; an injected slowdown is caught.

    PYTHONPATH=. python scripts/regression_demo.py --runs 6 --slow gqa:efficient --out runs/demo

Runs the CI grid (``suites/ci.toml``) ``--runs`` times with the committed code, each in its own
process (``attnbench run speed --suite ci``), and compares every ordered pair of runs (A/A: same
code, separate runs, this machine; N (N-1) comparisons). Then it runs the grid once more with the
forward of one path made ``--factor`` times slower and compares that with every A/A run. The
slowdown exists only inside that last process: it replaces the path in the registry record with
a wrapper that busy-waits (factor - 1) x the CPU time the real call took (the CI grid's clock is
CPU time). Nothing in attnbench itself can be slowed down by a switch.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import subprocess
import sys
import time
from itertools import permutations
from pathlib import Path

from attnbench import registry
from attnbench.bench.compare import compare


def slowed(fn, factor: float):
    @functools.wraps(fn)  # keeps fn's signature: a path receives only the keywords it declares
    def slow(*args, **kwargs):
        t0 = time.process_time()
        out = fn(*args, **kwargs)
        spent = time.process_time() - t0
        until = time.process_time() + (factor - 1) * spent
        while time.process_time() < until:  # busy: a slow kernel holds its core
            pass
        return out

    return slow


def inject(impl: str, factor: float) -> None:
    """Replace NAME:PATH in the registry (this process only) by a slower copy."""
    mech, target = registry.resolve(impl)
    paths = tuple(
        dataclasses.replace(p, fn=slowed(p.fn, factor)) if p is target else p for p in mech.paths
    )
    slow = dataclasses.replace(mech, paths=paths)
    registry.MECHANISMS = tuple(slow if m is mech else m for m in registry.MECHANISMS)
    registry._BY_NAME = registry._index()


def summary(tag: str, cmp) -> str:
    changes = [ln.ratio for ln in cmp.lines if ln.metric.startswith("time") and ln.ratio]
    worse = sorted({ln.case for ln in cmp.lines if ln.verdict == "worse"})
    return (
        f"{tag}: exit {cmp.exit_code}, {cmp.headline()}, time changes "
        f"x{min(changes):.3f}..x{max(changes):.3f}"
        + (f"; worse: {', '.join(worse)}" if worse else "")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--slow", default="gqa:efficient")
    ap.add_argument("--factor", type=float, default=1.5)
    ap.add_argument("--out", type=Path, default=Path("runs/regression-demo"))
    args = ap.parse_args()
    cli = [sys.executable, "-m", "attnbench", "run", "speed", "--suite", "ci", "--overwrite",
           "--no-plot"]  # fmt: skip
    for i in range(1, args.runs + 1):
        out = args.out / f"aa{i}"
        if not (out / "results.json").is_file():  # resume: finished runs are kept
            print(f"run {i}/{args.runs}", file=sys.stderr, flush=True)
            subprocess.run([*cli, "--out", str(out)], check=True, capture_output=True)
    runs = [args.out / f"aa{i}" / "results.csv" for i in range(1, args.runs + 1)]
    lines, alarms = [], 0
    for a, b in permutations(range(args.runs), 2):
        cmp = compare(runs[a], runs[b])
        alarms += cmp.exit_code == 1
        lines.append(summary(f"A/A run {a + 1} vs baseline run {b + 1}", cmp))
    lines.append(f"A/A: {alarms} alarms in {args.runs * (args.runs - 1)} comparisons")
    slow_dir = args.out / "slow"
    code = (
        "import sys; from scripts.regression_demo import inject; "
        f"inject({args.slow!r}, {args.factor}); "
        "from attnbench.cli import main; "
        f"sys.argv = ['attnbench', 'run', 'speed', '--suite', 'ci', '--overwrite', '--no-plot', "
        f"'--out', {str(slow_dir)!r}]; main()"
    )
    if not (slow_dir / "results.json").is_file():
        print("run with the slowdown", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    caught = 0
    for b in range(args.runs):
        cmp = compare(slow_dir / "results.csv", runs[b])
        caught += cmp.exit_code == 1
        lines.append(summary(f"{args.slow} forward x{args.factor} vs baseline run {b + 1}", cmp))
    lines.append(f"slowdown: caught in {caught} of {args.runs} comparisons")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
