"""The speed results CSV: one tidy row per measured case, written and flushed as produced.

The columns are documented in the README ("Speed results: the columns"). Conventions: times in
milliseconds per call; memory in bytes; FLOPs per call; ``roofline`` = achieved FLOP/s over the
matmul rate measured in the same run; empty cells where a value does not apply (a row that did not
run has a ``status`` other than ``ok`` and a ``reason``).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from attnbench.errors import AttnbenchError

#: Every column, in order. A CSV whose header differs is not read (schema mismatch).
COLUMNS: tuple[str, ...] = (
    "suite",
    "mechanism",
    "family",
    "path",
    "path_kind",
    "params",
    "device",
    "device_name",
    "torch_version",
    "threads",
    "clock",
    "dtype",
    "batch",
    "heads",
    "kv_heads",
    "seq_len",
    "head_dim",
    "value_dim",
    "causal",
    "direction",
    "status",
    "reason",
    "time_median_ms",
    "time_p20_ms",
    "time_p80_ms",
    "samples",
    "calls_per_sample",
    "first_call_ms",
    "noisy",
    "reference",
    "ref_ratio",
    "ref_ratio_p20",
    "ref_ratio_p80",
    "tokens_per_s",
    "flops",
    "flops_method",
    "flop_per_s",
    "matmul_flop_per_s",
    "roofline",
    "mem_fwd_bytes",
    "mem_fwdbwd_bytes",
    "mem_method",
)

#: The columns that identify a case: rows of two runs with equal keys are compared.
KEY: tuple[str, ...] = (
    "mechanism",
    "path",
    "params",
    "dtype",
    "batch",
    "heads",
    "kv_heads",
    "seq_len",
    "head_dim",
    "value_dim",
    "causal",
    "direction",
)

STATUSES = ("ok", "oom", "unsupported", "error", "skipped")

_INT = ("threads", "batch", "heads", "kv_heads", "seq_len", "head_dim", "value_dim", "samples")
_INT += ("calls_per_sample", "flops", "mem_fwd_bytes", "mem_fwdbwd_bytes")
_FLOAT = ("time_median_ms", "time_p20_ms", "time_p80_ms", "first_call_ms", "ref_ratio")
_FLOAT += ("ref_ratio_p20", "ref_ratio_p80", "tokens_per_s", "flop_per_s")
_FLOAT += ("matmul_flop_per_s", "roofline")
_BOOL = ("causal", "noisy")
_TEXT = tuple(c for c in COLUMNS if c not in _INT + _FLOAT + _BOOL)


def cell(value: Any) -> str:
    """How a value is written: '' for None/NaN, true/false, 6 significant digits for floats."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def params_text(params: Mapping[str, Any]) -> str:
    """``{"tile": 256, "base": 512.0}`` -> ``base=512.0;tile=256`` (sorted, stable)."""
    items = sorted(params.items())
    return ";".join(f"{k}={cell(v) if isinstance(v, float) else v}" for k, v in items)


class ResultsWriter:
    """Appends rows to a new CSV, flushing after each one so nothing finished is ever lost."""

    def __init__(self, path: Path, append: bool = False) -> None:
        """``append``: continue an existing results file (its header is kept)."""
        self.path = path
        append = append and path.is_file() and path.stat().st_size > 0
        self._file: TextIO = path.open("a" if append else "w", newline="", encoding="utf-8")
        self._csv = csv.writer(self._file)
        if not append:
            self._csv.writerow(COLUMNS)
        self._file.flush()
        self.rows = 0

    def write(self, row: Mapping[str, Any]) -> None:
        extra = set(row) - set(COLUMNS)
        if extra:
            raise KeyError(f"not results columns: {sorted(extra)}")
        self._csv.writerow([cell(row.get(c)) for c in COLUMNS])
        self._file.flush()
        self.rows += 1

    def close(self) -> None:
        self._file.close()


def plain(x: Any) -> Any:
    """A cell read by pandas as a plain Python value: None for missing, numpy scalars unboxed."""
    if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)):
        return None
    if hasattr(x, "item"):
        return x.item()
    return x


def row_key(row: Mapping[str, Any]) -> tuple[str, ...]:
    """A row's KEY columns as written (what identifies a case across runs and resumes)."""
    return tuple(cell(row.get(c)) for c in KEY)


def sidecar_path(csv_path: Path) -> Path:
    return csv_path.with_suffix(".json")


def read_sidecar(csv_path: Path) -> dict[str, Any] | None:
    side = sidecar_path(csv_path)
    if not side.is_file():
        return None
    try:
        return json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AttnbenchError(f"{side}: not a readable JSON sidecar ({e})") from None


def read_results(path: Path | str) -> pd.DataFrame:
    """A results CSV as a DataFrame with typed columns; one-line errors for anything else."""
    path = Path(path)
    if not path.is_file():
        raise AttnbenchError(f"{path}: no such file; give a results CSV written by attnbench run")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise AttnbenchError(f"{path}: not an attnbench results CSV ({e})") from None
    if tuple(header) != COLUMNS:
        missing = [c for c in COLUMNS if c not in header]
        extra = [c for c in header if c not in COLUMNS]
        if len(missing) > len(COLUMNS) // 2:
            raise AttnbenchError(
                f"{path}: not an attnbench results CSV (its header lacks "
                f"{', '.join(missing[:4])}...)"
            )
        detail = []
        if missing:
            detail.append(f"missing {', '.join(missing)}")
        if extra:
            detail.append(f"unexpected {', '.join(extra)}")
        if not detail:
            detail.append("columns in another order")
        raise AttnbenchError(
            f"{path}: results schema differs from this attnbench ({'; '.join(detail)}); "
            "re-run the suite with this version"
        )
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise AttnbenchError(f"{path}: malformed CSV ({first})") from None
    try:
        for c in _INT:
            df[c] = pd.to_numeric(df[c].replace("", None)).astype("Int64")
        for c in _FLOAT:
            df[c] = pd.to_numeric(df[c].replace("", None)).astype("float64")
        for c in _BOOL:
            bad = ~df[c].isin(["true", "false", ""])
            if bad.any():
                raise ValueError(f"column {c} holds {df[c][bad].iloc[0]!r}")
            df[c] = df[c].map({"true": True, "false": False, "": pd.NA}).astype("boolean")
    except (ValueError, TypeError) as e:
        raise AttnbenchError(f"{path}: not an attnbench results CSV ({e})") from None
    bad_status = ~df["status"].isin(STATUSES)
    if bad_status.any():
        raise AttnbenchError(
            f"{path}: unknown status {df['status'][bad_status].iloc[0]!r}; "
            f"accepted: {', '.join(STATUSES)}"
        )
    return df
