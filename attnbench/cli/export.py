"""``attnbench export RESULTS.csv --to github-benchmark|bencher``: results for dashboards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnbench.cli.common import Choice, fail


class Target(Choice):
    """``--to``: the dashboard format: github-action-benchmark's custom tools, or the Bencher
    Metric Format (for ``bencher run --adapter json``)."""

    github_benchmark = "github-benchmark"
    bencher = "bencher"

    @classmethod
    def bad_value(cls, option: str, value: object) -> str:
        from attnbench.core.errors import unknown

        return str(unknown("--to target", str(value), list(cls.values())))


def export_cmd(
    results: Annotated[Path, typer.Argument(help="A results CSV from attnbench run speed.")],
    to: Annotated[
        Target | None,
        typer.Option(
            "--to",
            help="github-benchmark (github-action-benchmark's custom tools) or bencher "
            "(Bencher Metric Format, for bencher run --adapter json).",
        ),
    ] = None,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            help="time (default), throughput, memory, roofline, flop-rate, flop-rate-fa, "
            "flop-rate-executed, ref-ratio; repeatable or comma-separated.",
        ),
    ] = None,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="Write the JSON here (default: stdout).")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an --out file that is already there.")
    ] = False,
) -> None:
    """Export the ok rows of a results CSV as JSON for continuous-benchmarking dashboards.

    One benchmark per case, named from its key columns (mechanism:path, params, shape, n).

    github-benchmark: one direction per file; throughput, roofline, flop rates: bigger is better.

    Example: [bold]attnbench export runs/ci/results.csv --to bencher --metric time,memory[/bold]
    """
    from attnbench.bench.export import export_text, github_tool, parse_metrics
    from attnbench.bench.results import files_read
    from attnbench.runtime.outputs import ensure_dir, os_error_words, refuse_to_replace, write_text

    if to is None:
        raise fail("--to is required: github-benchmark or bencher")
    if out_file is not None:
        refuse_to_replace(
            [out_file], option="--out", inputs=files_read(results), overwrite=overwrite
        )
        ensure_dir(out_file.parent, "folder for --out", create=False)  # before any reading
    metrics = list(metric or ["time"])
    text = export_text(results, to.value, metrics)
    if out_file is None:
        typer.echo(text, nl=False)
    else:
        ensure_dir(out_file.parent, "folder for --out")
        try:
            write_text(out_file, text)  # whole or not at all: a full disk leaves no half file
        except OSError as e:
            raise fail(f"cannot write {out_file}: {os_error_words(e)}") from None
        typer.echo(f"wrote {out_file}", err=True)
    if to is Target.github_benchmark:
        tool = github_tool(parse_metrics(metrics))
        typer.echo(f"github-action-benchmark: tool: '{tool}'", err=True)
