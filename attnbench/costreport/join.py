"""The join: each extrapolation row at each evaluated length n, its accuracy over seeds beside
the cost per token, at the same n, of the registry path that computes its attention.

Accuracy: the mean over seeds and its 95 % t-interval, mean +- t_{0.975, k-1} s / sqrt(k)
(Student's t, s the sample standard deviation of the k seeds; no interval with one seed); a
count row (kind ``baseline``, no seed) is its single value and becomes the floor, not a point.

Cost: the speed CSV's median time of one call of that path in ``direction`` (``fwd``: inference
at length n) times the route's factor, divided by the call's batch x n tokens; its peak memory in
that direction likewise per token. Only bidirectional cases (the model is an encoder). Where the
CSV holds the case at several shapes, the one at the model's shape is taken; a case measured at
another shape (heads, head dim, dtype) than the model's layer runs is said once per mismatch.

A row that cannot be joined (no mapping, no measurement at n, a measurement that did not run, no
accuracy) is listed with why, never dropped. The Pareto front, per machine and n: the points no
other point beats on both accuracy (higher) and time per token (lower).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
from scipy import stats

from attnbench.core.errors import AttnbenchError
from attnbench.costreport.mapping import Context, Cost, Row, Unmapped, cost_of
from attnbench.costreport.tables import Extrapolation, Model, Speed

LEVEL = 0.95
DIRECTIONS = ("fwd", "fwdbwd")
#: The speed CSV's peak-memory column for each direction.
MEMORY_COLUMN = {"fwd": "mem_fwd_bytes", "fwdbwd": "mem_fwdbwd_bytes"}


@dataclass(frozen=True)
class Accuracy:
    """Mean accuracy (%) and its 95 % t-interval over ``seeds`` seeds (NaN bounds with fewer
    than two; ``seeds`` 0 for a count row, which has none)."""

    mean: float
    low: float
    high: float
    seeds: int

    def text(self) -> str:
        """``62.87 [62.50, 63.24]``; ``54.50`` without an interval."""
        if math.isnan(self.low):
            return f"{self.mean:.2f}"
        return f"{self.mean:.2f} [{self.low:.2f}, {self.high:.2f}]"


def accuracy_interval(values: Sequence[float], seeded: bool = True) -> Accuracy:
    """Mean and 95 % Student-t interval of per-seed accuracies (``seeded=False``: a count row's
    value(s), no interval and no seeds)."""
    xs = [float(v) for v in values]
    k = len(xs)
    mean = sum(xs) / k
    nan = float("nan")
    if not seeded or k < 2:
        return Accuracy(mean, nan, nan, k if seeded else 0)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (k - 1))
    half = float(stats.t.ppf(0.5 + LEVEL / 2, k - 1)) * sd / math.sqrt(k)
    return Accuracy(mean, mean - half, mean + half, k)


def per_token(value: float, batch: int, n: int) -> float:
    """A call's time or memory divided by the tokens it processed, batch x n."""
    return value / (batch * n)


def pareto_flags(times: Sequence[float], accuracies: Sequence[float]) -> list[bool]:
    """Per point: on the front (no other point at most as slow and at least as accurate, and
    better in one of the two)? Equal points are both on it."""
    points = list(zip(times, accuracies, strict=True))

    def beaten(t: float, a: float) -> bool:
        return any(u <= t and b >= a and (u < t or b > a) for u, b in points)

    return [not beaten(t, a) for t, a in points]


@dataclass(frozen=True)
class Point:
    """One row at one length on one machine, joined: its accuracy and its cost."""

    variant: str
    kind: str
    eval_len: int
    accuracy: Accuracy
    cost: Cost
    machine: str
    measured: dict[str, Any]  # the speed row's batch, heads, head_dim, dtype, time, memory
    time_per_token_ns: float
    memory_per_token_bytes: float
    pareto: bool = False


@dataclass(frozen=True)
class Floor:
    """A count row (no model, no attention) at one length: the level a model must beat."""

    variant: str
    eval_len: int
    accuracy: Accuracy


@dataclass(frozen=True)
class NotJoined:
    """A row left out at ``eval_len`` (None: at every length), and why."""

    variant: str
    eval_len: int | None
    reason: str


@dataclass(frozen=True)
class Report:
    """Everything the report writes: joined points, floors, what was left out and why, and
    the shape mismatches between the speed cases and the model."""

    model: Model
    direction: str
    lengths: tuple[int, ...]
    machines: tuple[str, ...]
    costs: dict[str, Cost]
    points: tuple[Point, ...]
    floors: tuple[Floor, ...]
    not_joined: tuple[NotJoined, ...]
    mismatches: tuple[str, ...]


def build_report(extrapolation: Extrapolation, speed: Speed, direction: str = "fwd") -> Report:
    """Join ``extrapolation``'s rows with ``speed``'s cases (see the module docstring)."""
    model, table = extrapolation.model, extrapolation.rows
    context = Context(model.train_len, model.local_window, model.rerope_window, model.heads,
                      model.head_dim, model.layers)  # fmt: skip
    cases = _cases(speed.rows, direction)
    machines = tuple(dict.fromkeys(speed.rows["device_name"]))
    lengths = tuple(sorted({int(n) for n in table["eval_len"]}))
    costs: dict[str, Cost] = {}
    points: list[Point] = []
    floors: list[Floor] = []
    left: list[NotJoined] = []
    mismatches: dict[tuple, list[str]] = {}
    for variant, rows in table.groupby("variant", sort=False):
        row = _row(str(variant), rows)
        if row.kind == "baseline":
            floors += _floors(row.variant, rows, left)
            continue
        try:
            cost = cost_of(row, context)
        except Unmapped as e:
            left.append(NotJoined(row.variant, None, str(e)))
            continue
        costs[row.variant] = cost
        for n, at_n in rows.groupby("eval_len", sort=True):
            accuracy = _accuracy(row.variant, int(n), at_n, left)
            if accuracy is None:
                continue
            for machine in machines:
                found = _priced(cases, cost, int(n), machine, model)
                if isinstance(found, str):
                    left.append(NotJoined(row.variant, int(n), found))
                    continue
                points.append(_point(row, int(n), accuracy, cost, machine, *found))
                for part, record in zip((cost, cost.last_layer), found, strict=True):
                    if record is not None:
                        _note_mismatch(mismatches, part, record, model, row.variant)
    return Report(
        model=model,
        direction=direction,
        lengths=lengths,
        machines=machines,
        costs=costs,
        points=tuple(_with_front(points)),
        floors=tuple(floors),
        not_joined=tuple(left),
        mismatches=tuple(_mismatch_lines(mismatches, model)),
    )


def _row(variant: str, rows: pd.DataFrame) -> Row:
    first = rows.iloc[0]
    return Row(
        variant=variant,
        kind=str(first["kind"]),
        applied_to=str(first["applied_to"]),
        mechanism=str(first["mechanism"]),
        path=str(first["path"]),
        params=str(first["params"]),
    )


def _ok_values(rows: pd.DataFrame) -> list[float]:
    ok = rows[(rows["status"] == "ok") & rows["accuracy"].notna()]
    return ok["accuracy"].tolist()


def _why_failed(rows: pd.DataFrame) -> str:
    first = rows.iloc[0]
    reason = str(first.get("reason", "") or "")
    return f"no accuracy: {first['status'] or 'no status'}" + (f" ({reason})" if reason else "")


def _accuracy(variant: str, n: int, rows: pd.DataFrame, left: list[NotJoined]) -> Accuracy | None:
    values = _ok_values(rows)
    if not values:
        left.append(NotJoined(variant, n, _why_failed(rows)))
        return None
    return accuracy_interval(values)


def _floors(variant: str, rows: pd.DataFrame, left: list[NotJoined]) -> list[Floor]:
    out = []
    for n, at_n in rows.groupby("eval_len", sort=True):
        values = _ok_values(at_n)
        if not values:
            left.append(NotJoined(variant, int(n), _why_failed(at_n)))
            continue
        out.append(Floor(variant, int(n), accuracy_interval(values, seeded=False)))
    return out


def _cases(rows: pd.DataFrame, direction: str) -> pd.DataFrame:
    """The speed rows a bidirectional model at ``direction`` can use."""
    bidirectional = rows["causal"].eq(False).fillna(False).astype(bool)
    cases = rows[(rows["direction"] == direction) & bidirectional]
    if cases.empty:
        found = ", ".join(sorted(set(rows["direction"]))) or "none"
        raise AttnbenchError(
            f"the speed CSV has no bidirectional {direction} case (its directions: {found}); "
            f"accepted: --direction {' or '.join(DIRECTIONS)} as measured"
        )
    return cases


def _priced(
    cases: pd.DataFrame, cost: Cost, n: int, machine: str, model: Model
) -> tuple[dict[str, Any], dict[str, Any] | None] | str:
    """The speed rows of the cost's path and of its last layer's (None without one), or why
    there are none."""
    found = _measured(cases, cost, n, machine, model)
    if isinstance(found, str) or cost.last_layer is None:
        return found if isinstance(found, str) else (found, None)
    last = _measured(cases, cost.last_layer, n, machine, model)
    return last if isinstance(last, str) else (found, last)


def _measured(
    cases: pd.DataFrame, cost: Cost, n: int, machine: str, model: Model
) -> dict[str, Any] | str:
    """The speed row that prices ``cost`` at ``n`` on ``machine`` (the model's shape first),
    or why there is none."""
    same = cases[
        (cases["mechanism"] == cost.mechanism)
        & (cases["path"] == cost.path)
        & (cases["params"] == cost.params)
        & (cases["device_name"] == machine)
    ]
    what = f"{cost.impl} ({cost.params or 'no parameters'})"
    if same.empty:
        return f"the speed CSV has no bidirectional {what} case on {machine}"
    at_n = same[same["seq_len"] == n]
    if at_n.empty:
        return f"the speed CSV has no {what} case at that length on {machine}"
    records = at_n.to_dict("records")
    best = min(records, key=lambda r: (len(_differences(r, cost, model)), r["status"] != "ok"))
    if best["status"] != "ok":
        reason = f" ({best['reason']})" if best.get("reason") else ""
        return f"{what} on {machine} did not run: {best['status']}{reason}"
    return best


def _differences(record: dict[str, Any], cost: Cost, model: Model) -> list[str]:
    """What of the speed case's shape differs from the model's layer."""
    out = []
    if int(record["heads"]) != cost.heads:
        out.append("heads")
    if int(record["head_dim"]) != cost.head_dim:
        out.append("head dim")
    if str(record["dtype"]) != model.dtype:
        out.append("dtype")
    return out


def _memory(record: dict[str, Any]) -> float:
    """A speed row's peak memory (bytes) in its direction; NaN where it was not measured."""
    memory = record.get(MEMORY_COLUMN[record["direction"]])
    return math.nan if memory is None or pd.isna(memory) else float(memory)


def _per_token(record: dict[str, Any], n: int) -> tuple[float, float]:
    """A speed row's time (ns) and peak memory (bytes) per token: one call's, divided by the
    call's batch x n tokens."""
    batch = int(record["batch"])
    time_ns = float(record["time_median_ms"]) * 1e6
    return per_token(time_ns, batch, n), per_token(_memory(record), batch, n)


def _point(
    row: Row,
    n: int,
    accuracy: Accuracy,
    cost: Cost,
    machine: str,
    found: dict[str, Any],
    last: dict[str, Any] | None = None,
) -> Point:
    """The joined point. With a last-layer row (HWFA), the time per token is the mean over the
    model's layers, (layers - 1) x this path's + 1 x the last's, and the memory the larger."""
    time_ns, memory = _per_token(found, n)
    if last is not None:
        last_ns, last_memory = _per_token(last, n)
        time_ns = ((cost.layers - 1) * time_ns + last_ns) / cost.layers
        memory = max((m for m in (memory, last_memory) if not math.isnan(m)), default=math.nan)
    measured = {  # the main path's speed row, as measured
        "batch": int(found["batch"]),
        "heads": int(found["heads"]),
        "head_dim": int(found["head_dim"]),
        "dtype": str(found["dtype"]),
        "time_ms": float(found["time_median_ms"]),
        "memory_bytes": _memory(found),
    }
    return Point(
        variant=row.variant,
        kind=row.kind,
        eval_len=n,
        accuracy=accuracy,
        cost=cost,
        machine=machine,
        measured=measured,
        time_per_token_ns=time_ns * cost.time_factor,
        memory_per_token_bytes=memory,
    )


def _with_front(points: list[Point]) -> list[Point]:
    """The points with ``pareto`` set, per (machine, n)."""
    out = list(points)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault((p.machine, p.eval_len), []).append(i)
    for members in groups.values():
        flags = pareto_flags(
            [points[i].time_per_token_ns for i in members],
            [points[i].accuracy.mean for i in members],
        )
        for i, flag in zip(members, flags, strict=True):
            out[i] = replace(points[i], pareto=flag)
    return out


def _shape(heads: int, head_dim: int, dtype: str) -> str:
    return f"heads {heads}, head dim {head_dim}, {dtype}"


def _note_mismatch(
    found: dict[tuple, list[str]], cost: Cost, record: dict[str, Any], model: Model, variant: str
) -> None:
    if not _differences(record, cost, model):
        return
    measured = (int(record["heads"]), int(record["head_dim"]), str(record["dtype"]))
    key = (cost.impl, measured, (cost.heads, cost.head_dim))
    variants = found.setdefault(key, [])
    if variant not in variants:
        variants.append(variant)


def _mismatch_lines(found: dict[tuple, list[str]], model: Model) -> list[str]:
    """One line per (path, measured shape, model shape)."""
    lines = []
    for (impl, measured, (heads, head_dim)), variants in found.items():
        lines.append(
            f"{impl} was measured at {_shape(*measured)}; the model's layer runs "
            f"{_shape(heads, head_dim, model.dtype)} (rows: {', '.join(variants)})"
        )
    return lines
