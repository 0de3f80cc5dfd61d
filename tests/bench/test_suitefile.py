"""Suite files: the shipped ones parse, and every mistake names its key and line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnbench.bench.config import load_suite
from attnbench.bench.suite_keys import SuiteFile
from attnbench.core.errors import AttnbenchError
from attnbench.runtime.schema import keys
from attnbench.runtime.tomlconfig import SUITES_DIR, Lines, find_suite

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_suites_parse_and_exist_once():
    names = sorted(p.name for p in SUITES_DIR.glob("*.toml"))
    assert {"speed.toml", "ci.toml", "speed-gpu.toml"} <= set(names)
    for name in names:
        suite = load_suite(name.removesuffix(".toml"))
        assert suite.name == name.removesuffix(".toml")
    assert find_suite("speed") == SUITES_DIR / "speed.toml"
    # The checkout's top-level suites/ is the shipped folder itself, not a copy to keep in sync.
    top = ROOT / "suites"
    assert top.resolve() == SUITES_DIR.resolve(), "suites/ must link to attnbench/data/suites"


def write(tmp_path, text: str) -> str:
    path = tmp_path / "mine.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("[grid]\nlengths = [256,\n", 2, ["malformed TOML"]),
        ('name = "x"\n[grid]\nlenghts = [256]\n', 3, ["key 'grid.lenghts'", "'grid.lengths'"]),
        ("[grid]\n\nlengths = [0, 256]\n", 3, ["lengths = [0, 256]", "integers from 1 to"]),
        ("[grid]\nlengths = [4294967296]\n", 2, ["lengths = [4294967296]", "to 2147483647"]),
        ("[grid]\ncausal = true\n", 2, ["causal = True", "a non-empty list of true/false"]),
        ('[grid]\nmechanisms = ["sofmax"]\n', 2, ["unknown mechanism 'sofmax'", "softmax"]),
        ('[grid]\nmechanisms = ["softmax:fast"]\n', 2, ["no path 'fast'"]),
        ("[timing]\nrounds = 2\nmin_rounds = 3\n", 3, ["min_rounds = 3 exceeds rounds = 2"]),
        ("[limits]\nmax_len = { refrence = 512 }\n", 2, ["max_len", "path kinds"]),
        ("[speed]\nx = 1\n", 1, ["unknown section [speed]"]),
        ('[params.softmax-logn]\nbase = "x"\n', 1, ["base", "a number > 1, or e"]),
        ("[params.nope]\nk = 1\n", 1, ["unknown mechanism 'nope'"]),
        ("[shape]\nhidden = 100\nhead_dims = [64]\n", 2, ["not divisible by head_dim 64"]),
        ('[timing]\norder = "random"\n', 2, ["order", "rotate, fixed, reversed, shuffle"]),
    ],
)
def test_suite_errors_name_the_key_and_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(AttnbenchError) as info:
        load_suite(path)
    message = str(info.value)
    assert "\n" not in message
    assert f"line {line}" in message, message
    for word in words:
        assert word in message, message


def test_lines_finds_dotted_inline_and_table_keys():
    lines = Lines("a = 1\n[t]\nb.c = 2\nd = { e = 3, f = 4 }\n[[arr]]\ng = 5\n")
    assert lines.line(("a",)) == 1
    assert lines.line(("t", "b", "c")) == 3
    assert lines.line(("t", "d", "f")) == 4
    assert lines.line(("t", "zzz")) == 2  # falls back to the enclosing table
    assert lines.line(("arr", "g")) == 6


def test_missing_suite_names_are_errors():
    with pytest.raises(AttnbenchError, match="unknown suite 'sped'.*did you mean 'speed'"):
        find_suite("sped")
    with pytest.raises(AttnbenchError, match="does not exist"):
        find_suite("no/such/file.toml")


def test_docs_document_every_suite_key():
    page = (ROOT / "docs" / "speed.md").read_text(encoding="utf-8")
    section = page[page.index("## Speed suite files") :]
    for key, _ in keys(SuiteFile):  # every key of every table of the schema
        if key == ("params",):
            continue  # documented as [params.NAME]
        assert re.search(rf"`{re.escape(key[-1])}`", section), f"speed.md lacks {'.'.join(key)}"


def test_timing_order_is_read_from_the_suite(tmp_path):
    assert load_suite(write(tmp_path, "[timing]\n")).timing.order == "rotate"
    assert load_suite(write(tmp_path, '[timing]\norder = "fixed"\n')).timing.order == "fixed"
