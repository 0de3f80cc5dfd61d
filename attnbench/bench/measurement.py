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

Times. A Measurement holds raw times, each for ``number_per_run`` calls. When the run kept its
per-round samples (``samples.jsonl`` beside the CSV, named in the sidecar's ``files``: one JSON
line per case, its key columns and ``time_ms``, milliseconds per call, one per timed round), they
are the raw times, each for ``calls_per_sample`` calls (a round times a block of calls). Results
from before samples were kept, and the committed baselines, have none: only three numbers of
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
from attnbench.bench.results import (
    KEY,
    CaseSamples,
    plain,
    read_results,
    read_samples,
    read_samples_file,
    row_key,
)
from attnbench.core.errors import AttnbenchError

RECONSTRUCTED = "median, p20, p80 only (no per-round samples file): three raw times"
FROM_SAMPLES = "per-round samples"

Row = Mapping[str, Any]
Samples = dict[tuple[str, ...], list[float]]


def _int(row: Row, column: str, default: int) -> int:
    value = plain(row.get(column))
    return default if value is None else int(value)


def _warn(message: str) -> None:
    warnings.warn(
        f"{message}; using median, p20 and p80 only where samples are missing", stacklevel=5
    )


def _times(found: Mapping[tuple[str, ...], CaseSamples] | None) -> Samples:
    return {key: list(s.time_ms) for key, s in (found or {}).items()}


def _samples_beside(results_csv: Path) -> Samples:
    """The run's own samples file (the sidecar names it); an unreadable one is a warning, not an
    error (the three known times are used instead)."""
    try:
        return _times(read_samples(results_csv, warn=_warn))
    except AttnbenchError as e:
        _warn(str(e))
        return {}


def _raw_times(row: Row, samples: Samples) -> tuple[list[float], int, str]:
    """Seconds per run of ``number_per_run`` calls, that number, and where they came from."""
    calls = max(1, _int(row, "calls_per_sample", 1))
    per_call_ms = samples.get(row_key(row))
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
        found = _times(read_samples_file(Path(samples), warn=_warn))
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

    ``samples``: a samples file (``samples.jsonl``) to use (default: the run's own, if it kept
    one). ``by_family``: label each Measurement with its mechanism's family (one Compare table
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
