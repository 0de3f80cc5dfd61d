"""attnbench results as ``torch.utils.benchmark.Measurement`` objects.

So that ``torch.utils.benchmark.Compare`` prints attnbench's timings beside a user's own::

    from torch.utils import benchmark
    from attnbench.bench.measurement import to_measurements

    ours = to_measurements("runs/speed/x/results.csv")
    mine = benchmark.Timer(
        "my_attention(q, k, v)", globals={...}, label="attention",
        sub_label=ours[0].sub_label, description="mine", num_threads=ours[0].num_threads,
    ).blocked_autorange()
    benchmark.Compare([*ours, mine]).print()

Each ``ok`` row becomes one Measurement: ``label`` "attention" (or the mechanism's family with
``by_family=True``: one table per family), ``sub_label`` the case's shape
(``fwd causal n=1024 float32 B=1 H=4 D=32``: Compare's rows), ``description`` the mechanism, path
and parameters (``local:efficient(window=64)``: Compare's columns), ``num_threads`` the row's
torch thread count, ``env`` left unset so that a user's own Measurements share the rows.

Times. A Measurement holds raw times, each for ``number_per_run`` calls. When a per-round samples
file lies beside the results CSV (``samples.csv`` or ``<stem>.samples.csv``: the KEY columns and
``time_ms``, milliseconds per call, one row per timed round), its samples are the raw times, each
for ``calls_per_sample`` calls (a round times a block of calls). Otherwise only three numbers of
the distribution are known: the median and the 20th and 80th percentiles. They are used as three
raw times (so the Measurement's median is the CSV's median exactly) and
``metadata["times"]`` says so; the Measurement's IQR is then (p80 - p20) / 2 (the quartiles of
three points), not the rounds' IQR. No sample is invented.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from torch.utils.benchmark import Measurement
from torch.utils.benchmark.utils.common import TaskSpec

from attnbench.bench.export import case_impl, case_shape
from attnbench.bench.results import KEY, cell, plain, read_results
from attnbench.errors import AttnbenchError

#: Where a samples file may lie, relative to the results CSV.
SAMPLE_FILES = ("samples.csv", "{stem}.samples.csv")
#: The per-call time column of a samples file (milliseconds), in order of preference.
SAMPLE_TIME_COLUMNS = ("time_ms", "sample_ms")
RECONSTRUCTED = "median, p20, p80 only (no per-round samples file): three raw times"
FROM_SAMPLES = "per-round samples"

Row = Mapping[str, Any]
Samples = dict[tuple[str, ...], list[float]]


def _int(row: Row, column: str, default: int) -> int:
    value = plain(row.get(column))
    return default if value is None else int(value)


def find_samples_file(results_csv: Path) -> Path | None:
    for pattern in SAMPLE_FILES:
        candidate = results_csv.with_name(pattern.format(stem=results_csv.stem))
        if candidate.is_file():
            return candidate
    return None


def read_samples(path: Path) -> Samples:
    """Per-call times in ms by case key, from a samples CSV (KEY columns + time_ms)."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise AttnbenchError(f"{path}: not a readable samples CSV ({e})") from None
    missing = [c for c in KEY if c not in frame.columns]
    column = next((c for c in SAMPLE_TIME_COLUMNS if c in frame.columns), None)
    if missing or column is None:
        lacks = missing + ([] if column else [" or ".join(SAMPLE_TIME_COLUMNS)])
        raise AttnbenchError(f"{path}: not an attnbench samples CSV (it lacks {', '.join(lacks)})")
    samples: Samples = {}
    for record in frame.to_dict("records"):
        key = tuple(str(record[c]) for c in KEY)
        try:
            samples.setdefault(key, []).append(float(record[column]))
        except ValueError:
            raise AttnbenchError(f"{path}: {column} holds {record[column]!r}") from None
    return samples


def _samples_beside(results_csv: Path) -> Samples:
    """The samples file found beside a results CSV; unreadable ones are a warning, not an
    error (the three known times are used instead)."""
    path = find_samples_file(results_csv)
    if path is None:
        return {}
    try:
        return read_samples(path)
    except AttnbenchError as e:
        warnings.warn(f"{e}; using median, p20 and p80 only", stacklevel=4)
        return {}


def case_key(row: Row) -> tuple[str, ...]:
    """A row's KEY cells as the CSV writes them (how a samples file names its case)."""
    return tuple(cell(plain(row.get(c))) for c in KEY)


def _raw_times(row: Row, samples: Samples) -> tuple[list[float], int, str]:
    """Seconds per run of ``number_per_run`` calls, that number, and where they came from."""
    calls = max(1, _int(row, "calls_per_sample", 1))
    per_call_ms = samples.get(case_key(row))
    how = FROM_SAMPLES
    if not per_call_ms:
        per_call_ms = [row["time_p20_ms"], row["time_median_ms"], row["time_p80_ms"]]
        how = RECONSTRUCTED
    return [float(ms) * 1e-3 * calls for ms in per_call_ms], calls, how


def _stmt(row: Row) -> str:
    params = plain(row.get("params")) or ""
    args = "".join(f", {p}" for p in params.split(";") if p)
    call = (
        f'attention("{row["mechanism"]}", q, k, v, causal={bool(plain(row.get("causal")))}, '
        f'path="{row["path"]}"{args})'
    )
    return call if row["direction"] == "fwd" else f"{call}  # + backward of every input"


def _setup(row: Row) -> str:
    return (
        f"q, k, v: [B={_int(row, 'batch', 0)}, H={_int(row, 'heads', 0)}, "
        f"T={_int(row, 'seq_len', 0)}, D={_int(row, 'head_dim', 0)}] {row['dtype']} "
        f"on {row.get('device') or '?'}"
    )


def row_measurement(row: Row, samples: Samples, label: str | None = "attention") -> Measurement:
    """One ok row as a Measurement (``label=None``: the mechanism's family)."""
    raw, calls, how = _raw_times(row, samples)
    spec = TaskSpec(
        stmt=_stmt(row),
        setup=_setup(row),
        label=label if label is not None else str(row["family"]),
        sub_label=case_shape(row),
        description=case_impl(row),
        env=None,
        num_threads=max(1, _int(row, "threads", 1)),
    )
    metadata = {c: plain(row.get(c)) for c in (*KEY, "device", "device_name", "suite", "clock")}
    metadata["times"] = how
    return Measurement(number_per_run=calls, raw_times=raw, task_spec=spec, metadata=metadata)


def _frame_and_samples(
    results: Path | str | pd.DataFrame, samples: Path | str | None
) -> tuple[pd.DataFrame, Samples]:
    if isinstance(results, pd.DataFrame):
        missing = [c for c in (*KEY, "status", "family", "time_median_ms") if c not in results]
        if missing:
            raise AttnbenchError(f"not attnbench results (no column {', '.join(missing)})")
        frame = results
        found = {}
    else:
        frame = read_results(results)
        found = _samples_beside(Path(results)) if samples is None else {}
    if samples is not None:
        found = read_samples(Path(samples))
    return frame, found


def to_measurements(
    results: Path | str | pd.DataFrame,
    *,
    samples: Path | str | None = None,
    by_family: bool = False,
    label: str = "attention",
) -> list[Measurement]:
    """Every ok row of a results CSV (or of the DataFrame ``read_results`` gives) as a
    ``torch.utils.benchmark.Measurement``, for ``torch.utils.benchmark.Compare``.

    ``samples``: a per-round samples CSV to use (default: the one beside the results CSV, if
    any). ``by_family``: label each Measurement with its mechanism's family (one Compare table
    per family) instead of ``label``.
    """
    frame, found = _frame_and_samples(results, samples)
    rows = frame[frame["status"] == "ok"].to_dict("records")
    if not rows:
        raise AttnbenchError("no ok rows in the results: nothing was measured")
    return [row_measurement(r, found, None if by_family else label) for r in rows]


def measurements_frame(measurements: Sequence[Measurement]) -> pd.DataFrame:
    """Measurements made by :func:`to_measurements` back as rows: the key columns, and the
    median and times in ms per call (what a round trip keeps)."""
    records = []
    for m in measurements:
        meta = dict(m.metadata or {})
        records.append(
            {
                **{c: meta.get(c) for c in KEY},
                "label": m.label,
                "time_median_ms": m.median * 1e3,
                "times_ms": [t * 1e3 for t in m.times],
                "times": meta.get("times"),
            }
        )
    return pd.DataFrame.from_records(records)
