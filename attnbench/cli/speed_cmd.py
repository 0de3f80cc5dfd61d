"""``attnbench run speed``: time, throughput, roofline and peak memory of every mechanism."""

from __future__ import annotations

import datetime as _dt
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from attnbench.cli.common import Choice, err, out, parse_params
from attnbench.cli.speed_report import (
    SweepBar,
    SweepLines,
    draw_figures,
    print_summary,
    summary_json,
    warn_about,
)
from attnbench.core.errors import AttnbenchError

if TYPE_CHECKING:  # the benchmark (torch) is imported when the command runs, not for --help
    from attnbench.bench.config import SpeedSuite
    from attnbench.bench.summary import SpeedRun

INTERRUPTED = 130  # the shell's code for a run stopped by Ctrl-C (128 + SIGINT)
#: The sweep stopped on a sticky CUDA error: run the same command again with --resume (EX_TEMPFAIL).
STOPPED = 75


# --------------------------------------------------------------------------------------------
# The fixed choices (the same lists as attnbench.bench.config's, without importing torch)
# --------------------------------------------------------------------------------------------


class Device(Choice):
    """``--device``: ``auto`` (CUDA when visible, else CPU), ``cpu`` or ``cuda``."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Dtype(Choice):
    """``--dtype``: the inputs' dtype; the short names are aliases of the long ones."""

    float32 = "float32"
    fp32 = "fp32"
    float64 = "float64"
    fp64 = "fp64"
    bfloat16 = "bfloat16"
    bf16 = "bf16"
    float16 = "float16"
    fp16 = "fp16"


class Direction(Choice):
    """``--direction``: forward (no grad), forward + backward, or both."""

    fwd = "fwd"
    fwdbwd = "fwdbwd"
    both = "both"


class SummaryFormat(Choice):
    """``--format``: the summary as a table (rich, for people) or JSON (for programs)."""

    table = "table"
    json = "json"


class Executor(Choice):
    """``--executor``: where the units of a unit-wise run go."""

    local = "local"
    ray = "ray"


# --------------------------------------------------------------------------------------------
# The options of `run speed`
# --------------------------------------------------------------------------------------------

SuiteOption = Annotated[
    str | None,
    typer.Option(
        "--suite",
        help="Suite name (speed, speed-gpu, ci, gpu/flex...) or a TOML file; default: speed-gpu "
        "when the run is on CUDA, else speed.",
    ),
]
CacheDirOption = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir",
        help="Compile and autotune caches (DIR/inductor, DIR/triton); default: the usual "
        "variables if set, else ~/.cache/attnbench.",
    ),
]
ImplOption = Annotated[
    list[str] | None,
    typer.Option(
        "--impl", help="NAME or NAME:PATH to run instead of the suite's list (repeatable)."
    ),
]
LengthsOption = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated lengths from 1 to 2^31-1, e.g. 256,1024,4096 (lifts per-kind "
        "caps; a case this machine's memory cannot hold at all is refused)."
    ),
]
DeviceOption = Annotated[
    Device | None, typer.Option(help="auto: CUDA when visible, else CPU (the suite's default).")
]
DtypeOption = Annotated[
    Dtype | None,
    typer.Option(
        help="The inputs' dtype; also fp32, fp64, bf16, fp16.",
        metavar="<float32|float64|bfloat16|float16>",  # the aliases in the help: a narrower column
    ),
]
DirectionOption = Annotated[
    Direction | None, typer.Option(help="Forward (no grad), forward + backward, or both.")
]
CausalOption = Annotated[
    bool | None, typer.Option("--causal/--no-causal", help="Only causal / only bidirectional.")
]
ThreadsOption = Annotated[
    int | None,
    typer.Option(help="torch CPU threads: 0 (one per core) up to this machine's cores; recorded."),
]
RoundsOption = Annotated[
    int | None, typer.Option(help="Timed rounds, 1 to 10000 (more: less noise).")
]
ReferenceOption = Annotated[
    str | None, typer.Option(help="NAME:PATH every time is divided by (same rounds), or 'none'.")
]
ParamOption = Annotated[
    list[str] | None,
    typer.Option(
        "--param", help="NAME=VALUE for every selected mechanism that has NAME (repeatable)."
    ),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Any suite key as SECTION.FIELD=VALUE, over the suite file before it is checked; "
        "sections: grid, shape, limits, timing, profile, params.NAME (e.g. timing.rounds=9 or "
        "grid.dtypes=bf16). Repeatable; the options above apply after it.",
    ),
]
OutOption = Annotated[
    Path | None,
    typer.Option(
        "--out", help="Output directory (default: a new SUITE-TIME folder in runs/speed)."
    ),
]
OverwriteOption = Annotated[bool, typer.Option(help="Replace results already in --out.")]
ResumeOption = Annotated[
    bool, typer.Option(help="Continue the run in --out: cases that already have a row are kept.")
]
PlotOption = Annotated[
    bool,
    typer.Option(
        "--plot/--no-plot", help="Draw attnbench plot's figures into --out/figures at the end."
    ),
]
FormatOption = Annotated[
    SummaryFormat,
    typer.Option("--format", help="The end-of-run summary on stdout (json: with the files)."),
]
ExecutorOption = Annotated[
    Executor | None,
    typer.Option(
        help="Run unit by unit, each unit in a worker process: local (one worker here) or "
        'ray (one Ray task per unit; pip install "attnbench\\[ray]").'
    ),
]
ShardOption = Annotated[
    str | None,
    typer.Option(
        help="I/N: run only units I, I+N, I+2N... (an array job's task); then attnbench merge."
    ),
]
RayAddressOption = Annotated[
    str | None,
    typer.Option(help="--executor ray: the cluster to join (default: start a local Ray)."),
]
ListUnitsOption = Annotated[
    bool, typer.Option("--list-units", help="Print the sweep's units (with --format json: JSON).")
]


def print_units(suite, shard: tuple[int, int] | None, fmt: str) -> None:
    """--list-units: every unit of the sweep, in plan order, with the shard that runs it."""
    from attnbench.bench.units import speed_units
    from attnbench.runtime.units import shard_units

    units = shard_units(speed_units(suite), shard)
    if fmt == "json":
        typer.echo(json.dumps([u.as_dict(shard) for u in units], indent=1))
        return
    for u in units:
        out.print(f"{u.index:4d} {escape(u.id)} ({len(u.cases)} cases)")
    out.print(f"{len(units)} units")


def run_units(suite, out_dir: Path, executor: str, shard, resume: bool, overwrite: bool,
              ray_address: str | None) -> SpeedRun | None:  # fmt: skip
    """A unit-wise run (:mod:`attnbench.bench.sweep`); once every unit of the plan is in
    ``out_dir``, merged there into the usual results (returned); else None, with the merge
    command to run when the other shards are done."""
    from attnbench.bench.merge import merge_runs
    from attnbench.bench.sweep import run_sweep
    from attnbench.bench.units import PLAN_NAME

    if ray_address is not None and executor != "ray":
        raise AttnbenchError("--ray-address needs --executor ray")

    def log(line: str) -> None:
        typer.echo(line, err=True)

    outcome = run_sweep(suite, out_dir, executor=executor, shard=shard, resume=resume,
                        overwrite=overwrite, ray_address=ray_address, log=log)  # fmt: skip
    if outcome.interrupted:
        err.print(f"[yellow]interrupted:[/yellow] finished units are kept in {out_dir}; "
                  "run the same command with --resume")  # fmt: skip
        raise typer.Exit(INTERRUPTED)
    if not outcome.complete:
        mine_failed = len(outcome.failed)
        err.print(
            f"this shard: {len(outcome.records) - mine_failed} units ok, {mine_failed} failed, "
            f"{len(outcome.skipped)} done before ({outcome.wall_s:.0f} s). When every shard is "
            f"done: attnbench merge {out_dir} --out {out_dir} (the folders of all shards, if "
            f"they differ; {PLAN_NAME} is in each)"
        )
        return None
    if outcome.failed:
        err.print(f"[yellow]warning:[/yellow] {len(outcome.failed)} units failed twice "
                  f"({', '.join(outcome.failed[:5])}): their cases are error rows; --resume "
                  "runs them again")  # fmt: skip
    from attnbench.bench.provenance import command_line

    return merge_runs([out_dir], out_dir, command=shlex.join(command_line()))


def speed(
    suite: SuiteOption = None,
    impl: ImplOption = None,
    lengths: LengthsOption = None,
    device: DeviceOption = None,
    dtype: DtypeOption = None,
    direction: DirectionOption = None,
    causal: CausalOption = None,
    threads: ThreadsOption = None,
    rounds: RoundsOption = None,
    reference: ReferenceOption = None,
    param: ParamOption = None,
    set_: SetOption = None,
    out_dir: OutOption = None,
    overwrite: OverwriteOption = False,
    resume: ResumeOption = False,
    plot: PlotOption = True,
    summary_format: FormatOption = SummaryFormat.table,
    executor: ExecutorOption = None,
    shard: ShardOption = None,
    ray_address: RayAddressOption = None,
    list_units: ListUnitsOption = False,
    cache_dir: CacheDirOption = None,
) -> None:
    """Time, throughput, FLOPs, roofline and peak memory of every mechanism and path.

    Writes results.csv (one row per case, flushed as soon as it is measured).

    Also complexity.csv (fitted exponents of time and memory in n) and results.json (provenance).

    Then the figures of attnbench plot, in --out/figures (--no-plot: none).

    Ctrl-C stops cleanly and keeps every finished row; --resume continues such a run (and one
    stopped by a sticky CUDA error, exit 75) in the same --out.

    Without --suite: the GPU suite speed-gpu when the run is on CUDA, else the CPU suite speed.

    Example: [bold]attnbench run speed --impl softmax --impl flash-tiled --lengths 512,2048[/bold]
    """
    if resume and overwrite:
        raise AttnbenchError(
            "--resume and --overwrite exclude each other: --resume keeps the rows in --out and "
            "runs the missing cases, --overwrite runs everything again"
        )
    from attnbench.bench.config import load_suite, override
    from attnbench.runtime.caches import compile_caches, resolve_caches
    from attnbench.runtime.tomlconfig import parse_settings

    caches = resolve_caches(cache_dir)
    chosen = override(
        load_suite(
            suite or default_suite_here(_value(device)),
            settings=parse_settings(set_, "--set", "timing.rounds=9"),
        ),
        impls=impl or (),
        lengths=lengths,
        device=_value(device),
        dtype=_value(dtype),
        direction=_value(direction),
        causal=causal,
        threads=threads,
        rounds=rounds,
        reference=reference,
        params=parse_params(param),
    )
    with compile_caches(caches):  # a second run reuses what this one compiles and autotunes
        if list_units or executor is not None or shard is not None:
            run = unit_wise(
                chosen, out_dir, _value(executor), shard, ray_address, resume, overwrite,
                list_units=list_units, fmt=summary_format.value,
            )  # fmt: skip
            if run is None:  # --list-units, or a shard: the others' units are not here yet
                return
        else:
            run = in_process(chosen, out_dir, ray_address, resume, overwrite)
    finish(run, plot, summary_format.value)


def default_suite_here(device: str | None) -> str:
    """The suite to run without --suite (:func:`attnbench.bench.suite_choice.default_suite`),
    said on stderr when it is the GPU's."""
    import torch

    from attnbench.bench.suite_choice import chosen_note, default_suite

    visible = torch.cuda.is_available()
    name = default_suite(device, visible)
    note = chosen_note(name, torch.cuda.get_device_name()) if visible else None
    if note:  # (without a GPU, --device cuda is one error line, from the device check)
        typer.echo(note, err=True)
    return name


def _value(choice: Choice | None) -> str | None:
    """A choice as the library takes it: its plain string (or None: the suite's own value)."""
    return None if choice is None else choice.value


def unit_wise(
    suite: SpeedSuite,
    out_dir: Path | None,
    executor: str | None,
    shard: str | None,
    ray_address: str | None,
    resume: bool,
    overwrite: bool,
    *,
    list_units: bool,
    fmt: str,
) -> SpeedRun | None:
    """--list-units, --shard or --executor: print the units, or run them (:func:`run_units`)."""
    from attnbench.runtime.engines import parse_shard

    parsed_shard = parse_shard(shard) if shard is not None else None
    if list_units:
        print_units(suite, parsed_shard, fmt)
        return None
    if out_dir is None:
        raise AttnbenchError(
            "--shard / --executor: give --out (the folder every shard writes its units to)"
        )
    if suite.profile_calls:
        raise AttnbenchError(
            f"[profile] calls = {suite.profile_calls}: kernel profiles are recorded by a run in "
            "one process; accepted: --shard / --executor with profile.calls = 0, or the "
            "profile without them"
        )
    return run_units(suite, out_dir, executor or "local", parsed_shard, resume, overwrite,
                     ray_address)  # fmt: skip


def in_process(
    suite: SpeedSuite, out_dir: Path | None, ray_address: str | None, resume: bool, overwrite: bool
) -> SpeedRun:
    """The whole sweep in this process, with progress on stderr, into ``out_dir`` (default
    ``runs/speed/SUITE-TIME``)."""
    from attnbench.bench.run import run_speed

    if ray_address is not None:
        raise AttnbenchError("--ray-address needs --executor ray")
    if out_dir is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out_dir = Path("runs") / "speed" / f"{suite.name}-{stamp}"
    progress = SweepBar() if sys.stderr.isatty() else SweepLines()
    return run_speed(suite, out_dir, progress=progress, overwrite=overwrite, resume=resume)


def finish(run: SpeedRun, plot: bool, fmt: str) -> None:
    """The figures, the summary (table or JSON), and the exit code of a run that stopped early."""
    figures = draw_figures(run) if plot else []
    if fmt == "json":
        typer.echo(summary_json(run, figures))
        warn_about(run)
    else:
        print_summary(run, figures)
    if run.stopped:
        err.print(f"[red]stopped:[/red] {run.stopped}")
        raise typer.Exit(STOPPED)
    if run.interrupted:
        raise typer.Exit(INTERRUPTED)
