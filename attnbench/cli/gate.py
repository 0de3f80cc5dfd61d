"""``attnbench gate``: the CI speed gate (exit 1 on a regression), against a saved or a measured
baseline (:mod:`attnbench.bench.gate`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from attnbench.cli import gate_study as study
from attnbench.core.errors import AttnbenchError

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
History = Annotated[
    Path | None,
    typer.Option(
        "--history",
        help="A results history folder (attnbench history): cases a pair cannot judge (too few "
        "rounds) are judged against it, and the gate's runs are added to it.",
    ),
]
PrintClass = Annotated[
    bool, typer.Option("--print-class", help="Print this machine's class, and exit.")
]


def gate_cmd(
    base: Base = None,
    out_dir: Out = None,
    baselines: Baselines = None,
    print_class: PrintClass = False,
    history: History = None,
    suite: study.Suite = None,
    speed_args: study.SpeedArgs = None,
    pairs: study.Pairs = 2,
    peer: study.Peer = None,
    slow: study.Slow = None,
    factor: study.Factor = 1.3,
    trials: study.Trials = None,
    load: study.LoadOption = study.Load.quiet,
) -> None:
    """Run the CI grid (suites/ci.toml) with this checkout's code and compare it with a baseline.

    The baseline is the one saved for this machine class (results/baselines/CLASS/ci.csv;
    --print-class names the class) when there is one: something worse is run again and counts
    only if it repeats, and then only if it is also worse than HEAD~1 measured here and now.
    Otherwise (or with --base REV) a baseline is measured from a git revision in a temporary
    worktree, alternately with the current code (base, current, base, current), and a regression
    must show in both pairs. A base that cannot run the grid is skipped, not failed.

    With --history DIR, a case the pair cannot judge (too few rounds for the U test) is judged
    against its results history in DIR (its line says "history rule"), and every grid the gate
    ran is then added to DIR, each under its own commit (a run of uncommitted changes is not).

    The measured mode also times any two revisions side by side (--suite, --speed-args,
    --pairs; OUT/before-after.md reads each side through its own runs, --peer adds a peer), checks
    that a slowdown is caught (--slow NAME:PATH --factor F: the current runs' forward of that
    path made slower in their processes only), and repeats itself (--trials K, with --load): the
    A/A study, whose report is OUT/summary.md and OUT/trials.csv.

    Default folders are those of the checkout. The last line names the baseline and the verdict.
    Exit code 0: nothing worse (or skipped); 1: a regression; 2: usage error (a --base that
    names no commit, a current code that cannot run the grid).

    Example: [bold]attnbench gate --out runs/ci-speed[/bold]
    (A/A check: [bold]attnbench gate --base HEAD --out runs/aa[/bold]; A/A study and
    sensitivity check: [bold]attnbench gate --base HEAD --trials 10 --out runs/aa[/bold], then
    the same with [bold]--slow gqa:efficient[/bold])
    """
    from attnbench.bench import gate

    if print_class:
        typer.echo(gate.machine_slug())
        raise typer.Exit(0)
    root = gate.checkout()
    out = (out_dir or root / "runs" / "ci-speed").resolve()  # the base runs from its worktree
    started = time.time()
    grid = study.grid_of(base, suite, speed_args, pairs, slow, factor, peer)
    if load is not study.Load.quiet and trials is None:
        raise AttnbenchError("--load needs --trials K (the study)")
    if trials is not None:
        outcome = study.run_study(base, trials, load, grid, out, root)
        typer.echo(outcome.line)
        raise typer.Exit(outcome.code)
    outcome = gate.run_gate(
        out=out,
        baselines=baselines or root / "results" / "baselines",
        base=base,
        root=root,
        say=typer.echo,
        warn=lambda line: typer.echo(line, err=True),
        history=history,
        grid=grid,
    )
    if history is not None:
        from attnbench.bench.history.feed import feed, gate_runs

        feed(history, gate_runs(out, started), typer.echo, lambda x: typer.echo(x, err=True))
    typer.echo(outcome.line)
    raise typer.Exit(outcome.code)
