"""``attnbench history add|steps|report``: the results history of speed runs
(:mod:`attnbench.bench.history`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.cli.common import Choice, Group, command_help, out
from attnbench.core.errors import AttnbenchError

#: Where the history is when --history is not given (and $ATTNBENCH_HISTORY is not set).
DEFAULT_HISTORY = Path("runs") / "history"

HistoryDir = Annotated[
    Path,
    typer.Option(
        "--history",
        envvar="ATTNBENCH_HISTORY",
        help="The history folder (history.sqlite in it); default runs/history, or "
        "$ATTNBENCH_HISTORY.",
    ),
]
Threshold = Annotated[
    float,
    typer.Option(help="Report steps and drifts beyond this factor either way, > 1 (e.g. 1.1)."),
]


class Metric(Choice):
    """``--metric``: what a series follows."""

    auto = "auto"
    time = "time"


MetricOption = Annotated[
    Metric,
    typer.Option(
        "--metric",
        help="auto: time over the reference's in the same rounds (the reference itself: in "
        "units of matmul work), what compare judges; time: milliseconds.",
    ),
]


class Format(Choice):
    table = "table"
    json = "json"


def add_cmd(
    results: Annotated[
        list[Path],
        typer.Argument(help="Results folders of attnbench run speed (or their results CSVs)."),
    ],
    history: HistoryDir = DEFAULT_HISTORY,
    commit: Annotated[
        str | None,
        typer.Option(help="The commit the run measured, when its sidecar does not say (one run)."),
    ] = None,
    allow_dirty: Annotated[
        bool,
        typer.Option(
            "--allow-dirty",
            help="Also record runs of a working tree with uncommitted changes (as <sha>-dirty).",
        ),
    ] = False,
) -> None:
    """Record speed runs in the results history: each case's result, commit, machine, versions.

    The history is one SQLite file, history.sqlite, in the --history folder (made when
    missing). Each case of a run joins the series of its case in its environment: the machine
    class (device, CPU class, device name, threads, clock), the library versions (python,
    torch, cuda, cudnn, triton, the library-backed paths' packages) and the suite; series of
    different environments are never mixed. The commit comes from the run's sidecar
    (results.json); a run of a tree with uncommitted changes is refused unless --allow-dirty. A
    run added twice is recorded once.

    Example: [bold]attnbench history add runs/ci-speed --history runs/history[/bold]
    """
    from attnbench.bench.history.store import History, runs_text

    if commit is not None and len(results) > 1:
        raise AttnbenchError("--commit names the commit of one run; give one results folder")
    with History(history, create=True) as store:
        for path in results:
            added = store.add(path, commit=commit, allow_dirty=allow_dirty)
            envs = "; ".join(env.describe() for env in added.envs)
            if added.already:
                typer.echo(f"{path}: already in the history (commit {added.commit[:10]})")
            else:
                typer.echo(f"{path}: added, commit {added.commit[:10]}, {added.rows} rows ({envs})")
        typer.echo(f"history {history}: {runs_text(store.runs())}")


def steps_cmd(
    history: HistoryDir = DEFAULT_HISTORY,
    threshold: Threshold = 1.1,
    metric: MetricOption = Metric.auto,
    output_format: Annotated[
        Format, typer.Option("--format", help="table (for people) or json (on stdout).")
    ] = Format.table,
) -> None:
    """Find the steps and drifts along the commits in every series of the results history.

    Each series (one case in one environment, one value per commit: the median of its runs) is
    fitted with a piecewise-constant model (PELT, Killick et al. 2012); a step must persist for
    at least 2 commits and exceed --threshold, and a slow change over several commits that no
    single commit makes is reported as drift. Each change comes with the commits either side,
    its size and a confidence (a Mann-Whitney U test of the commits before against those after).
    Slower changes are listed first. Exit code 0 whatever was found.

    Example: [bold]attnbench history steps --history runs/history[/bold]
    """
    from attnbench.bench.history.analysis import analyse, change_records
    from attnbench.bench.history.store import History

    with History(history) as store:
        fitted = analyse(store, metric.value, threshold)
    records = change_records(fitted)
    if output_format is Format.json:
        typer.echo(json.dumps({"series": len(fitted), "changes": records}, indent=2))
        return
    envs = dict.fromkeys((r["machine_class"], r["versions"], r["suite"]) for r in records)
    for env in envs:
        out.print(
            _table(
                [r for r in records if (r["machine_class"], r["versions"], r["suite"]) == env], env
            )
        )
    slower = sum(r["slower"] for r in records)
    typer.echo(
        f"history steps: {len(fitted)} series, {len(records)} changes beyond x{threshold:g} "
        f"({slower} slower, {len(records) - slower} faster)"
    )


def _table(records: list[dict], env: tuple[str, str, str]) -> Table:
    """The changes of one environment (its machine class the title, versions and suite below)."""
    machine, versions, suite = env
    table = Table(title=escape(machine), caption=escape(f"{versions}; suite {suite}"))
    for col in ("case", "change", "size", "commits", "last before .. first after", "confidence"):
        table.add_column(col, overflow="fold")
    for r in records:
        style = "bold red" if r["slower"] else "green"
        change = f"[{style}]{r['kind']}, {'slower' if r['slower'] else 'faster'}[/{style}]"
        size = f"x{r['size']:.3f}"
        if r["commits"] > 1:
            size += f" (x{r['per_commit']:.3f}/commit)"
        where = f"{r['last_commit_before'][:10]} .. {r['first_commit_after'][:10]}"
        confidence = f"{r['confidence']} (p {r['p_value']:.2g})"
        table.add_row(escape(r["case"]), change, size, str(r["commits"]), where, confidence)
    return table


def report_cmd(
    out_dir: Annotated[Path, typer.Option("--out", help="Folder to write index.html into.")],
    history: HistoryDir = DEFAULT_HISTORY,
    threshold: Threshold = 1.1,
    metric: MetricOption = Metric.auto,
    last: Annotated[
        int | None,
        typer.Option(help="Plot only the last N commits of each environment, >= 2 (default: all)."),
    ] = None,
) -> None:
    """Write the results history as one static HTML page: a plot per case family, steps marked.

    One plot per case family (a family's cases in one direction and causal flag) and
    environment: each case's value on a log scale against the commits in the order they were
    measured, steps as dashed red lines and drifts as shaded bands; hover a point for its case,
    commit, date and value. The table of steps and drifts comes first. One file, index.html,
    that opens without a server or a network.

    Example: [bold]attnbench history report --history runs/history --out runs/history-page[/bold]
    """
    from attnbench.bench.history.report import write_report

    written = write_report(history, out_dir, metric.value, threshold, last)
    typer.echo(
        f"wrote {written.path}: {written.plots} plots, {written.series} series, "
        f"{written.changes} steps and drifts beyond x{threshold:g}"
    )


history_app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    help="The results history: record speed runs, find steps and drift, plot them.",
)

for _name, _fn in (("add", add_cmd), ("steps", steps_cmd), ("report", report_cmd)):
    history_app.command(_name, **command_help(_fn))(_fn)
