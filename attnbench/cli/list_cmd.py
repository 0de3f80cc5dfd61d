"""``attnbench list``: the registry as a table, JSON or CSV."""

from __future__ import annotations

import csv
import json
import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from attnbench.cli.common import Choice, out, short_reason


class Format(Choice):
    """``--format``: a table for people, JSON or CSV for programs."""

    table = "table"
    json = "json"
    csv = "csv"


def _paths_cell(entry: dict[str, Any]) -> str:
    """The paths that run here on one line; those that cannot, folded by reason into one more."""
    here = [p["name"] for p in entry["paths"] if p["available"]]
    by_reason: dict[str, list[str]] = {}
    for p in entry["paths"]:
        if not p["available"]:
            by_reason.setdefault(short_reason(p["reason"]), []).append(p["name"])
    lines = [", ".join(here) or "[yellow]none here[/yellow]"]
    for reason, names in by_reason.items():
        lines.append(f"[dim]not here ({reason}): {', '.join(names)}[/dim]")
    return "\n".join(lines)


#: From this terminal width the table has description and source columns (always in
#: ``--format json|csv``); below ``TABLE`` columns each mechanism is a short block of lines.
WIDE = 140
TABLE = 110


def _directions(e: dict[str, Any]) -> str:
    both = e["causal"] and e["bidirectional"]
    return "causal + bidir" if both else ("causal only" if e["causal"] else "bidir only")


def print_blocks(entries: list[dict[str, Any]], device: str) -> None:
    """Narrow terminals: a few lines per mechanism, wrapped at words, no table borders."""
    out.print(f"[bold]attnbench mechanisms[/bold] ({len(entries)}; paths checked for {device})")
    for e in entries:
        alias = f" (alias {', '.join(e['aliases'])})" if e["aliases"] else ""
        out.print(
            f"\n[bold]{e['name']}[/bold]{alias} · {e['family']} · {_directions(e)} · "
            f"time {e['time']}, memory {e['memory']}"
        )
        params = ", ".join(f"{k}={v}" for k, v in e["params_text"].items()) or "-"
        out.print(f"  params: {params}")
        out.print("  paths: " + _paths_cell(e).replace("\n", "; "))
    out.print("\n[dim]descriptions and sources: attnbench list --format json[/dim]")


def list_mechanisms(
    format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    family: Annotated[
        str | None, typer.Option(help="Only this family (see the family column); default all.")
    ] = None,
) -> None:
    """List every registered mechanism: family, source, complexity, parameters and paths.

    Paths that cannot run on this machine are shown with the reason. Reads a cached
    description of the registry, rebuilt after any change to it (no torch import: about 0.3 s).

    Example: [bold]attnbench list --format json[/bold]
    """
    from attnbench.cli import catalogue
    from attnbench.core import capabilities

    device = "cuda" if capabilities.cuda_available() else "cpu"
    every = catalogue.entries(device)
    entries = [e for e in every if family is None or e["family"] == family]
    if family is not None and not entries:
        from attnbench.core.errors import unknown

        raise unknown("family", family, list(dict.fromkeys(e["family"] for e in every)))
    if format is Format.json:
        json.dump(entries, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif format is Format.csv:
        write_csv(entries)
    elif out.width < TABLE:
        print_blocks(entries, device)
    else:
        print_table(entries, device)


#: ``--format csv``'s columns.
CSV_COLUMNS = (
    "name",
    "family",
    "description",
    "source",
    "time",
    "memory",
    "causal",
    "bidirectional",
    "params",
    "paths",
)


def write_csv(entries: list[dict[str, Any]]) -> None:
    """One row per mechanism on stdout; params and paths joined by ``;``, an unavailable path
    followed by its reason in brackets."""
    writer = csv.writer(sys.stdout)
    writer.writerow(CSV_COLUMNS)
    for e in entries:
        writer.writerow(
            [
                e["name"],
                e["family"],
                e["description"],
                e["source"],
                e["time"],
                e["memory"],
                e["causal"],
                e["bidirectional"],
                ";".join(f"{k}={v}" for k, v in e["params_text"].items()),
                ";".join(
                    p["name"] + ("" if p["available"] else f" [{p['reason']}]") for p in e["paths"]
                ),
            ]
        )


def print_table(entries: list[dict[str, Any]], device: str) -> None:
    """Terminals of at least ``TABLE`` columns: one table row per mechanism (from ``WIDE``
    columns, with its description and sources)."""
    wide = out.width >= WIDE
    table = Table(
        title=f"attnbench mechanisms ({len(entries)}; paths checked for {device})",
        caption=None if wide else "description and sources: attnbench list --format json",
        show_lines=True,
    )
    columns = ["name", "family", "time / memory", "directions", "params", "paths"]
    if wide:
        columns[2:2] = ["description", "sources"]
    for col in columns:
        table.add_column(col, overflow="fold", no_wrap=col in ("name", "family"))
    for e in entries:
        cells = {
            "name": e["name"] + "".join(f"\n[dim]alias {a}[/dim]" for a in e["aliases"]),
            "family": e["family"],
            "description": e["description"],
            "sources": e["source"],
            "time / memory": f"{e['time']}\n{e['memory']}",
            "directions": _directions(e),
            "params": "\n".join(f"{k}={v}" for k, v in e["params_text"].items()) or "-",
            "paths": _paths_cell(e),
        }
        table.add_row(*(cells[c] for c in columns))
    out.print(table)
