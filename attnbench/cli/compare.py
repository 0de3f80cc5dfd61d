"""``attnbench compare CURRENT BASELINE``: the regression gate (exit 1 on a regression); and
``attnbench compare RESULTS --peer PATH=PEER --n N``: one run's paths against their peers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.bench.thresholds import (
    MAX_FACTOR,
    MAX_MEM_SLACK,
    MAX_MEM_TOLERANCE,
    MEM_SLACK_BYTES,
    MEM_TOLERANCE,
    MEM_TOLERANCE_OTHER,
    MIN_EFFECT,
    P_VALUE,
    REF_TIME_RATIO,
    TIME_RATIO,
)
from attnbench.cli.common import err, out
from attnbench.core.errors import AttnbenchError

if TYPE_CHECKING:  # the comparison itself (pandas, numpy) is imported when a command runs
    from attnbench.bench.compare import Comparison, Line, Thresholds

STYLE = {
    "worse": "bold red",
    "unconfirmed": "yellow",
    "suspect": "yellow",
    "better": "green",
    "new": "cyan",
    "missing": "yellow",
    "not judged": "dim",
}

FORMATS = ("table", "json")


# The options, one alias each (Typer names each option after its parameter).
Confirm = Annotated[
    list[Path] | None,
    typer.Option(
        "--confirm",
        help="Results of the same grid run again: a regression counts only if it repeats "
        "there too (repeatable).",
        metavar="<path>",  # not list[Path]: a narrower column, so no option name is cut at 80
    ),
]
MarkdownFile = Annotated[
    Path | None, typer.Option("--markdown", help="Also write the comparison as markdown.")
]
OutputFormat = Annotated[
    str,
    typer.Option(
        "--format",
        help="table (for people) or json (the comparison on stdout, messages on stderr).",
    ),
]
FACTOR = f"a factor > 1 and <= {MAX_FACTOR:g}"
TOLERANCE = f"from 0 to {MAX_MEM_TOLERANCE:g}"
PValue = Annotated[
    float,
    typer.Option(help="With samples: the U test's one-sided p must be below this; in (0, 0.5)."),
]
MinEffect = Annotated[
    float,
    typer.Option(help=f"With samples: the ratio of medians must exceed this too; {FACTOR}."),
]
TimeRatio = Annotated[
    float,
    typer.Option(help=f"Without samples: a time ratio must grow by more than this; {FACTOR}."),
]
RefTimeRatio = Annotated[
    float, typer.Option(help=f"The reference's own time (x matmul rate) threshold; {FACTOR}.")
]
MemTolerance = Annotated[
    float, typer.Option(help=f"Relative memory tolerance, deterministic methods; {TOLERANCE}.")
]
MemSlack = Annotated[
    int, typer.Option(help="Absolute memory slack in bytes, deterministic methods; 0 to 2^40.")
]
MemToleranceOther = Annotated[
    float,
    typer.Option(help=f"Relative memory tolerance, other methods (CUDA); {TOLERANCE}."),
]
Separation = Annotated[
    bool,
    typer.Option(
        "--separation/--no-separation",
        help="Also require the p20..p80 bands of the two time ratios not to overlap.",
    ),
]
HistoryDir = Annotated[
    Path | None,
    typer.Option(
        "--history",
        help="A results history folder (attnbench history): cases with too few rounds for the "
        "U test are judged against their history there.",
    ),
]
ShowAll = Annotated[
    bool, typer.Option("--all", help="Show every compared quantity, not only the changes.")
]
Peers = Annotated[
    list[str] | None,
    typer.Option(
        "--peer",
        help="Instead of a baseline: read PATH against PEER in CURRENT alone, at --n (PATH=PEER, "
        "PEER may be :NAME, the same mechanism's path; PATH alone: its row; repeatable).",
        metavar="<str>",
    ),
]
PeerLength = Annotated[
    int | None,
    typer.Option("--n", help="With --peer: the length to read, >= 1 (required with --peer)."),
]
PeerCausal = Annotated[
    bool, typer.Option("--causal", help="With --peer: read the causal rows instead.")
]
Overwrite = Annotated[
    bool, typer.Option("--overwrite", help="Replace a --markdown file that is already there.")
]


def compare_cmd(
    current: Annotated[Path, typer.Argument(help="Results CSV of this run.")],
    baseline: Annotated[
        Path | None, typer.Argument(help="Results CSV to compare against (not with --peer).")
    ] = None,
    confirm: Confirm = None,
    markdown_file: MarkdownFile = None,
    output_format: OutputFormat = "table",
    p_value: PValue = P_VALUE,
    min_effect: MinEffect = MIN_EFFECT,
    time_ratio: TimeRatio = TIME_RATIO,
    ref_time_ratio: RefTimeRatio = REF_TIME_RATIO,
    mem_tolerance: MemTolerance = MEM_TOLERANCE,
    mem_slack: MemSlack = MEM_SLACK_BYTES,
    mem_tolerance_other: MemToleranceOther = MEM_TOLERANCE_OTHER,
    separation: Separation = True,
    show_all: ShowAll = False,
    history: HistoryDir = None,
    peer: Peers = None,
    peer_n: PeerLength = None,
    peer_causal: PeerCausal = False,
    overwrite: Overwrite = False,
) -> None:
    """Compare a speed run with a baseline: time as ratio to the reference, FLOPs, memory.

    Time is worse when a Mann-Whitney U test of the per-round samples gives p < --p-value, the
    ratio of medians exceeds --min-effect, and the change is beyond the noise this comparison
    shows, in two cases of a path (one case alone: reported as suspect; a --confirm re-run that
    shows it again makes it a regression). Results without a samples file fall back to
    --time-ratio with p20..p80 bands apart. With --history DIR, a case with too few rounds for
    the U test is judged against its results history instead (the history rule).

    Exit code 0: nothing worse; 1: a regression; 2: usage error; 3: nothing comparable
    (e.g. a baseline from another machine or torch version: a warning, not a failure).

    The terminal table shows what changed (--all: everything); --markdown writes every time
    line too; --format json prints the whole comparison as JSON on stdout. With --confirm,
    something worse in CURRENT alone is reported as unconfirmed.

    With --peer instead of a baseline, one run's paths are read against their peers in the same
    rounds, at one length (--n): each path's fraction of the matmul rate, its speed-up over dense
    SDPA, and each peer's time over the path's (above 1 the path is faster). Printed as Markdown
    (--markdown also writes it; --format json prints the numbers).

    Example: [bold]attnbench compare runs/ci/results.csv runs/ci-before/results.csv[/bold]
    (peers: [bold]attnbench compare RESULTS.csv --peer local:efficient=:flex --n 8192[/bold])
    """
    if output_format not in FORMATS:
        raise AttnbenchError(f"--format {output_format!r}: accepted: {', '.join(FORMATS)}")
    if markdown_file is not None:
        _refuse_markdown(markdown_file, [current, baseline, *(confirm or ())], overwrite)
    if peer or baseline is None:
        _peer_view(current, baseline, peer or [], peer_n, peer_causal, markdown_file, output_format)
        return
    thresholds = _thresholds(
        time_ratio=time_ratio,
        ref_time_ratio=ref_time_ratio,
        mem_tolerance=mem_tolerance,
        mem_slack_bytes=mem_slack,
        mem_tolerance_other=mem_tolerance_other,
        require_separation=separation,
        p_value=p_value,
        min_effect=min_effect,
    )
    from attnbench.bench.compare import as_json, compare

    result = compare(current, baseline, thresholds, confirm or (), history)
    if markdown_file is not None:
        _write_markdown(markdown_file, result, show_all)
    if output_format == "json":
        typer.echo(json.dumps(as_json(result), indent=2))
        _print_messages(result)
        raise typer.Exit(result.exit_code)
    _print_table(result, show_all)
    _print_messages(result)
    out.print(f"attnbench compare: {result.headline()}", soft_wrap=True)
    raise typer.Exit(result.exit_code)


def _refuse_markdown(markdown_file: Path, csvs: list[Path | None], overwrite: bool) -> None:
    """--markdown never replaces what the command reads, nor an existing file without
    --overwrite."""
    from attnbench.bench.results import files_read
    from attnbench.runtime.outputs import refuse_to_replace

    read = [f for csv in csvs if csv is not None for f in files_read(csv)]
    refuse_to_replace([markdown_file], option="--markdown", inputs=read, overwrite=overwrite)


def _peer_view(
    results: Path,
    baseline: Path | None,
    peers: list[str],
    n: int | None,
    causal: bool,
    markdown_file: Path | None,
    output_format: str,
) -> None:
    """``compare RESULTS --peer ...``: the paths of one run against their peers
    (:mod:`attnbench.bench.peers`)."""
    if not peers:
        raise AttnbenchError("BASELINE is missing; accepted: CURRENT BASELINE, or CURRENT --peer")
    if baseline is not None:
        raise AttnbenchError(f"--peer reads one run; accepted: CURRENT alone, not {baseline}")
    from attnbench.bench.peers import parse_peer, peer_markdown, peer_rows
    from attnbench.runtime.outputs import ensure_dir, write_text

    parsed = [parse_peer(p) for p in peers]
    if n is None:
        raise AttnbenchError("--peer needs --n: the sequence length to read (e.g. --n 8192)")
    if n < 1:
        raise AttnbenchError(f"--n {n}: accepted: a sequence length >= 1")
    records = peer_rows(results, n, parsed, causal)
    text = peer_markdown(records, parsed)
    if markdown_file is not None:
        ensure_dir(markdown_file.parent, "folder for --markdown")
        write_text(markdown_file, text)
    if output_format == "json":
        typer.echo(json.dumps(records, indent=2))
    else:
        typer.echo(text, nl=False)


def _thresholds(**given: Any) -> Thresholds:
    """The thresholds, each checked (one-line errors naming the option)."""
    factors = (("--time-ratio", given["time_ratio"]), ("--ref-time-ratio", given["ref_time_ratio"]),
               ("--min-effect", given["min_effect"]))  # fmt: skip
    for name, value in factors:
        if not 1 < value <= MAX_FACTOR:  # NaN compares false with everything
            raise AttnbenchError(f"{name} {value}: accepted: {FACTOR} (e.g. 1.3)")
    if not 0 < given["p_value"] < 0.5:
        raise AttnbenchError(f"--p-value {given['p_value']}: accepted: a probability in (0, 0.5)")
    memory = (
        ("--mem-tolerance", given["mem_tolerance"], MAX_MEM_TOLERANCE, TOLERANCE),
        ("--mem-tolerance-other", given["mem_tolerance_other"], MAX_MEM_TOLERANCE, TOLERANCE),
        ("--mem-slack", given["mem_slack_bytes"], MAX_MEM_SLACK, "from 0 to 2^40"),
    )
    for name, value, most, words in memory:
        if not 0 <= value <= most:  # NaN compares false with everything
            raise AttnbenchError(f"{name} {value}: accepted: a number {words}")
    from attnbench.bench.compare import Thresholds

    return Thresholds(**given)


def _write_markdown(path: Path, result: Comparison, show_all: bool) -> None:
    """Whole or not at all: a full disk leaves no partial file (and any older one as it was)."""
    from attnbench.bench.compare import markdown
    from attnbench.runtime.outputs import ensure_dir, write_text

    ensure_dir(path.parent, "folder for --markdown")
    try:
        write_text(path, markdown(result, show_all))
    except OSError as e:
        raise AttnbenchError(f"--markdown {path}: cannot write there ({e.strerror})") from None


def _print_table(result: Comparison, show_all: bool) -> None:
    table = Table(title=f"attnbench compare: {result.headline()}", caption=result.describe())
    for col in ("case", "metric", "baseline", "current", "ratio", "verdict", "note"):
        table.add_column(col, justify="right" if col == "ratio" else "left", overflow="fold")
    changes = result.shown(show_all, changes_only=True)
    for ln in changes:
        style = STYLE.get(ln.verdict, "")
        ratio = f"{ln.ratio:.3f}" if ln.ratio is not None else ""
        verdict = f"[{style}]{ln.verdict}[/{style}]" if style else ln.verdict
        cells = (ln.case, ln.metric, ln.baseline, ln.current)
        table.add_row(*map(escape, cells), ratio, verdict, escape(_detail(ln)))
    quiet = len(result.lines) - len(changes)
    if changes:
        out.print(table)
    if quiet:
        out.print(f"{quiet} more quantities unchanged or not run (--all shows them)")


def _detail(ln: Line) -> str:
    """The note, and the U test's p when it judged the quantity (``p 2e-05, U test 9+9
    rounds``; the threshold rule is named once, in a note below the table)."""
    how = f"p {ln.p_value:.2g}, {ln.test}" if ln.p_value is not None else ""
    return "; ".join(x for x in (ln.note, how) if x)


def _print_messages(result: Comparison) -> None:
    """Warnings, notes, then one line per regression on stderr (last, so that a log cut to its
    tail still says what failed)."""
    for w in result.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(w)}", soft_wrap=True)
    for n in result.notes:
        err.print(f"note: {escape(n)}", soft_wrap=True)
    for ln in result.lines:
        if ln.verdict in ("worse", "unconfirmed", "suspect"):
            ratio = f" ({ln.ratio:.3f}x)" if ln.ratio is not None else ""
            err.print(
                f"{ln.verdict}: {escape(ln.case)}: {escape(ln.metric)} {escape(ln.baseline)} -> "
                f"{escape(ln.current)}{ratio}",
                soft_wrap=True,
            )
