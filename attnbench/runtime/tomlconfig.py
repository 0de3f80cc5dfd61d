"""Config files: the one way attnbench reads TOML that users edit (speed suites and
extrapolation presets), found by name or path, then read key by key into frozen dataclasses by
:func:`attnbench.runtime.schema.read_section`.

Every error names the file, the line and the key, and says what is accepted (``tomllib`` reports
the line of a syntax error but not of a key it parsed, so :class:`Lines` finds key lines itself).
``--set SECTION.FIELD=VALUE`` (:func:`parse_settings`) is merged over a file's data before it is
read (:meth:`SuiteText.with_settings`), so a value set there is checked like the file's and an
error about it names the option instead of a line.

Lookup of ``--suite NAME`` / ``--preset NAME``: a path that exists is used as is; a bare name
``speed`` is ``speed.toml`` in the folder shipped inside the package (``attnbench/data/suites/``,
presets in its ``extrapolate/`` subfolder, the GPU checks' suites in ``gpu/``, named
``gpu/flex``). Each default file exists once; the checkout's top-level ``suites/`` is a link to
that folder.
"""

from __future__ import annotations

import copy
import hashlib
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
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


def find_config(name: str, folder: Path, what: str, names: list[str] | None = None) -> Path:
    """A config file from a path or a bare name looked up in ``folder`` (``what``: ``suite`` or
    ``preset``, for messages; ``names``: the shipped names, default :func:`names_in`). A name
    may name a subfolder's file (``gpu/flex``)."""
    names = names_in(folder) if names is None else names
    given = Path(name).expanduser()
    if given.is_file():
        return given
    if name in names:
        return folder / f"{name}.toml"
    if given.suffix == ".toml" or "/" in name or "\\" in name:
        raise AttnbenchError(
            f"{what} file {name} does not exist or is not a file; give a .toml file or a {what} "
            f"name ({', '.join(names)})"
        )
    raise unknown(what, name, names)


#: Subfolders of SUITES_DIR whose files are speed suites too, named ``FOLDER/NAME``.
SUITE_SUBFOLDERS = ("gpu",)


def suite_names() -> list[str]:
    """Every shipped speed suite's name: ``speed``, ``ci``..., then ``gpu/flex``..."""
    return names_in(SUITES_DIR) + [
        f"{sub}/{stem}" for sub in SUITE_SUBFOLDERS for stem in names_in(SUITES_DIR / sub)
    ]


def find_suite(name: str) -> Path:
    """A speed suite file from a path or a bare name (see the module docstring)."""
    return find_config(name, SUITES_DIR, "suite", suite_names())


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

    def has(self, path: tuple[str, ...]) -> bool:
        """Whether ``path`` itself is written in the text (a key or a table header)."""
        return path in self._lines

    def line(self, path: tuple[str, ...]) -> int | None:
        """The line of ``path``, else of its closest enclosing key or table."""
        for end in range(len(path), 0, -1):
            if path[:end] in self._lines:
                return self._lines[path[:end]]
        return None


@dataclass(frozen=True)
class SuiteText:
    """A parsed config file: its data, where its keys are, its hash for the sidecar, and the
    keys set on the command line over it (:meth:`with_settings`)."""

    path: Path | None
    data: dict[str, Any]
    lines: Lines
    sha256: str
    #: Key -> the option that set it (``--set train.lr=3e-4``): errors about it name that.
    given: Mapping[tuple[str, ...], str] = field(default_factory=dict)

    @classmethod
    def command_line(cls, data: dict[str, Any]) -> SuiteText:
        """Data from no file (a config built in code), to read with settings over it."""
        return cls(None, data, Lines(""), "")

    def is_given(self, key: tuple[str, ...]) -> bool:
        """Whether ``key`` was set on the command line (its text is read by the field's type)."""
        return key in self.given

    def error(self, key: tuple[str, ...], message: str) -> AttnbenchError:
        """``FILE line L: message``, or ``--set KEY=VALUE: message`` for a key set on the
        command line (or inside a table set there)."""
        for end in range(len(key), 0, -1):
            if key[:end] in self.given:
                return AttnbenchError(f"{self.given[key[:end]]}: {message}")
        inside = [label for k, label in self.given.items() if k[: len(key)] == key]
        if inside and not self.lines.has(key):  # a table only the command line wrote into
            return AttnbenchError(f"{inside[-1]}: {message}")
        line = self.lines.line(key)
        where = [str(self.path)] if self.path is not None else []
        where += [f"line {line}"] if line else []
        return AttnbenchError(f"{' '.join(where)}: {message}" if where else message)

    def with_settings(self, settings: Sequence[Setting]) -> SuiteText:
        """The data with each setting merged in at its key (tables created as needed), in
        order, before anything is checked."""
        data = copy.deepcopy(self.data)
        given = dict(self.given)
        for s in settings:
            table = data
            for end in range(1, len(s.key)):
                table = table.setdefault(s.key[end - 1], {})
                if not isinstance(table, dict):
                    raise AttnbenchError(
                        f"{s.label}: {'.'.join(s.key[:end])} is not a table; "
                        "accepted: SECTION.FIELD=VALUE"
                    )
            table[s.key[-1]] = s.value
            given[s.key] = s.label
        return replace(self, data=data, given=given)


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
# Settings from the command line: --set SECTION.FIELD=VALUE
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One value set on the command line: where (``("train", "lr")``), the value (text, read
    by the field's type, see :func:`attnbench.runtime.schema.from_text`; or a value given by a
    typed option) and the words that set it, which name it in errors (``--set train.lr=3e-4``)."""

    key: tuple[str, ...]
    value: Any
    label: str


def parse_settings(
    items: Sequence[str] | None, option: str = "--set", example: str = "timing.rounds=5"
) -> list[Setting]:
    """``["timing.rounds=5", "grid.dtypes=bf16,fp16"]`` -> settings, in order (a later one
    wins); an item that is not ``SECTION.FIELD=VALUE`` is an error naming it."""
    out = []
    for item in items or []:
        name, sep, value = item.partition("=")
        key = tuple(part.strip() for part in name.split("."))
        if not sep or not all(key):
            raise AttnbenchError(
                f"{option} {item!r} is not SECTION.FIELD=VALUE (e.g. {option} {example})"
            )
        out.append(Setting(key, value.strip(), f"{option} {'.'.join(key)}={value.strip()}"))
    return out
