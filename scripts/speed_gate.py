"""The CI speed gate: the CI grid compared with a baseline of this machine class, always.

    python scripts/speed_gate.py [--base REV] [--out runs/ci-speed] [--baselines results/baselines]

1. **A saved baseline of this machine class** (``results/baselines/<class>/ci.csv``, the class
   being the CPU's vendor, family/model and instruction sets, see :func:`machine_slug`): the grid
   is run with the checkout's code and compared; something worse is measured again and counts
   only if it repeats (``attnbench compare --confirm``), and then only if it is also worse than
   a baseline measured now from the previous commit (2.): a saved baseline is from another time,
   maybe another host of the class.
2. **None saved: a measured baseline**, the way ``asv continuous`` works. The base revision
   (``--base``, default the previous commit, ``HEAD~1``) is checked out in a temporary
   ``git worktree`` and run from there on ``PYTHONPATH`` (the package is pure Python: no second
   install), alternately with the current code: base, current, base, current, so that drift in the
   machine's speed hits both sides alike. A regression must show in both pairs (current 1 vs base
   1 confirmed by current 2, and current 2 vs base 2 confirmed by current 1).

What counts as worse is ``attnbench compare``'s decision (:mod:`attnbench.bench.compare`): where
both runs kept their per-round samples (the grids this gate runs), a Mann-Whitney U test with p <
0.001, a change beyond 1.2x and beyond the noise the comparison itself shows; against a saved
baseline, which has no samples file, the threshold rule it was tuned with (1.35x, p20..p80 bands
apart), with a note saying so.

A base that cannot run the grid (no ``suites/ci.toml``, an older command line, an error in its
grid) is a warning and a skip, never a failure. The last line printed says which baseline was used
and the verdict. Exit codes: 0 nothing worse (or skipped), 1 a regression, 2 a usage error (a
``--base`` that names no commit).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnbench.bench.compare import Comparison, compare, markdown  # noqa: E402
from attnbench.measure.machine import cpu_signature  # noqa: E402

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2


def machine_slug(signature: str | None = None) -> str:
    """``authenticamd-25-1-avx2``: the part of the CPU signature that decides relative times
    (vendor, family and model, the instruction sets torch dispatches on); no stepping, no torch
    version (a baseline also records the torch version, and ``compare`` checks it)."""
    signature = signature or cpu_signature()
    cpu = signature.split(";")[0].strip()
    parts = cpu.split()
    vendor = parts[0] if parts else "unknown"
    ident = parts[1].split("/")[:2] if len(parts) > 1 else []
    isa = parts[2].replace(",", "-") if len(parts) > 2 else ""
    slug = "-".join([vendor, *ident, isa] if isa and isa != "-" else [vendor, *ident])
    return re.sub(r"[^a-z0-9_.-]+", "-", slug.lower()).strip("-")


def git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def has_previous_commit() -> bool:
    return bool(git("rev-parse", "--verify", "--quiet", "HEAD~1^{commit}").stdout.strip())


def draws_figures(code_root: Path) -> bool:
    """Whether the ``run speed`` of the code at ``code_root`` draws figures (and so takes
    ``--no-plot``): the previous commit measured by the gate may predate the option."""
    cli = code_root / "attnbench" / "cli" / "speed_cmd.py"
    return cli.is_file() and "--no-plot" in cli.read_text()


def run_grid(out: Path, code_root: Path) -> tuple[bool, str]:
    """The CI grid with the package at ``code_root``; (ok, one line on failure)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code_root)
    cmd = [sys.executable, "-m", "attnbench", "run", "speed", "--suite",
           str(code_root / "suites" / "ci.toml"), "--out", str(out), "--overwrite"]  # fmt: skip
    if draws_figures(code_root):
        cmd.append("--no-plot")  # the gate reads the CSV only
    done = subprocess.run(cmd, cwd=code_root, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not (out / "results.csv").is_file():
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        return False, lines[-1] if lines else f"exit {done.returncode}"
    return True, ""


def gate_saved(baseline: Path, out: Path) -> tuple[int, str, set[str]]:
    ok, why = run_grid(out, ROOT)
    if not ok:
        return EXIT_USAGE, f"the CI grid failed with the current code: {why}", set()
    cmp = compare(out / "results.csv", baseline)
    confirm: list[Path] = []
    if cmp.exit_code == EXIT_REGRESSION or cmp.count("suspect"):
        print("speed gate: something looks worse; re-running the grid to confirm", flush=True)
        rerun = out.with_name(out.name + "-rerun")
        ok, why = run_grid(rerun, ROOT)
        if ok:
            confirm = [rerun / "results.csv"]
            cmp = compare(out / "results.csv", baseline, confirm=confirm)
    (out / "compare.md").write_text(markdown(cmp))
    print(report(cmp), flush=True)
    return (*_verdict(cmp.exit_code, cmp.headline(), [cmp]), worse_cases(cmp))


def gate_measured(base: str, out: Path) -> tuple[int, str, str, set[str]]:
    """(exit code, verdict, what was used, the cases worse in both pairs) for a baseline
    measured from ``base``."""
    sha = git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}").stdout.strip()
    if not sha:
        return EXIT_USAGE, f"--base {base}: no such revision in this repository", "", set()
    used = f"measured from revision {base} ({sha[:10]})"
    if git("status", "--porcelain", "--untracked-files=no").stdout.strip():
        print("warning: the working tree has uncommitted changes: 'current' measures them",
              file=sys.stderr)  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="attnbench-base-"))
    tree = tmp / "base"
    added = git("worktree", "add", "--detach", str(tree), sha)
    if added.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        return EXIT_OK, f"skipped: could not check out {base}: {added.stderr.strip()}", used, set()
    try:
        if not (tree / "suites" / "ci.toml").is_file():
            return EXIT_OK, f"skipped: revision {base} has no suites/ci.toml", used, set()
        runs: dict[str, Path] = {}
        for label, root in (("base1", tree), ("current1", ROOT), ("base2", tree),
                            ("current2", ROOT)):  # fmt: skip
            print(f"speed gate: running the CI grid ({label})", flush=True)
            runs[label] = out.with_name(f"{out.name}-{label}")
            ok, why = run_grid(runs[label], root)
            if not ok and label.startswith("base"):
                why = f"skipped: revision {base} cannot run the CI grid ({why})"
                return EXIT_OK, why, used, set()
            if not ok:
                why = f"the CI grid failed with the current code: {why}"
                return EXIT_USAGE, why, used, set()
        csv = {k: v / "results.csv" for k, v in runs.items()}
        first = compare(csv["current1"], csv["base1"], confirm=[csv["current2"]])
        second = compare(csv["current2"], csv["base2"], confirm=[csv["current1"]])
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(markdown(first) + "\n" + markdown(second))
        print(report(first), flush=True)
        print(report(second), flush=True)
        worse = sorted(worse_cases(first) & worse_cases(second))
        codes = (first.exit_code, second.exit_code)
        if worse:
            both, headline = EXIT_REGRESSION, "regression in both pairs: " + ", ".join(worse)
        elif EXIT_REGRESSION in codes:
            both = EXIT_OK
            headline = "something looked worse in one pair only (machine noise): not a regression"
        else:
            both = EXIT_OK if EXIT_OK in codes else first.exit_code
            headline = first.headline()
        code, verdict = _verdict(both, headline, [first, second])
        return code, verdict, used, set(worse) if code == EXIT_REGRESSION else set()
    finally:
        git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(tmp, ignore_errors=True)


def worse_cases(cmp: Comparison) -> set[str]:
    return {line.case for line in cmp.lines if line.verdict == "worse"}


def report(cmp: Comparison, limit: int = 12) -> str:
    """A few lines: the headline, the warnings, what changed (worst first)."""
    out = [f"compare {cmp.current} with {cmp.baseline}: {cmp.headline()}"]
    out += [f"  warning: {w}" for w in cmp.warnings]
    out += [f"  note: {n}" for n in cmp.notes]
    changed = cmp.shown(changes_only=True)
    for line in changed[:limit]:
        ratio = f" x{line.ratio:.2f}" if line.ratio else ""
        out.append(f"  {line.verdict}: {line.case} {line.metric}{ratio} {line.note}".rstrip())
    if len(changed) > limit:
        out.append(f"  ... and {len(changed) - limit} more lines (compare.md)")
    return "\n".join(out)


def _verdict(code: int, headline: str, cmps) -> tuple[int, str]:
    if code == EXIT_REGRESSION:
        return code, f"FAILED, {headline}"
    if code == 3:  # nothing comparable
        return EXIT_OK, f"skipped, nothing comparable ({headline})"
    if code != EXIT_OK:
        return code, f"error ({headline})"
    return EXIT_OK, f"passed, {headline}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="revision to measure a baseline from (default HEAD~1); "
                    "forces the measured mode")  # fmt: skip
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "ci-speed")
    ap.add_argument("--baselines", type=Path, default=ROOT / "results" / "baselines")
    ap.add_argument("--print-class", action="store_true", help="print this machine's class, exit")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()  # the base's grid runs from its own worktree
    slug = machine_slug()
    if args.print_class:
        print(slug)
        return EXIT_OK
    saved = args.baselines / slug / "ci.csv"
    if args.base is None and saved.is_file():
        shown = saved.relative_to(ROOT) if saved.is_relative_to(ROOT) else saved
        used = f"saved for class {slug} ({shown})"
        code, verdict, worse = gate_saved(saved, args.out)
        if code == EXIT_REGRESSION and has_previous_commit():
            # A saved baseline was made at another time, maybe on another host of the class:
            # its alarms are checked against the previous commit measured here and now, and
            # only the cases worse in both count.
            print("speed gate: checking the saved baseline's regressions against a baseline "
                  "measured now from HEAD~1", flush=True)  # fmt: skip
            m_code, m_verdict, m_used, m_worse = gate_measured("HEAD~1", args.out)
            if m_code in (EXIT_OK, EXIT_REGRESSION):
                both = sorted(worse & m_worse)
                only_saved = sorted(worse - m_worse)
                if only_saved:
                    print(f"warning: worse than the saved baseline only ({len(only_saved)}; a "
                          "change older than the previous commit, or the baseline's own "
                          "time and host): " + "; ".join(only_saved))  # fmt: skip
                used += f", confirmed against {m_used}"
                if both:
                    verdict = f"FAILED, regression against both: {', '.join(both)}"
                else:
                    code = EXIT_OK
                    verdict = "passed, nothing worse than both baselines"
    else:
        if args.base is None:
            print(f"speed gate: no saved baseline for class {slug}; measuring one from HEAD~1",
                  flush=True)  # fmt: skip
            if not has_previous_commit():
                # A shallow clone, a first commit, or no git: nothing to measure from. A warning,
                # not a failure: the user asked for nothing that does not exist.
                print(f"speed gate: no baseline (none saved for class {slug}, no previous "
                      "commit here to measure one from): skipped")  # fmt: skip
                return EXIT_OK
        code, verdict, used, _ = gate_measured(args.base or "HEAD~1", args.out)
    if code == EXIT_USAGE and not used:
        print(f"error: {verdict}", file=sys.stderr)
        return code
    print(f"speed gate: baseline {used}: {verdict}")
    return code


if __name__ == "__main__":
    sys.exit(main())
