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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnbench.bench.compare import Comparison, compare, markdown
from attnbench.bench.thresholds import EXIT_NOTHING, EXIT_OK, EXIT_REGRESSION, EXIT_USAGE
from attnbench.core.errors import AttnbenchError
from attnbench.measure.cpu_class import cpu_class
from attnbench.measure.machine import cpu_signature
from attnbench.runtime import logs
from attnbench.runtime.outputs import ensure_dir, write_text

#: Where progress lines go (stdout in the command) and warnings (stderr).
Say = Callable[[str], None]

#: The grid the gate runs, relative to a checkout (the current one or the base's worktree).
CI_SUITE = Path("suites") / "ci.toml"


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


def run_grid(out: Path, code_root: Path) -> tuple[bool, str]:
    """The CI grid with the package at ``code_root``; (ok, one line on failure)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code_root)
    cmd = [sys.executable, "-m", "attnbench", "run", "speed", "--suite",
           str(code_root / CI_SUITE), "--out", str(out), "--overwrite"]  # fmt: skip
    if draws_figures(code_root):
        cmd.append("--no-plot")  # the gate reads the CSV only
    done = subprocess.run(cmd, cwd=code_root, env=env, capture_output=True, text=True)
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
    root: Path, base: str, out: Path, say: Say, warn: Say, history: Path | None = None
) -> Verdict:
    """A baseline measured from revision ``base`` in a temporary worktree (base, current, base,
    current); the cases worse in both pairs."""
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
        if not (tree / CI_SUITE).is_file():
            return Verdict(EXIT_OK, f"skipped: revision {base} has no suites/ci.toml", used)
        runs: dict[str, Path] = {}
        for label, code_root in (("base1", tree), ("current1", root), ("base2", tree),
                                 ("current2", root)):  # fmt: skip
            say(f"speed gate: running the CI grid ({label})")
            runs[label] = out.with_name(f"{out.name}-{label}")
            ok, why = run_grid(runs[label], code_root)
            if not ok and label.startswith("base"):
                why = f"skipped: revision {base} cannot run the CI grid ({why})"
                return Verdict(EXIT_OK, why, used)
            if not ok:
                return Verdict(EXIT_USAGE, f"the CI grid failed with the current code: {why}", used)
        csv = {k: v / "results.csv" for k, v in runs.items()}
        return _both_pairs(csv, out, used, say, history)
    finally:
        git(root, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(tmp, ignore_errors=True)


def _both_pairs(
    csv: dict[str, Path], out: Path, used: str, say: Say, history: Path | None = None
) -> Verdict:
    """current 1 vs base 1 (confirmed by current 2), current 2 vs base 2 (confirmed by current
    1): a regression must show in both."""
    first = compare(csv["current1"], csv["base1"], confirm=[csv["current2"]], history=history)
    second = compare(csv["current2"], csv["base2"], confirm=[csv["current1"]], history=history)
    ensure_dir(out, "--out folder")
    write_text(out / "compare.md", markdown(first) + "\n" + markdown(second))
    say(report(first))
    say(report(second))
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
    code, text = verdict_of(both, headline)
    return Verdict(code, text, used, frozenset(worse) if code == EXIT_REGRESSION else frozenset())


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
    measured = gate_measured(root, "HEAD~1", out, say, warn, history)
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
    found = gate_measured(root, base or "HEAD~1", out, say, warn, history)
    return Outcome(found.code, f"speed gate: baseline {found.used}: {found.text}")
