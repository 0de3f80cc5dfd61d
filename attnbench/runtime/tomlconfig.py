"""Config files: the one way attnbench reads TOML that users edit (speed suites and
extrapolation presets), found by name or path, validated key by key into frozen dataclasses.

Every error names the file, the line and the key, and says what is accepted (``tomllib`` reports
the line of a syntax error but not of a key it parsed, so :class:`Lines` finds key lines itself).

Lookup of ``--suite NAME`` / ``--preset NAME``: a path that exists is used as is; a bare name
``speed`` is ``speed.toml`` in the folder shipped inside the package (``attnbench/data/suites/``,
presets in its ``extrapolate/`` subfolder). Each default file exists once; the checkout's
top-level ``suites/`` is a link to that folder.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbench.core.errors import AttnbenchError, unknown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # attnbench/
#: The shipped speed suites; presets of the extrapolation experiment in ``extrapolate/``.
SUITES_DIR = PACKAGE_DIR / "data" / "suites"
PRESETS_DIR = SUITES_DIR / "extrapolate"


def names_in(folder: Path) -> list[str]:
    """The config names (file stems) shipped in ``folder``, sorted."""
    return sorted(f.stem for f in folder.glob("*.toml"))


def find_config(name: str, folder: Path, what: str) -> Path:
    """A config file from a path or a bare name looked up in ``folder`` (``what``: ``suite`` or
    ``preset``, for messages)."""
    given = Path(name).expanduser()
    if given.is_file():
        return given
    if given.suffix == ".toml" or "/" in name or "\\" in name:
        raise AttnbenchError(
            f"{what} file {name} does not exist or is not a file; give a .toml file or a {what} "
            f"name ({', '.join(names_in(folder))})"
        )
    f = folder / f"{name}.toml"
    if f.is_file():
        return f
    raise unknown(what, name, names_in(folder))


def available_suites() -> list[str]:
    return names_in(SUITES_DIR)


def find_suite(name: str) -> Path:
    """A speed suite file from a path or a bare name (see the module docstring)."""
    return find_config(name, SUITES_DIR, "suite")


# --------------------------------------------------------------------------------------------
# Line numbers of keys
# --------------------------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*\[\[?\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")
_NAME = r"""(?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*')"""
_KEY = re.compile(rf"^\s*({_NAME}(?:\s*\.\s*{_NAME})*)\s*=")
_INLINE_KEY = re.compile(rf"[{{,]\s*({_NAME})\s*=")


def _split_key(text: str) -> tuple[str, ...]:
    parts = re.findall(r"""[A-Za-z0-9_\-]+|"[^"]*"|'[^']*'""", text)
    return tuple(p.strip("\"'") for p in parts)


class Lines:
    """Where each key of a TOML text is defined: ``line(("timing", "rounds"))`` -> 7."""

    def __init__(self, text: str) -> None:
        self._lines: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        for number, raw in enumerate(text.splitlines(), start=1):
            header = _HEADER.match(raw)
            if header:
                table = _split_key(header.group(1))
                self._lines.setdefault(table, number)
                continue
            key = _KEY.match(raw)
            if key:
                full = table + _split_key(key.group(1))
                self._lines.setdefault(full, number)
                rest = raw[key.end() :]
                for inner in _INLINE_KEY.finditer(rest):
                    self._lines.setdefault(full + _split_key(inner.group(1)), number)

    def line(self, path: tuple[str, ...]) -> int | None:
        """The line of ``path``, else of its closest enclosing key or table."""
        for end in range(len(path), 0, -1):
            if path[:end] in self._lines:
                return self._lines[path[:end]]
        return None


@dataclass(frozen=True)
class SuiteText:
    """A parsed suite file: its data, where its keys are, and its hash for the sidecar."""

    path: Path
    data: dict[str, Any]
    lines: Lines
    sha256: str

    def error(self, key: tuple[str, ...], message: str) -> AttnbenchError:
        line = self.lines.line(key)
        where = f"{self.path}" + (f" line {line}" if line else "")
        return AttnbenchError(f"{where}: {message}")


def load(path: Path, what: str = "suite") -> SuiteText:
    """Read and parse a TOML config file; syntax errors name the line and column."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise AttnbenchError(f"cannot read {what} file {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError:
        raise AttnbenchError(f"{path}: not UTF-8 text; a {what} file is TOML") from None
    except tomllib.TOMLDecodeError as e:
        raise AttnbenchError(_syntax_error(path, text, str(e))) from None
    return SuiteText(path, data, Lines(text), hashlib.sha256(raw).hexdigest())


def _syntax_error(path: Path, text: str, message: str) -> str:
    """``FILE line L: malformed TOML: WHAT (column C)``; at the end of the document, the line of
    the bracket or brace left open, which is where the mistake usually is."""
    at = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if at:
        what = message[: at.start()]
        return f"{path} line {at.group(1)}: malformed TOML: {what} (column {at.group(2)})"
    what = re.sub(r"\s*\(at end of document\)$", "", message)
    line = _unclosed_line(text)
    where = f" line {line}" if line else ""
    return f"{path}{where}: malformed TOML: {what} at the end of the file (is a bracket open?)"


def _unclosed_line(text: str) -> int | None:
    """The line of the first ``[`` or ``{`` never closed (strings and comments skipped)."""
    stack: list[int] = []
    quote = ""
    for number, line in enumerate(text.splitlines(), start=1):
        i = 0
        while i < len(line):
            ch = line[i]
            if quote:
                if ch == "\\" and quote == '"':
                    i += 1
                elif ch == quote:
                    quote = ""
            elif ch in "\"'":
                quote = ch
            elif ch == "#":
                break
            elif ch in "[{":
                stack.append(number)
            elif ch in "]}" and stack:
                stack.pop()
            i += 1
    return stack[0] if stack else None


# --------------------------------------------------------------------------------------------
# Key schemas
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """One accepted key of a suite table: its type, default, meaning (for the README) and check.

    ``kind``: ``str``, ``int``, ``float``, ``bool``, ``list[str]``, ``list[int]``,
    ``list[bool]``, ``table[int]`` (names to integers), or ``table`` (free, checked by the caller).
    """

    kind: str
    default: Any
    doc: str
    accepted: str = ""
    valid: Callable[[Any], bool] | None = None


def _is(kind: str, value: Any) -> bool:
    scalar = {
        "str": lambda v: isinstance(v, str),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
    }
    if kind in scalar:
        return scalar[kind](value)
    if kind.startswith("list["):
        inner = kind[5:-1]
        return isinstance(value, list) and all(scalar[inner](v) for v in value)
    if kind == "table[int]":
        return isinstance(value, dict) and all(scalar["int"](v) for v in value.values())
    if kind == "table":
        return isinstance(value, dict)
    raise ValueError(kind)


_KIND_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "list[str]": "a list of strings",
    "list[int]": "a list of integers",
    "list[bool]": "a list of true/false",
    "table[int]": "a table of integers",
    "table": "a table",
}


def read_table(
    suite: SuiteText,
    table: Mapping[str, Any],
    schema: Mapping[str, Key],
    where: tuple[str, ...],
) -> dict[str, Any]:
    """Validate ``table`` against ``schema``; returns every key, defaults filled in."""
    label = f"[{'.'.join(where)}] " if where else ""
    for key in table:
        if key not in schema:
            err = unknown(f"key in {label.strip() or 'the top level'}", key, list(schema))
            raise suite.error((*where, key), str(err))
    out = {}
    for key, spec in schema.items():
        if key not in table:
            out[key] = spec.default
            continue
        value = table[key]
        accepted = spec.accepted or _KIND_WORDS[spec.kind]
        if not _is(spec.kind, value):
            raise suite.error(
                (*where, key), f"{label}{key} = {value!r} is not accepted; accepted: {accepted}"
            )
        if spec.kind == "float":
            value = float(value)
        if spec.valid is not None and not spec.valid(value):
            raise suite.error(
                (*where, key), f"{label}{key} = {value!r} is not accepted; accepted: {accepted}"
            )
        out[key] = value
    return out
