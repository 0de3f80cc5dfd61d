"""The options of ``attnbench gate`` that make it the revision runner (``--base REV`` with another
grid, more pairs, a peer, a slowdown, repeated trials and their report), and what they build:
a :class:`attnbench.bench.gate.Grid` and, with ``--trials``, a study
(:mod:`attnbench.bench.gate_study`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attnbench.cli.common import Choice
from attnbench.core.errors import AttnbenchError

if TYPE_CHECKING:  # the gate (pandas, torch) is imported when the command runs
    from attnbench.bench.gate import Grid, Outcome


class Load(Choice):
    """``--load``: what else runs on the machine during each trial."""

    quiet = "quiet"
    loaded = "loaded"


Suite = Annotated[
    str | None,
    typer.Option(
        "--suite",
        help="The grid of every run: a suite name or a TOML file (default: the CI grid, "
        "suites/ci.toml of each side's checkout). Needs --base.",
    ),
]
SpeedArgs = Annotated[
    str | None,
    typer.Option(
        "--speed-args",
        help='More `run speed` options for every run, one string (e.g. "--impl gqa:efficient '
        '--lengths 256"). Needs --base.',
    ),
]
Pairs = Annotated[
    int, typer.Option("--pairs", help="Base/current pairs a gate runs (alternately).", min=1)
]
Trials = Annotated[
    int | None,
    typer.Option(
        "--trials",
        help="Repeat the gate K times into OUT/SET/trial-K/ (resumable) and write the study's "
        "report, OUT/summary.md and OUT/trials.csv: the A/A study with --base HEAD.",
        min=1,
    ),
]
LoadOption = Annotated[
    Load,
    typer.Option(
        "--load",
        help="With --trials, loaded: neighbours busy during each trial (a float32 matmul loop "
        "per usable core but one).",
    ),
]
Slow = Annotated[
    str | None,
    typer.Option(
        "--slow",
        help="Sensitivity check: NAME:PATH's forward made --factor times slower in the current "
        "runs only (a busy wait in their processes). Needs --base.",
    ),
]
Factor = Annotated[float, typer.Option("--factor", help="The slowdown of --slow, > 1 (e.g. 1.3).")]
Peer = Annotated[
    list[str] | None,
    typer.Option(
        "--peer",
        help="PATH=PEER: PEER's time over PATH's in the same run, a column of OUT/before-after.md "
        "(repeatable).",
        metavar="<str>",
    ),
]


def grid_of(
    base: str | None,
    suite: str | None,
    speed_args: str | None,
    pairs: int,
    slow: str | None,
    factor: float,
    peers: list[str] | None,
) -> Grid:
    """The grid the options ask for, checked: anything but the CI grid needs --base."""
    from attnbench.bench.gate import Grid
    from attnbench.bench.slowdown import checked

    asked = {"--suite": suite, "--speed-args": speed_args, "--slow": slow, "--peer": peers,
             "--pairs": pairs != 2 or None}  # fmt: skip
    given = [name for name, value in asked.items() if value]
    if given and base is None:
        raise AttnbenchError(f"{given[0]} needs --base REV (the measured mode); e.g. --base HEAD")
    if suite is not None and Path(suite).suffix == ".toml":
        suite = str(Path(suite).resolve())  # each side runs from its own checkout
    pairs_of = {}
    for text in peers or []:
        path, sep, peer = text.partition("=")
        if not (sep and ":" in path and ":" in peer):
            raise AttnbenchError(f"--peer {text!r}: accepted: PATH=PEER, each MECHANISM:PATH")
        pairs_of[path] = peer
    return Grid(
        suite=suite,
        args=tuple(shlex.split(speed_args or "")),
        pairs=pairs,
        slow=checked(slow, factor) if slow else None,
        peers=pairs_of,
    )


def run_study(
    base: str | None, trials: int, load: Load, grid: Grid, out: Path, root: Path
) -> Outcome:
    """``--trials K``: the study, each trial a measured-mode gate."""
    from attnbench.bench import gate_study
    from attnbench.bench.provenance import command_line
    from attnbench.runtime.portable import portable

    if base is None:
        raise AttnbenchError("--trials needs --base REV (e.g. --base HEAD: the A/A study)")
    command = portable(shlex.join(command_line()), out)
    study = gate_study.Study(base=base, trials=trials, load=load.value, command=command)
    return gate_study.run_study(
        root, out, study, grid, say=typer.echo, warn=lambda line: typer.echo(line, err=True)
    )
