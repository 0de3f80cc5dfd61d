"""The speed gate (``attnbench gate``): the CI grid compared with a baseline of this machine
class, always.

    attnbench gate [--base REV] [--out runs/ci-speed] [--baselines results/baselines]

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
   1 confirmed by current 2, and current 2 vs base 2 confirmed by current 1). ``--base HEAD``
   with a clean working tree measures the code against itself: an A/A check, where anything
   worse is a false alarm.

What counts as worse is ``attnbench compare``'s decision (:mod:`attnbench.bench.compare`): where
both runs kept their per-round samples (the grids this gate runs), a Mann-Whitney U test with p <
0.001, a change beyond 1.2x and beyond the noise the comparison itself shows; against a saved
baseline, which has no samples file, the threshold rule it was tuned with (1.35x, p20..p80 bands
apart), with a note saying so.

The measured mode is also the project's one way to time two revisions side by side
(:class:`Grid`): another suite or more ``run speed`` options instead of the CI grid, more pairs,
a peer read in the before/after table it writes (:mod:`attnbench.bench.before_after`), a path of
the current runs slowed down for the sensitivity check (:mod:`attnbench.bench.slowdown`), and
repeated trials with the report the A/A study needs (:mod:`attnbench.bench.gate_study`).

A base that cannot run the grid (no ``suites/ci.toml``, an older command line, an error in its
grid) is a warning and a skip, never a failure. The last line printed says which baseline was used
and the verdict. Exit codes: 0 nothing worse (or skipped), 1 a regression, 2 a usage error (a
``--base`` that names no commit, a current code that cannot run the grid).

The gate measures the code of a git checkout (an editable install, ``pip install -e .``): the
current side runs the package found at :func:`checkout`, the base side a worktree of ``--base``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.bench import before_after
from attnbench.bench.compare import Comparison, compare, markdown
from attnbench.bench.slowdown import Slowdown, launch_args
from attnbench.bench.thresholds import EXIT_NOTHING, EXIT_OK, EXIT_REGRESSION, EXIT_USAGE
from attnbench.core.errors import AttnbenchError
from attnbench.measure.cpu_class import cpu_class
from attnbench.measure.machine import cpu_signature
from attnbench.runtime import logs
from attnbench.runtime.outputs import ensure_dir, write_text
from attnbench.runtime.portable import portable
from attnbench.runtime.scrub import scrub_text

#: Where progress lines go (stdout in the command) and warnings (stderr).
Say = Callable[[str], None]

#: The grid the gate runs, relative to a checkout (the current one or the base's worktree).
CI_SUITE = Path("suites") / "ci.toml"


@dataclass(frozen=True)
class Grid:
    """What each run of the gate measures: ``suite`` (None: the CI grid, ``suites/ci.toml`` of the
    run's own checkout; else a suite name or an absolute path, the same for both sides), more
    ``run speed`` options (``args``), the base/current ``pairs`` of the measured mode, the
    current runs' ``slow`` down (the sensitivity check), and the ``peers`` read in the
    before/after table (PATH -> PEER)."""

    suite: str | None = None
    args: tuple[str, ...] = ()
    pairs: int = 2
    slow: Slowdown | None = None
    peers: Mapping[str, str] = field(default_factory=dict)


#: The gate's own grid: the CI suite, two pairs.
CI_GRID = Grid()


@dataclass(frozen=True)
class Outcome:
    """What the gate decided: its exit code and the last line it prints."""

    code: int
    line: str


@dataclass(frozen=True)
class Verdict:
    """One mode's decision: exit code, verdict text, which baseline, the cases worse."""

    code: int
    text: str
    used: str = ""
    worse: frozenset[str] = frozenset()


def checkout() -> Path:
    """The checkout whose code is measured as *current*: the folder holding this package."""
    return Path(__file__).resolve().parents[2]


def machine_slug(signature: str | None = None) -> str:
    """``authenticamd-25-1-avx2``: the part of the CPU signature that decides relative times
    (vendor, family and model, the instruction sets torch dispatches on; :func:`cpu_class`)."""
    return cpu_class(signature or cpu_signature())


def git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def has_previous_commit(root: Path) -> bool:
    return bool(git(root, "rev-parse", "--verify", "--quiet", "HEAD~1^{commit}").stdout.strip())


def draws_figures(code_root: Path) -> bool:
    """Whether the ``run speed`` of the code at ``code_root`` draws figures (and so takes
    ``--no-plot``): the previous commit measured by the gate may predate the option."""
    cli = code_root / "attnbench" / "cli" / "speed_cmd.py"
    return cli.is_file() and "--no-plot" in cli.read_text()


def run_grid(
    out: Path, code_root: Path, grid: Grid = CI_GRID, slow: Slowdown | None = None
) -> tuple[bool, str]:
    """The grid with the package at ``code_root`` (``slow``: a path of it slowed down), its
    messages kept in ``OUT.log``; (ok, one line on failure)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code_root)
    suite = grid.suite or str(code_root / CI_SUITE)
    argv = ["run", "speed", "--suite", suite, "--out", str(out), "--overwrite", *grid.args]
    if draws_figures(code_root):
        argv.append("--no-plot")  # the gate reads the CSV only
    cmd = [sys.executable, *launch_args(argv, slow)]
    done = subprocess.run(cmd, cwd=code_root, env=env, capture_output=True, text=True)
    ensure_dir(out.parent, "--out folder")
    write_text(out.with_name(out.name + ".log"), scrub_text(done.stdout + done.stderr, code_root))
    if done.returncode != 0 or not (out / "results.csv").is_file():
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        return False, lines[-1] if lines else f"exit {done.returncode}"
    return True, ""


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


def verdict_of(code: int, headline: str) -> tuple[int, str]:
    """The gate's exit code and verdict text for a comparison's exit code and headline."""
    if code == EXIT_REGRESSION:
        return code, f"FAILED, {headline}"
    if code == EXIT_NOTHING:
        return EXIT_OK, f"skipped, nothing comparable ({headline})"
    if code != EXIT_OK:
        return code, f"error ({headline})"
    return EXIT_OK, f"passed, {headline}"


def gate_saved(
    root: Path, baseline: Path, out: Path, say: Say, history: Path | None = None
) -> Verdict:
    """The current code's grid against a saved baseline, re-run to confirm what looks worse."""
    ok, why = run_grid(out, root)
    if not ok:
        return Verdict(EXIT_USAGE, f"the CI grid failed with the current code: {why}")
    cmp = compare(out / "results.csv", baseline, history=history)
    if cmp.exit_code == EXIT_REGRESSION or cmp.count("suspect"):
        say("speed gate: something looks worse; re-running the grid to confirm")
        rerun = out.with_name(out.name + "-rerun")
        ok, why = run_grid(rerun, root)
        if ok:
            cmp = compare(
                out / "results.csv", baseline, confirm=[rerun / "results.csv"], history=history
            )
    write_text(out / "compare.md", markdown(cmp))
    say(report(cmp))
    code, text = verdict_of(cmp.exit_code, cmp.headline())
    return Verdict(code, text, worse=frozenset(worse_cases(cmp)))


def gate_measured(
    root: Path,
    base: str,
    out: Path,
    say: Say,
    warn: Say,
    grid: Grid = CI_GRID,
    history: Path | None = None,
) -> Verdict:
    """A baseline measured from revision ``base`` in a temporary worktree (base, current, base,
    current, ... ``grid.pairs`` of each); the cases worse in every pair."""
    sha = git(root, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}").stdout.strip()
    if not sha:
        raise AttnbenchError(f"--base {base}: no such revision in this repository")
    used = f"measured from revision {base} ({sha[:10]})"
    if git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        warn("warning: the working tree has uncommitted changes: 'current' measures them")
    tmp = Path(tempfile.mkdtemp(prefix="attnbench-base-"))
    tree = tmp / "base"
    added = git(root, "worktree", "add", "--detach", str(tree), sha)
    if added.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        return Verdict(EXIT_OK, f"skipped: could not check out {base}: {added.stderr.strip()}",
                       used)  # fmt: skip
    try:
        if grid.suite is None and not (tree / CI_SUITE).is_file():
            return Verdict(EXIT_OK, f"skipped: revision {base} has no suites/ci.toml", used)
        runs: dict[str, Path] = {}
        for label in run_labels(grid.pairs):
            current = label.startswith("current")
            say(f"speed gate: running the grid ({label})")
            runs[label] = out.with_name(f"{out.name}-{label}")
            slow = grid.slow if current else None
            ok, why = run_grid(runs[label], root if current else tree, grid, slow)
            if not ok and not current:
                why = f"skipped: revision {base} cannot run the grid ({why})"
                return Verdict(EXIT_OK, why, used)
            if not ok:
                return Verdict(EXIT_USAGE, f"the grid failed with the current code: {why}", used)
        csv = {k: v / "results.csv" for k, v in runs.items()}
        verdict = _all_pairs(csv, grid.pairs, out, used, say, history)
        _before_after(csv, grid, out, f"{base} = {sha[:10]}", say)
        return verdict
    finally:
        git(root, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(tmp, ignore_errors=True)


def run_labels(pairs: int) -> list[str]:
    """The measured mode's runs in the order made: base1, current1, base2, current2, ..."""
    return [f"{side}{k}" for k in range(1, pairs + 1) for side in ("base", "current")]


def _all_pairs(
    csv: dict[str, Path], pairs: int, out: Path, used: str, say: Say, history: Path | None = None
) -> Verdict:
    """current k vs base k, confirmed by the other current runs (two pairs: current 1 vs base 1
    confirmed by current 2, and current 2 vs base 2 by current 1): a regression must show in
    every pair."""
    cmps = []
    for k in range(1, pairs + 1):
        others = [csv[f"current{j}"] for j in range(1, pairs + 1) if j != k]
        cmps.append(compare(csv[f"current{k}"], csv[f"base{k}"], confirm=others, history=history))
    ensure_dir(out, "--out folder")
    text = "\n".join(markdown(c) for c in cmps)
    write_text(out / "compare.md", portable(text, out))  # no path of this machine in it
    for cmp in cmps:
        say(report(cmp))
    worse = sorted(set.intersection(*(worse_cases(c) for c in cmps)))
    codes = [c.exit_code for c in cmps]
    every = {1: "the pair", 2: "both pairs"}.get(pairs, f"all {pairs} pairs")
    if worse:
        both, headline = EXIT_REGRESSION, f"regression in {every}: " + ", ".join(worse)
    elif EXIT_REGRESSION in codes:
        both = EXIT_OK
        headline = "something looked worse in one pair only (machine noise): not a regression"
        if pairs > 2:
            headline = "something looked worse in some pairs only (machine noise): not a regression"
    else:
        both = EXIT_OK if EXIT_OK in codes else cmps[0].exit_code
        headline = cmps[0].headline()
    code, text = verdict_of(both, headline)
    return Verdict(code, text, used, frozenset(worse) if code == EXIT_REGRESSION else frozenset())


def _before_after(csv: dict[str, Path], grid: Grid, out: Path, base: str, say: Say) -> None:
    """``OUT/before-after.md``: the two sides read through their own runs (a table that cannot
    be made, e.g. from a grid with no row measured on both sides, is a line, not a failure)."""
    sides = {side: [csv[f"{side}{k}"] for k in range(1, grid.pairs + 1)]
             for side in ("base", "current")}  # fmt: skip
    try:
        written = before_after.write(out, sides["base"], sides["current"], grid.peers, base)
    except (KeyError, ValueError) as e:
        say(f"speed gate: no before/after table ({e})")
        return
    say(f"speed gate: before/after table in {written}")


def _against_saved(
    root: Path, saved: Path, slug: str, out: Path, say: Say, warn: Say, history: Path | None
) -> Verdict:
    """A saved baseline's verdict; its regressions checked against HEAD~1 measured here and now
    (it was made at another time, maybe on another host of the class): only the cases worse
    than both count."""
    shown = saved.relative_to(root) if saved.is_relative_to(root) else saved
    used = f"saved for class {slug} ({shown})"
    found = gate_saved(root, saved, out, say, history)
    if found.code != EXIT_REGRESSION or not has_previous_commit(root):
        return Verdict(found.code, found.text, used, found.worse)
    say("speed gate: checking the saved baseline's regressions against a baseline measured now "
        "from HEAD~1")  # fmt: skip
    measured = gate_measured(root, "HEAD~1", out, say, warn, history=history)
    if measured.code not in (EXIT_OK, EXIT_REGRESSION):
        return Verdict(found.code, found.text, used, found.worse)
    both = sorted(found.worse & measured.worse)
    only_saved = sorted(found.worse - measured.worse)
    if only_saved:
        why = "a change older than the previous commit, or the baseline's own time and host"
        say(f"warning: worse than the saved baseline only ({len(only_saved)}; {why}): "
            + "; ".join(only_saved))  # fmt: skip
    used += f", confirmed against {measured.used}"
    if both:
        return Verdict(EXIT_REGRESSION, f"FAILED, regression against both: {', '.join(both)}", used)
    return Verdict(EXIT_OK, "passed, nothing worse than both baselines", used)


def run_gate(
    out: Path,
    baselines: Path,
    base: str | None = None,
    root: Path | None = None,
    say: Say = logs.info,
    warn: Say = logs.info,  # its lines say "warning:" themselves
    grid: Grid = CI_GRID,
    history: Path | None = None,
) -> Outcome:
    """The gate (see the module docstring): a saved baseline of this machine class in
    ``baselines`` unless ``base`` names a revision to measure one from (default HEAD~1 when none
    is saved). ``out`` must be absolute: the base's grid runs from its own worktree. ``history``:
    a results history folder that judges what a pair cannot (too few rounds; see
    :mod:`attnbench.bench.compare.history_rule`). Raises AttnbenchError for a ``base`` that names
    no commit."""
    root = root or checkout()
    slug = machine_slug()
    saved = baselines / slug / "ci.csv"
    if base is None and saved.is_file():
        found = _against_saved(root, saved, slug, out, say, warn, history)
        return Outcome(found.code, f"speed gate: baseline {found.used}: {found.text}")
    if base is None:
        say(f"speed gate: no saved baseline for class {slug}; measuring one from HEAD~1")
        if not has_previous_commit(root):
            # A shallow clone, a first commit, or no git: nothing to measure from. Not a failure:
            # the user asked for nothing that does not exist.
            return Outcome(EXIT_OK, f"speed gate: no baseline (none saved for class {slug}, no "
                           "previous commit here to measure one from): skipped")  # fmt: skip
    found = gate_measured(root, base or "HEAD~1", out, say, warn, grid, history)
    return Outcome(found.code, f"speed gate: baseline {found.used}: {found.text}")
