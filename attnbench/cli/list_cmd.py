"""``attnbench list``: the registry as a table, JSON or CSV."""

from __future__ import annotations

import csv
import json
import sys
from enum import Enum
from typing import Annotated, Any

import torch
import typer
from rich.table import Table

from attnbench import registry
from attnbench.cli.common import out
from attnbench.spec import Mechanism


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


def describe(mech: Mechanism, device: str) -> dict[str, Any]:
    """One registry entry as plain data, with each path's availability on ``device``."""
    return {
        "name": mech.name,
        "aliases": list(mech.aliases),
        "family": mech.family,
        "description": mech.description,
        "source": mech.source,
        "sources": [s.plain() for s in mech.sources],
        "time": mech.time,
        "memory": mech.memory,
        "causal": mech.causal,
        "bidirectional": mech.bidirectional,
        "backward": mech.backward,
        "dtypes": [str(d).removeprefix("torch.") for d in mech.dtypes],
        "params": {p.name: _plain(p.default) for p in mech.params},
        "params_text": {p.name: p.text(p.default) for p in mech.params},
        "extra_inputs": [e.name for e in mech.extra_inputs],
        "paths": [
            {
                "name": p.name,
                "kind": p.kind,
                "memory": p.memory,
                "available": p.unavailable(device) is None,
                "reason": p.unavailable(device) or "",
            }
            for p in mech.paths
        ],
    }


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def _paths_cell(entry: dict[str, Any]) -> str:
    cells = []
    for p in entry["paths"]:
        label = p["name"] if p["name"] == p["kind"] else f"{p['name']} ({p['kind']})"
        cells.append(label if p["available"] else f"[dim]{label}: {p['reason']}[/dim]")
    return "\n".join(cells)


def list_mechanisms(
    format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    family: Annotated[str | None, typer.Option(help="Only this family.")] = None,
) -> None:
    """List every registered mechanism: family, source, complexity, parameters and paths.

    Paths that cannot run on this machine are shown with the reason.

    Example: [bold]attnbench list --format json[/bold]
    """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mechs = [m for m in registry.MECHANISMS if family is None or m.family == family]
    if family is not None and not mechs:
        from attnbench.errors import unknown

        raise unknown("family", family, registry.families())
    entries = [describe(m, device) for m in mechs]
    if format is Format.json:
        json.dump(entries, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if format is Format.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(
            [
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
            ]
        )
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
                        p["name"] + ("" if p["available"] else f" [{p['reason']}]")
                        for p in e["paths"]
                    ),
                ]
            )
        return
    table = Table(
        title=f"attnbench mechanisms ({len(entries)}; paths checked for {device})", show_lines=True
    )
    for col in (
        "name",
        "family",
        "description",
        "source",
        "complexity",
        "causal / bidir",
        "params",
        "paths",
    ):
        table.add_column(col, overflow="fold")
    for e in entries:
        table.add_row(
            e["name"] + "".join(f"\n[dim]alias {a}[/dim]" for a in e["aliases"]),
            e["family"],
            e["description"],
            e["source"],
            f"time {e['time']}\nmemory {e['memory']}",
            f"{'yes' if e['causal'] else 'no'} / {'yes' if e['bidirectional'] else 'no'}",
            "\n".join(f"{k}={v}" for k, v in e["params_text"].items()) or "-",
            _paths_cell(e),
        )
    out.print(table)
