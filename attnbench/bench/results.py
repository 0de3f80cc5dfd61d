"""The speed results CSV: one tidy row per measured case, written and flushed as produced.

The columns are documented in docs/speed.md ("Speed results: the columns"). Conventions: times in
milliseconds per call; memory in bytes; FLOPs per call; ``roofline`` = achieved FLOP/s over the
matmul rate measured in the same run; empty cells where a value does not apply (a row that did not
run has a ``status`` other than ``ok`` and a ``reason``).

Beside the CSV, the *samples file* (``samples.jsonl``, named in the sidecar's ``files``) keeps
what the medians were taken from: one JSON line per measured case, written and flushed with its
row, holding the case's key columns and its per-round samples (``time_ms``; ``ref_ratio``, the
time over the reference's in the same round; ``matmul_ratio``, over the matmul timed in the same
round). ``attnbench compare`` tests these samples (:mod:`attnbench.bench.compare`).

A run killed while writing leaves a half-written last line; both readers drop it with a warning
(it is not data), and both writers cut it off before appending (``--resume``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.core.errors import AttnbenchError
from attnbench.runtime import logs
from attnbench.runtime.outputs import atomic_open

#: The inference shapes' columns (decoding and packed batches), empty in other rows.
INFERENCE_COLUMNS: tuple[str, ...] = (
    "query_len",
    "varlen",
    "packing",
    "state_bytes",
    "bytes_moved",
    "bytes_per_s",
    "copy_bytes_per_s",
    "bandwidth_fraction",
)
#: Key columns added since results were first committed (empty in older files' rows).
ADDED_KEY: tuple[str, ...] = ("query_len", "varlen", "packing")

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
    "l2",
    "graph",
    "graph_reason",
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
    "flops_fa",
    "flop_per_s_fa",
    "roofline_fa",
    "flops_executed",
    "flop_per_s_executed",
    *INFERENCE_COLUMNS,
    "mem_fwd_bytes",
    "mem_fwdbwd_bytes",
    "mem_method",
)

#: Columns added after results were first committed: a CSV whose header lacks only these (in
#: COLUMNS' order otherwise) is an older attnbench's, read with them empty.
ADDED_COLUMNS: tuple[str, ...] = (
    "flops_fa",
    "flop_per_s_fa",
    "flops_executed",
    "flop_per_s_executed",
    "l2",
    "graph",
    "graph_reason",
    "roofline_fa",
    *INFERENCE_COLUMNS,
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
    *ADDED_KEY,
)

STATUSES = ("ok", "oom", "unsupported", "error", "skipped")

#: The samples file beside the results CSV (its name is also in the sidecar's ``files``).
SAMPLES_NAME = "samples.jsonl"

#: Receives one-line warnings from the readers (a half-written last line that was dropped).
Warn = Callable[[str], None]

_INT = ("threads", "batch", "heads", "kv_heads", "seq_len", "head_dim", "value_dim", "samples")
_INT += ("calls_per_sample", "flops", "mem_fwd_bytes", "mem_fwdbwd_bytes")
_INT += ("flops_fa", "flops_executed", "query_len", "state_bytes", "bytes_moved")
_FLOAT = ("time_median_ms", "time_p20_ms", "time_p80_ms", "first_call_ms", "ref_ratio")
_FLOAT += ("ref_ratio_p20", "ref_ratio_p80", "tokens_per_s", "flop_per_s")
_FLOAT += ("matmul_flop_per_s", "roofline", "flop_per_s_fa", "flop_per_s_executed")
_FLOAT += ("roofline_fa",)
_FLOAT += ("bytes_per_s", "copy_bytes_per_s", "bandwidth_fraction")
_BOOL = ("causal", "noisy", "graph")
_TEXT = tuple(c for c in COLUMNS if c not in _INT + _FLOAT + _BOOL)


#: How results CSVs are read: UTF-8, less the byte-order mark a spreadsheet saves in front of
#: the header (Excel's "CSV UTF-8"), which would otherwise make the first column ``\ufeffsuite``.
CSV_ENCODING = "utf-8-sig"


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


def cut_unterminated_line(path: Path) -> None:
    """Truncate a file after its last newline: a line a killed run left half-written."""
    with path.open("rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


class LineFile:
    """A file that grows by whole lines: each line is written and reaches the OS at once
    (unbuffered), or, when the write fails (a full disk), what it wrote of the line is cut off
    again and an AttnbenchError names the file and the cause; the lines before stay intact."""

    def __init__(self, path: Path, append: bool) -> None:
        self.path = path
        self.lines = 0
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        try:
            self._fd: int | None = os.open(path, flags, 0o644)
        except OSError as e:
            raise AttnbenchError(f"cannot write {path}: {e.strerror or e}") from None

    def write(self, line: str) -> None:
        if self._fd is None:
            raise AttnbenchError(f"{self.path} is closed")
        data = line.encode("utf-8")
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
            kept = f"; the {self.lines} lines before are intact" if self.lines else ""
            raise AttnbenchError(f"cannot write {self.path}: {e.strerror or e}{kept}") from None
        self.lines += 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def csv_line(cells: Sequence[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer).writerow(cells)
    return buffer.getvalue()


class ResultsWriter:
    """Appends rows to a new CSV, each one reaching the OS as it is written, so nothing
    finished is ever lost (and a failed write leaves no half row: :class:`LineFile`)."""

    def __init__(self, path: Path, append: bool = False) -> None:
        """``append``: continue an existing results file (its header is kept; a half-written
        last row is cut off first)."""
        self.path = path
        append = append and path.is_file() and path.stat().st_size > 0
        if append:
            cut_unterminated_line(path)
            _widen_older_header(path)
        else:  # the header whole or not at all: a full disk leaves no empty results file
            with atomic_open(path, "w", encoding="utf-8", newline="") as f:
                f.write(csv_line(COLUMNS))
        self._file = LineFile(path, append=True)
        self.rows = 0

    def write(self, row: Mapping[str, Any]) -> None:
        self._file.write(_row_line(row))
        self.rows += 1

    def close(self) -> None:
        self._file.close()


def _row_line(row: Mapping[str, Any]) -> str:
    extra = set(row) - set(COLUMNS)
    if extra:
        raise KeyError(f"not results columns: {sorted(extra)}")
    return csv_line([cell(row.get(c)) for c in COLUMNS])


def results_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """A whole results CSV, header and rows, as :class:`ResultsWriter` writes it: for a file
    written at once, whole or not at all (``attnbench merge``)."""
    return "".join([csv_line(COLUMNS), *(_row_line(row) for row in rows)])


def _older_header(header: Sequence[str]) -> bool:
    """Whether ``header`` is an older attnbench's: COLUMNS less some of ADDED_COLUMNS."""
    return tuple(header) == tuple(c for c in COLUMNS if c in header) and not (
        set(COLUMNS) - set(header) - set(ADDED_COLUMNS)
    )


def _widen_older_header(path: Path) -> None:
    """Rewrite a results CSV written before ADDED_COLUMNS existed with today's header (the new
    cells empty), so that a resumed run appends rows of the same width."""
    text = path.read_text(encoding=CSV_ENCODING)
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows or tuple(rows[0]) == COLUMNS or not _older_header(rows[0]):
        return
    where = {name: i for i, name in enumerate(rows[0])}
    lines = [csv_line(COLUMNS)]
    for row in rows[1:]:
        lines.append(csv_line([row[where[c]] if c in where else "" for c in COLUMNS]))
    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        f.write("".join(lines))


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


def files_read(csv_path: Path) -> list[Path]:
    """The files a command reading the results CSV ``csv_path`` reads: the CSV, its sidecar and
    its samples file (what none of its outputs may be written over)."""
    return [csv_path, sidecar_path(csv_path), csv_path.parent / SAMPLES_NAME]


def read_sidecar(csv_path: Path) -> dict[str, Any] | None:
    side = sidecar_path(csv_path)
    if not side.is_file():
        return None
    try:
        return json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AttnbenchError(f"{side}: not a readable JSON sidecar ({e})") from None


def _without_incomplete_last_row(path: Path, text: str, warn: Warn, width: int) -> str:
    """``text`` less a last row that a killed run left half-written: unterminated, or with
    another number of fields than the header."""
    body = text.split("\n", 1)[1] if "\n" in text else ""
    if not body.strip():
        return text
    if not text.endswith("\n"):
        cut = text.rfind("\n") + 1
        why = "has no line end"
    else:
        last = text.rstrip("\r\n").rsplit("\n", 1)[-1]
        fields = next(csv.reader([last]), [])
        if len(fields) == width:
            return text
        cut = text.rstrip("\r\n").rfind("\n") + 1
        why = f"has {len(fields)} fields, not {width}"
    warn(f"{path}: the last row {why} (a run stopped while writing it?): dropped, not read")
    return text[:cut]


def read_results(path: Path | str, warn: Warn = logs.warn) -> pd.DataFrame:
    """A results CSV as a DataFrame with typed columns; one-line errors for anything else.
    A half-written last row is dropped, and ``warn`` told."""
    path = Path(path)
    if not path.is_file():
        raise AttnbenchError(f"{path}: no such file; give a results CSV written by attnbench run")
    try:
        text = path.read_bytes().decode(CSV_ENCODING)
        header = next(csv.reader(io.StringIO(text, newline="")), [])
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise AttnbenchError(f"{path}: not an attnbench results CSV ({e})") from None
    older = tuple(header) != COLUMNS and _older_header(header)
    if tuple(header) != COLUMNS and not older:
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
    text = _without_incomplete_last_row(path, text, warn, width=len(header))
    try:
        df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise AttnbenchError(f"{path}: malformed CSV ({first})") from None
    if older:  # an older attnbench's file: the columns added since are empty
        df = df.reindex(columns=list(COLUMNS), fill_value="")
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


# --------------------------------------------------------------------------------------------
# The samples file
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseSamples:
    """One case's per-round samples: times (ms per call) and the same-round ratios to the
    reference (None without one) and to the matmul."""

    time_ms: tuple[float, ...]
    ref_ratio: tuple[float, ...] | None = None
    matmul_ratio: tuple[float, ...] | None = None


def _rounded(values: Sequence[float] | None) -> list[float] | None:
    return None if values is None else [float(f"{v:.6g}") for v in values]


class SamplesWriter:
    """Appends one JSON line per measured case (its key columns and per-round samples),
    flushing after each one, as :class:`ResultsWriter` does for rows."""

    def __init__(self, path: Path, append: bool = False) -> None:
        self.path = path
        append = append and path.is_file()
        if append:
            cut_unterminated_line(path)
        self._file = LineFile(path, append)

    def write(self, row: Mapping[str, Any], samples: CaseSamples) -> None:
        record = {c: row.get(c) for c in KEY}
        record.update(
            time_ms=_rounded(samples.time_ms),
            ref_ratio=_rounded(samples.ref_ratio),
            matmul_ratio=_rounded(samples.matmul_ratio),
        )
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._file.close()


def samples_path(csv_path: Path) -> Path | None:
    """The samples file the sidecar names (beside the CSV); None when it names none."""
    side = read_sidecar(csv_path)
    name = ((side or {}).get("files") or {}).get("samples")
    return csv_path.parent / name if name else None


def _floats(record: Mapping[str, Any], name: str) -> tuple[float, ...] | None:
    values = record.get(name)
    if values is None:
        return None
    if not isinstance(values, list) or not all(isinstance(v, int | float) for v in values):
        raise ValueError(f"{name} is not a list of numbers")
    return tuple(float(v) for v in values)


def _case_samples(record: Any) -> tuple[tuple[str, ...], CaseSamples]:
    if not isinstance(record, dict) or any(c not in record for c in KEY if c not in ADDED_KEY):
        raise ValueError("not an object with the results' key columns")
    times = _floats(record, "time_ms")
    if not times:
        raise ValueError("no time_ms samples")
    samples = CaseSamples(times, _floats(record, "ref_ratio"), _floats(record, "matmul_ratio"))
    return row_key(record), samples


def read_samples(
    csv_path: Path, warn: Warn = logs.warn
) -> dict[tuple[str, ...], CaseSamples] | None:
    """The per-round samples of a results CSV by case key (:func:`row_key`); None when it has
    no samples file (older results, the committed baselines). A half-written last line is
    dropped, and ``warn`` told."""
    path = samples_path(csv_path)
    if path is None or not path.is_file():
        return None
    return read_samples_file(path, warn)


def read_samples_file(path: Path, warn: Warn = logs.warn) -> dict[tuple[str, ...], CaseSamples]:
    """The per-round samples in a samples file (``samples.jsonl``) by case key."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise AttnbenchError(f"{path}: not a readable samples file ({e})") from None
    lines = text.split("\n")
    if lines[-1].strip():
        warn(f"{path}: the last line has no line end (a run stopped while writing it?): dropped")
    out: dict[tuple[str, ...], CaseSamples] = {}
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            key, samples = _case_samples(json.loads(line))
        except ValueError as e:
            raise AttnbenchError(f"{path}:{number}: not an attnbench samples line ({e})") from None
        out[key] = samples
    return out
