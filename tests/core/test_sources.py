"""Sources are cited by name: every catalogued work is on the docs' Sources page (docs/sources.md),
every mechanism has one, ``attnbench list --format json`` gives each in full, and no private
nickname is left anywhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core import sources
from attnbench.core.sources import Source
from attnbench.registry import MECHANISMS

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = [v for v in vars(sources).values() if isinstance(v, Source)]

runner = CliRunner()


def _sources_page_section() -> str:
    text = (ROOT / "docs" / "sources.md").read_text(encoding="utf-8")
    match = re.search(r"^# Sources\n(.*?)(?=^##? |\Z)", text, flags=re.M | re.S)
    assert match, "docs/sources.md has no '# Sources' section"
    return match.group(1)


def test_catalogue_is_not_empty_and_complete():
    assert len(CATALOGUE) >= 20
    for s in CATALOGUE:
        assert s.short and s.authors and s.title and s.link.startswith("https://"), s
        assert 1990 < s.year < 2100, s


def test_every_source_is_listed_on_the_sources_page():
    section = _sources_page_section()
    missing = [s.short for s in CATALOGUE if s.link not in section]
    assert not missing, f"not in docs/sources.md: {missing}"


def test_every_mechanism_has_a_catalogued_source():
    links = {s.link for s in CATALOGUE}
    for mech in MECHANISMS:
        assert mech.sources, f"{mech.name} has no source"
        for s in mech.sources:
            assert s.link in links, f"{mech.name}: {s.short} is not in attnbench.core.sources"


def test_list_json_gives_every_source_in_full():
    result = runner.invoke(app, ["list", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    by_name = {row["name"]: row for row in rows}
    assert set(by_name) == {m.name for m in MECHANISMS}
    for mech in MECHANISMS:
        listed = by_name[mech.name]["sources"]
        assert len(listed) == len(mech.sources) >= 1, mech.name
        for got, want in zip(listed, mech.sources, strict=True):
            for key in ("authors", "title", "year", "link"):
                assert got[key] == getattr(want, key), (mech.name, key)


#: Private names of source documents that a reader cannot look up.
PRIVATE = re.compile(r"seed 00[0-9]|FIELD-NOTES|\.\./shared")


def test_no_private_source_names():
    files = [ROOT / "README.md", ROOT / "mkdocs.yml", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("attnbench", "tests"):
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file()]
    hits = []
    for path in files:
        if path.name == "test_sources.py" or "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary data (the compressed corpus)
        for number, line in enumerate(text.splitlines(), 1):
            if PRIVATE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "\n".join(hits)
