"""The report's two inputs, read and checked: the folder of ``run extrapolate`` (its table and
the sidecar that holds the model's shape) and the folder of ``run speed`` (its results CSV).

Anything unusable is an :class:`AttnbenchError` of one line naming the folder or file and what
was expected, raised before the report writes anything.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.bench.results import CSV_ENCODING, read_results
from attnbench.core.errors import AttnbenchError

EXTRAPOLATION_CSV, EXTRAPOLATION_SIDECAR, SPEED_CSV = (
    "extrapolate.csv",
    "extrapolate.json",
    "results.csv",
)

#: The columns of ``extrapolate.csv`` the report reads (the table has more).
TABLE_COLUMNS = (
    "variant", "kind", "applied_to", "mechanism", "path", "params", "seed", "train_len",
    "eval_len", "accuracy", "status",
)  # fmt: skip

#: The dtype the extrapolation model computes in (it has no other: no autocast, no half).
MODEL_DTYPE = "float32"

EXTRAPOLATION_HINT = "give the --out folder of `attnbench run extrapolate`"
SPEED_HINT = "give the --out folder of `attnbench run speed`"


@dataclass(frozen=True)
class Model:
    """What the extrapolation sidecar says about the model: its attention shape and the
    evaluation windows (0 in the config means L/2, as for ``run extrapolate``)."""

    preset: str
    d_model: int
    heads: int
    train_len: int
    layers: int
    local_window: int
    rerope_window: int
    dtype: str = MODEL_DTYPE
    #: The model's ``d_head`` (0: d_model / heads; runs from before the option have none).
    d_head: int = 0

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.heads


@dataclass(frozen=True)
class Extrapolation:
    """``extrapolate.csv`` (text columns as written, ``seed`` / ``eval_len`` / ``train_len`` /
    ``accuracy`` numeric) and the model it was made with."""

    folder: Path
    rows: pd.DataFrame
    model: Model


@dataclass(frozen=True)
class Speed:
    """``results.csv`` of a speed run, typed as :func:`attnbench.bench.results.read_results`
    reads it."""

    folder: Path
    rows: pd.DataFrame


def read_extrapolation(folder: Path) -> Extrapolation:
    """The extrapolation folder's table and model; one-line errors for anything else."""
    csv_path = _file_in(folder, EXTRAPOLATION_CSV, EXTRAPOLATION_HINT)
    rows = _table(csv_path)
    side = folder / EXTRAPOLATION_SIDECAR
    if not side.is_file():
        raise AttnbenchError(
            f"{folder} has no {EXTRAPOLATION_SIDECAR} beside {EXTRAPOLATION_CSV}: the model's "
            f"shape (heads, head dim) and evaluation windows come from it; {EXTRAPOLATION_HINT}"
        )
    return Extrapolation(folder, rows, _model(side, rows))


def read_speed(folder: Path) -> Speed:
    """The speed folder's results CSV; one-line errors for anything else."""
    csv_path = _file_in(folder, SPEED_CSV, SPEED_HINT)
    rows = read_results(csv_path)
    if rows.empty:
        raise AttnbenchError(f"{csv_path} has no rows: nothing to join; {SPEED_HINT}")
    return Speed(folder, rows)


def _file_in(folder: Path, name: str, hint: str) -> Path:
    if not folder.exists():
        raise AttnbenchError(f"{folder}: no such folder; {hint}")
    if not folder.is_dir():
        raise AttnbenchError(f"{folder} is not a folder; {hint}")
    path = folder / name
    if not path.is_file():
        raise AttnbenchError(f"{folder} has no {name}; {hint}")
    return path


def _table(path: Path) -> pd.DataFrame:
    """``extrapolate.csv`` with its numeric columns typed; empty or malformed: an error."""
    try:
        text = path.read_bytes().decode(CSV_ENCODING)
        rows = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise AttnbenchError(f"{path} is empty: nothing to report") from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise AttnbenchError(f"{path}: not an extrapolation table ({first})") from None
    missing = [c for c in TABLE_COLUMNS if c not in rows.columns]
    if missing:
        raise AttnbenchError(
            f"{path}: not an extrapolation table (no column {', '.join(missing)}); "
            f"{EXTRAPOLATION_HINT}"
        )
    if rows.empty:
        raise AttnbenchError(f"{path} has no rows: nothing to report")
    for column in ("seed", "train_len", "eval_len", "accuracy"):
        values = pd.to_numeric(rows[column].replace("", None), errors="coerce")
        bad = values.isna() & (rows[column] != "")
        if bad.any():
            raise AttnbenchError(
                f"{path}: column {column} holds {rows[column][bad].iloc[0]!r}, not a number"
            )
        rows[column] = values.astype("float64")
    if rows["eval_len"].isna().any() or rows["train_len"].isna().any():
        raise AttnbenchError(f"{path}: a row has no eval_len or train_len")
    return rows


def _model(side: Path, rows: pd.DataFrame) -> Model:
    """The model's shape and windows from the sidecar's ``config``."""
    try:
        config = json.loads(side.read_text(encoding="utf-8"))["config"]
        model, evaluation = config["model"], config.get("eval") or {}
        d_model, heads = int(model["d_model"]), int(model["heads"])
        train_len, layers = int(model["train_len"]), int(model["layers"])
        d_head = int(model.get("d_head") or 0)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise AttnbenchError(
            f"{side}: not the sidecar of `attnbench run extrapolate` (no config.model: {e})"
        ) from None
    in_table = sorted({int(n) for n in rows["train_len"]})
    if in_table != [train_len]:
        raise AttnbenchError(
            f"{side} says L = {train_len} but its table's rows are trained at "
            f"{', '.join(map(str, in_table))}: they do not belong together"
        )
    local, rerope = _windows(train_len, evaluation)
    return Model(
        preset=str(config.get("preset") or ""),
        d_model=d_model,
        heads=heads,
        train_len=train_len,
        layers=layers,
        local_window=local,
        rerope_window=rerope,
        d_head=d_head,
    )


def _windows(train_len: int, evaluation: dict[str, Any]) -> tuple[int, int]:
    """The evaluation windows as the run used them (0 or absent: the run's default, L/2)."""
    from attnbench.extrapolation.model.tricks import parse_tricks

    local = int(evaluation.get("local_window") or 0) or None
    rerope = int(evaluation.get("rerope_window") or 0) or None
    tricks = parse_tricks("local", train_len, local_window=local, rerope_window=rerope)
    return tricks.local_window, tricks.rerope_window
