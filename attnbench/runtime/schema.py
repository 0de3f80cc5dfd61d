"""Config schemas: frozen dataclasses whose fields' type hints say what a config accepts.

One schema language for both experiments' files (speed suites, extrapolation presets). A section
of a file is a frozen dataclass; each field's type hint is what the key accepts (``str``,
``int``, ``float``, ``bool``, ``Literal["a", "b"]`` for a choice, ``tuple[int, ...]`` or
``list[str]`` for a list, ``dict[str, int]`` for a table, ``X | None``, ``Any``, or another
dataclass for a sub-table) and :func:`setting` adds its documentation, an optional rule
(:class:`Rule`: ``at_least(1)``, ``within(1, 2**31 - 1)``) and the words of what is accepted::

    @dataclass(frozen=True)
    class Shape(Checked):
        batch: int = setting(1, "batch size B", valid=at_least(1))  # "an integer >= 1"
        head_dims: tuple[int, ...] = setting((64,), "head dimensions D", valid=at_least(1),
                                             non_empty=True)

:func:`read_section` reads a TOML table into such a dataclass: unknown keys (with the closest
known ones), wrong types and refused values are one-line errors that name the file, the line and
the key (``suite.toml line 7: timing.rounds = 0 is not accepted; accepted: an integer >= 1``),
or, for a key set on the command line, the option that set it (``--set timing.rounds=0: ...``).
A :class:`Checked` dataclass checks the same on every construction, so a config built in code
is held to the file's rules; a check across fields is the class's own ``__post_init__``, which
raises :class:`Invalid` naming the field to point at.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

from attnbench.core.errors import AttnbenchError
from attnbench.runtime.tomlconfig import MAX_NESTING, nesting

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from attnbench.runtime.tomlconfig import SuiteText

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# Declaring a field
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A check of a value (of each item of a list, of each value of a table) and the words
    that say what passes, appended to the type's (``"an integer"`` + ``">= 1"``)."""

    test: Callable[[Any], bool]
    words: str

    def __call__(self, value: Any) -> bool:
        return bool(self.test(value))


def at_least(low: float) -> Rule:
    return Rule(lambda x: x >= low, f">= {low}")


def above(low: float) -> Rule:
    return Rule(lambda x: x > low, f"> {low}")


def within(low: float, high: float) -> Rule:
    """``low <= x <= high``."""
    return Rule(lambda x: low <= x <= high, f"from {low} to {high}")


def above_up_to(low: float, high: float) -> Rule:
    """``low < x <= high`` (finite, as every bounded rule)."""
    return Rule(lambda x: low < x <= high, f"> {low} and <= {high}")


def inside(low: float, high: float) -> Rule:
    """``low < x < high`` (an open interval)."""
    return Rule(lambda x: low < x < high, f"in ({low}, {high})")


def finite(rule: Rule) -> Rule:
    """``rule`` and not inf or nan (``x >= 0`` passes inf, which trains to NaN)."""
    return Rule(lambda x: math.isfinite(x) and rule(x), f"{rule.words} and finite")


def setting(
    default: Any = MISSING,
    doc: str = "",
    *,
    accepted: str = "",
    valid: Callable[[Any], bool] | None = None,
    non_empty: bool = False,
) -> Any:
    """A dataclass field with what a config file needs to know about it.

    ``doc``: its meaning (for the documentation); ``valid``: a :class:`Rule` (or any predicate,
    then ``accepted`` is required), applied to each item of a list and each value of a table;
    ``accepted``: the words of what is accepted, when the type's and the rule's are not right;
    ``non_empty``: a list or table must have an item. A default that is a list, a dict or a
    dataclass type is a fresh copy (an instance of the type) for every instance."""
    if valid is not None and not isinstance(valid, Rule) and not accepted:
        raise TypeError("setting(valid=<a plain predicate>) needs accepted= words")
    meta = {"doc": doc, "accepted": accepted, "valid": valid, "non_empty": non_empty}
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=meta)
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class Invalid(AttnbenchError):
    """A value a dataclass refuses, naming the field to point at (its line in a file)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class Checked:
    """Base of a schema dataclass: every construction checks each field against its type and
    :func:`setting` (:func:`check_fields`). A check across fields extends ``__post_init__``
    (``super().__post_init__()`` first) and raises :class:`Invalid`."""

    def __post_init__(self) -> None:
        check_fields(self)


def check_fields(obj: Any) -> None:
    """Raise :class:`Invalid` for the first field of dataclass ``obj`` that its type or its
    rule refuses (a list may be a tuple here: a config built in code)."""
    hints = type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not _fits(hints[f.name], value) or not _valid(hints[f.name], f, value):
            words = accepted_words(hints[f.name], f) + _beyond_int64(value)
            raise Invalid(f.name, f"{f.name} = {shown(value)} is not accepted; accepted: {words}")


# --------------------------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------------------------


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional(hint: Any) -> Any:
    """``X | None`` -> X; any other hint as is."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _is_seq(hint: Any) -> bool:
    return typing.get_origin(hint) in (tuple, list, Sequence)


def _is_map(hint: Any) -> bool:
    return typing.get_origin(hint) in (dict, Mapping)


def _item(hint: Any) -> Any:
    return typing.get_args(hint)[0]


def _is_table(hint: Any) -> bool:
    """A sub-table read into its own dataclass."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _fits(hint: Any, value: Any) -> bool:
    """Whether ``value`` has the type ``hint`` (no rule)."""
    if value is None:
        return _optional(hint) is not hint or hint is Any
    hint = _optional(hint)
    if hint is Any:
        return True
    if typing.get_origin(hint) is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(hint))
    if _is_seq(hint):
        return isinstance(value, (list, tuple)) and all(_fits(_item(hint), v) for v in value)
    if _is_map(hint):
        key, item = typing.get_args(hint)
        return isinstance(value, Mapping) and all(
            _fits(key, k) and _fits(item, v) for k, v in value.items()
        )
    if _is_table(hint):
        return isinstance(value, hint)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:  # a 64-bit integer: what torch and the OS take (a larger one overflows)
        return isinstance(value, int) and not isinstance(value, bool) and _int64(value)
    return isinstance(value, hint)


def _int64(value: int) -> bool:
    return -(2**63) <= value < 2**63


def _valid(hint: Any, f: dataclasses.Field, value: Any) -> bool:
    """Whether ``value`` (of the right type) passes the field's rule and ``non_empty``."""
    if value is None:
        return True
    hint = _optional(hint)
    items = value if _is_seq(hint) else value.values() if _is_map(hint) else [value]
    if f.metadata.get("non_empty") and not items:
        return False
    rule = f.metadata.get("valid")
    return rule is None or all(rule(v) for v in items)


_PLURAL = {str: "strings", int: "integers", float: "numbers", bool: "true/false"}
_SINGULAR = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _words(hint: Any) -> str:
    hint = _optional(hint)
    if typing.get_origin(hint) is Literal:
        return ", ".join(map(str, typing.get_args(hint)))
    if _is_seq(hint) or _is_map(hint):
        item = _optional(_item(hint) if _is_seq(hint) else typing.get_args(hint)[1])
        kind = "a list" if _is_seq(hint) else "a table"
        if typing.get_origin(item) is Literal:
            return f"{kind} from {_words(item)}"
        return f"{kind} of {_PLURAL.get(item, 'tables' if _is_map(item) else 'values')}"
    if _is_table(hint):
        return "a table"
    return _SINGULAR.get(hint, "a value")


def accepted_words(hint: Any, f: dataclasses.Field) -> str:
    """What the field accepts, in words: its ``accepted``, else the type's words, ``non-empty``
    and the rule's words (``a non-empty list of integers >= 1``)."""
    if f.metadata.get("accepted"):
        return f.metadata["accepted"]
    words = _words(hint)
    if f.metadata.get("non_empty"):
        words = re.sub(r"^a (list|table)", r"a non-empty \1", words)
    rule = f.metadata.get("valid")
    return f"{words} {rule.words}" if isinstance(rule, Rule) else words


def shown(value: Any, width: int = 60) -> str:
    """``value``'s repr for a one-line message, cut to about ``width`` characters."""
    text = repr(value)
    return text if len(text) <= width else f"{text[: width - 15]}... ({len(text)} characters)"


def _beyond_int64(value: Any) -> str:
    """What the words of an integer field leave unsaid, for a value beyond 64 bits."""
    if isinstance(value, int) and not isinstance(value, bool) and not _int64(value):
        return " (a 64-bit integer: below 2**63)"
    return ""


def keys(cls: type, where: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dataclasses.Field]]:
    """Every key a schema accepts, sub-tables walked into: ``[(("timing", "rounds"), field)]``
    (a table of sub-tables, like ``[variants.NAME]``, is one key)."""
    hints = type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if _is_table(hints[f.name]):
            out.extend(keys(hints[f.name], (*where, f.name)))
        else:
            out.append(((*where, f.name), f))
    return out


# --------------------------------------------------------------------------------------------
# Reading a table
# --------------------------------------------------------------------------------------------


def dotted(key: Sequence[str]) -> str:
    return ".".join(key)


def read_section(text: SuiteText, table: Any, cls: type[T], where: tuple[str, ...] = ()) -> T:
    """``table`` (the part of ``text.data`` at ``where``) read into ``cls``: unknown keys, wrong
    types and refused values are errors naming the file and line (or the option) and the key;
    missing keys take the field's default; sub-tables are read into their dataclasses."""
    if not isinstance(table, Mapping):
        raise text.error(where, f"{dotted(where)} = {table!r} is not accepted; accepted: a table")
    hints = type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in table:
        if key not in fields:
            raise text.error((*where, key), _unknown(where, key, table[key], fields, hints))
    values = {}
    for name, f in fields.items():
        if name in table:
            values[name] = _read(text, hints[name], f, table[name], (*where, name))
        elif f.default is MISSING and f.default_factory is MISSING:
            label = f"[{dotted(where)}] " if where else ""
            raise text.error(where, f"{label}needs {name} ({accepted_words(hints[name], f)})")
    try:
        return cls(**values)
    except Invalid as e:  # a check across fields: the section in brackets, as it is in the file
        label = f"[{dotted(where)}] " if where else ""
        raise text.error((*where, e.field), f"{label}{e}") from None


def _unknown(where: tuple[str, ...], key: str, value: Any, fields: Mapping, hints: Mapping) -> str:
    """``unknown key 'grid.lenghts' (did you mean 'grid.lengths'?); known: ...``, or for a table
    at the top level ``unknown section [modle] (did you mean [model]?); known: ...``."""
    if not where and isinstance(value, Mapping):
        tables = [n for n in fields if _is_table(hints[n]) or _is_map(hints[n])]
        close = difflib.get_close_matches(key, tables, n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(f'[{c}]' for c in close)}?)" if close else ""
        known = [f"[{n}]" if _is_table(hints[n]) else f"[{n}.NAME]" for n in tables]
        return f"unknown section [{key}]{hint}; known: {', '.join(known)}"
    known = [dotted((*where, n)) for n in fields]
    close = difflib.get_close_matches(key, list(fields), n=3, cutoff=0.5)
    hint = (
        f" (did you mean {', '.join(repr(dotted((*where, c))) for c in close)}?)" if close else ""
    )
    return f"unknown key {dotted((*where, key))!r}{hint}; known: {', '.join(known)}"


def _read(text: SuiteText, hint: Any, f: dataclasses.Field, value: Any, key: tuple) -> Any:
    """One key's value, checked and converted to the field's type (a list to a tuple for a
    ``tuple[...]`` field, an integer to a float for a ``float`` one)."""
    if isinstance(value, str) and text.is_given(key):
        value = from_text(hint, value)
    inner = _optional(hint)
    if _is_table(inner):
        return read_section(text, value, inner, key)
    if _is_map(inner) and _is_table(table := typing.get_args(inner)[1]):  # [variants.NAME]
        if not isinstance(value, Mapping):
            raise _refused(text, hint, f, value, key, key)
        return {k: read_section(text, v, table, (*key, k)) for k, v in value.items()}
    if _is_map(inner) and isinstance(value, Mapping):  # point at the entry that is refused
        for k, v in value.items():
            if not _fits(inner, {k: v}) or not _valid(inner, f, {k: v}):
                raise _refused(text, hint, f, value, key, (*key, k))
    if not _fits(hint, value) or not _valid(hint, f, value):
        raise _refused(text, hint, f, value, key, key)
    return _convert(hint, value)


def _refused(
    text: SuiteText, hint: Any, f: dataclasses.Field, value: Any, key: tuple, at: tuple
) -> AttnbenchError:
    words = accepted_words(hint, f) + _beyond_int64(value)
    return text.error(at, f"{dotted(key)} = {shown(value)} is not accepted; accepted: {words}")


def _convert(hint: Any, value: Any) -> Any:
    hint = _optional(hint)
    if value is None or hint is Any:
        return value
    if _is_seq(hint):
        items = [_convert(_item(hint), v) for v in value]
        return tuple(items) if typing.get_origin(hint) is tuple else items
    if _is_map(hint):
        return {k: _convert(typing.get_args(hint)[1], v) for k, v in value.items()}
    if hint is float:
        return float(value)
    return value


# --------------------------------------------------------------------------------------------
# Values written on the command line
# --------------------------------------------------------------------------------------------


def toml_value(text: str) -> Any:
    """``text`` read as a TOML value (``5``, ``3e-4``, ``true``, ``["O", "E"]``, ``{ a = 1 }``,
    ``"quoted"``); the text itself when it is not one (``cuda:1``)."""
    if "\n" in text:
        return text
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # a value nested thousands deep: text
        return text
    return text if nesting(value) > MAX_NESTING else value


def from_text(hint: Any, text: str) -> Any:
    """Command-line text read by the field's type: a TOML value (``5``, ``3e-4``, ``true``,
    ``["O", "E"]``, ``{ reference = 1024 }``); a string as written (quotes optional); a list
    also comma-separated (``O,E``; ``none`` or nothing: the empty list)."""
    hint = _optional(hint)
    if hint is str or (typing.get_origin(hint) is Literal) or hint is Any:
        value = toml_value(text) if text[:1] in "\"'" else text
        return value if isinstance(value, str) else text
    if _is_seq(hint) and not text.lstrip().startswith("["):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if [t.lower() for t in items] == ["none"]:
            return []
        return [from_text(_item(hint), t) for t in items]
    return toml_value(text)


# --------------------------------------------------------------------------------------------
# Two configs compared
# --------------------------------------------------------------------------------------------


def key_difference(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> str:
    """``'steps 3000 -> 100, heads 2 -> 4'``: what differs between two configs as plain data
    (tables walked into; a key one of them lacks is ``None`` there). Empty when none does.
    What a resumed run says when it refuses to continue another config's work."""
    diffs = []
    for name in sorted(set(saved) | set(wanted)):
        a, b = saved.get(name), wanted.get(name)
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            diffs.append(key_difference(a, b))
        else:
            diffs.append(f"{name} {a!r} -> {b!r}")
    return ", ".join(diffs)
