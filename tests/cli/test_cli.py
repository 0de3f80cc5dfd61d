"""The command line: version, help with an example, ``list`` in every format."""

from __future__ import annotations

import csv
import io
import json

from typer.testing import CliRunner

from attnbench import __version__, registry
from attnbench.cli import app

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and __version__ in result.stdout


def test_no_args_shows_help():
    result = runner.invoke(app, [])
    assert "list" in result.output and "run" in result.output


def test_every_command_help_has_an_example():
    for name in (
        "list",
        "check",
        "show",
        "plot",
        "compare",
        "run speed",
        "run extrapolate",
        "run entropy",
    ):
        result = runner.invoke(app, [*name.split(), "--help"])
        assert result.exit_code == 0
        assert "Example" in result.output, name


def test_list_json_has_every_mechanism_and_path():
    result = runner.invoke(app, ["list", "--format", "json"])
    assert result.exit_code == 0
    entries = json.loads(result.stdout)
    assert [e["name"] for e in entries] == registry.names()
    for entry in entries:
        mech = registry.get(entry["name"])
        assert [p["name"] for p in entry["paths"]] == mech.path_names
        for p in entry["paths"]:
            assert p["available"] == (p["reason"] == "")
        assert entry["params"] == json.loads(json.dumps(mech.defaults))  # tuples as lists


def test_list_csv_and_table():
    result = runner.invoke(app, ["list", "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["name"] for r in rows] == registry.names()
    table = runner.invoke(app, ["list"])
    assert table.exit_code == 0
    for name in registry.names():
        assert name in table.stdout


def test_list_family_filter():
    result = runner.invoke(app, ["list", "--format", "json", "--family", "softmax"])
    assert {e["family"] for e in json.loads(result.stdout)} == {"softmax"}


def test_check_command_passes_for_every_mechanism():
    for mech in registry.MECHANISMS:
        args = ["check", mech.name, "--n", "17", "--dtype", "float64"]
        if not mech.bidirectional:
            args.append("--causal")
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
