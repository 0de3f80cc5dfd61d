"""``attnbench gate``: the CI speed gate (exit 1 on a regression), against a saved or a measured
baseline (:mod:`attnbench.bench.gate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Base = Annotated[
    str | None,
    typer.Option(
        help="Revision to measure a baseline from (default HEAD~1, when none is saved); forces "
        "the measured mode. HEAD with a clean working tree: an A/A check.",
    ),
]
Out = Annotated[
    Path | None,
    typer.Option(
        "--out", help="Folder of the grid's results and compare.md (default: runs/ci-speed)."
    ),
]
Baselines = Annotated[
    Path | None,
    typer.Option(
        help="Saved baselines, one folder per machine class (default: results/baselines)."
    ),
]
PrintClass = Annotated[
    bool, typer.Option("--print-class", help="Print this machine's class, and exit.")
]
Overwrite = Annotated[
    bool,
    typer.Option(
        "--overwrite", help="Replace results in --out (and its -base1... siblings) of another grid."
    ),
]
#: The folders beside --out the gate runs its grids into (the re-run, the measured baseline).
SIBLINGS = ("", "-rerun", "-base1", "-current1", "-base2", "-current2")


def gate_cmd(
    base: Base = None,
    out_dir: Out = None,
    baselines: Baselines = None,
    print_class: PrintClass = False,
    overwrite: Overwrite = False,
) -> None:
    """Run the CI grid (suites/ci.toml) with this checkout's code and compare it with a baseline.

    The baseline is the one saved for this machine class (results/baselines/CLASS/ci.csv;
    --print-class names the class) when there is one: something worse is run again and counts
    only if it repeats, and then only if it is also worse than HEAD~1 measured here and now.
    Otherwise (or with --base REV) a baseline is measured from a git revision in a temporary
    worktree, alternately with the current code (base, current, base, current), and a regression
    must show in both pairs. A base that cannot run the grid is skipped, not failed.

    Default folders are those of the checkout. The last line names the baseline and the verdict.
    Exit code 0: nothing worse (or skipped); 1: a regression; 2: usage error (a --base that
    names no commit, a current code that cannot run the grid).

    Example: [bold]attnbench gate --out runs/ci-speed[/bold]
    (A/A check: [bold]attnbench gate --base HEAD --out runs/aa[/bold])
    """
    from attnbench.bench import gate
    from attnbench.core.errors import AttnbenchError

    if print_class:
        typer.echo(gate.machine_slug())
        raise typer.Exit(0)
    if base is not None and not base.strip():
        raise AttnbenchError(
            f"--base {base!r}: accepted: a git revision (a commit, branch or tag, e.g. HEAD~1)"
        )
    root = gate.checkout()
    out = (out_dir or root / "runs" / "ci-speed").resolve()  # the base runs from its worktree
    _refuse_to_replace(out, overwrite)
    outcome = gate.run_gate(
        out=out,
        baselines=baselines or root / "results" / "baselines",
        base=base,
        root=root,
        say=typer.echo,
        warn=lambda line: typer.echo(line, err=True),
    )
    typer.echo(outcome.line)
    raise typer.Exit(outcome.code)


def _refuse_to_replace(out: Path, overwrite: bool) -> None:
    """The gate runs its grid into ``out`` and the folders beside it again and again, replacing
    its own results; results of another grid there (a speed run given as --out by mistake) are
    replaced only with --overwrite."""
    import json

    from attnbench.runtime.outputs import refuse_to_replace

    for folder in (out.with_name(out.name + suffix) for suffix in SIBLINGS):
        try:
            sidecar = json.loads((folder / "results.json").read_text(encoding="utf-8"))
            ours = sidecar["suite"]["name"] == "ci"  # the grid of suites/ci.toml
        except (OSError, ValueError, KeyError, TypeError):
            ours = False
        refuse_to_replace(
            [folder / "results.csv"], option="--out", folder=folder, overwrite=overwrite or ours
        )
