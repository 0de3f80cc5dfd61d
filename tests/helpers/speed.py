"""Tiny speed suites: CPU, a few short lengths, a fast timing policy; as a record (:func:`tiny`)
or as a file (tests/fixtures/tiny-suite.toml, and variants of it: :func:`tiny_suite_file`)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from attnbench.bench.config import SpeedSuite
from attnbench.measure.timing import TimingPolicy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: One warm-up call and two rounds: enough to run the timing code, not to measure anything.
FAST = TimingPolicy(
    warmup_calls=1, warmup_s=0.0, rounds=2, min_rounds=2, block_s=0.0, group_budget_s=1.0
)


def tiny(**changes) -> SpeedSuite:
    """A CPU suite of two short lengths and the reference and efficient paths; ``changes``
    replaces any field."""
    base = SpeedSuite(
        name="tiny",
        device="cpu",
        lengths=(16, 32),
        heads=2,
        head_dims=(8,),
        threads=1,
        timing=FAST,
        matmul_size=32,
        # The softmax family's fused SDPA paths need CUDA; they are checked in their own test.
        path_kinds=("reference", "efficient"),
    )
    return replace(base, **changes)


#: The tiny suite as a file, shared by the tests that run a suite from a file.
TINY_SUITE = Path(__file__).resolve().parent.parent / "fixtures" / "tiny-suite.toml"


def tiny_suite_file(folder: Path, name: str = "tiny.toml", **sections: dict[str, Any]) -> Path:
    """The tiny suite file, written to ``folder / name`` with ``sections`` over it: ``grid={...}``
    replaces those keys of ``[grid]`` (a value of None removes the key: the suite's default); a
    top-level key as ``top={"name": ...}``."""
    data = tomllib.loads(TINY_SUITE.read_text(encoding="utf-8"))
    for section, changes in sections.items():
        table = data if section == "top" else data.setdefault(section, {})
        for key, value in changes.items():
            if value is None:
                table.pop(key, None)
            else:
                table[key] = value
    path = folder / name
    path.write_text(_toml(data), encoding="utf-8")
    return path


def _toml(data: dict[str, Any]) -> str:
    """A suite's data as TOML (top-level keys, then one table per section)."""
    lines = [f"{key} = {_value(v)}" for key, v in data.items() if not isinstance(v, dict)]
    for section, table in data.items():
        if isinstance(table, dict):
            lines += [f"[{section}]", *(f"{key} = {_value(v)}" for key, v in table.items())]
    return "\n".join(lines) + "\n"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return repr(value)
