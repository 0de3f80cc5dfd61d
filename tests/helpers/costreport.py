"""Tiny synthetic inputs of ``attnbench report``: an extrapolation folder (table and sidecar)
and a speed folder (results CSV). Synthetic data only."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tests.helpers.results import row as speed_base_row
from tests.helpers.results import write_results

TABLE_HEADER = [
    "variant", "kind", "applied_to", "mechanism", "path", "params", "note", "seed", "train_len",
    "eval_len", "accuracy", "loss", "status", "reason",
]  # fmt: skip

#: The cpu preset's model: 2 heads of 64, L = 64; windows 0 (the run's default, L/2).
MODEL = {"d_model": 128, "layers": 2, "heads": 2, "ffn_mult": 4, "train_len": 64}


def table_row(variant: str, n: int, accuracy: float | None, seed: int | None = 0, **over) -> dict:
    """One line of extrapolate.csv; ``kind`` from the name unless given (O+...: eval-time)."""
    kind = over.pop("kind", "eval-time" if variant.startswith("O+") else "trained")
    defaults = {
        "trained": {"mechanism": "softmax", "params": "{}"},
        "eval-time": {"applied_to": "O", "mechanism": "softmax", "path": "dense (eval-time)"},
        "baseline": {},
    }[kind]
    line = dict.fromkeys(TABLE_HEADER, "")
    line.update(variant=variant, kind=kind, seed="" if seed is None else seed, train_len=64,
                eval_len=n, accuracy="" if accuracy is None else accuracy, status="ok")  # fmt: skip
    line.update(defaults)
    line.update(over)
    return line


def write_extrapolation(folder: Path, rows: list[dict], **eval_config) -> Path:
    """``folder/extrapolate.csv`` of ``rows`` and its sidecar (the cpu preset's model)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "extrapolate.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=TABLE_HEADER)
        writer.writeheader()
        writer.writerows(rows)
    config = {
        "preset": "tiny",
        "model": MODEL,
        "eval": {"local_window": 0, "rerope_window": 0, **eval_config},
    }
    (folder / "extrapolate.json").write_text(json.dumps({"config": config}), encoding="utf-8")
    return folder


def speed_row(mechanism: str, path: str, n: int, params: str = "", **over) -> dict:
    """One ok bidirectional forward case at the cpu preset's attention shape (2 x 64)."""
    base = dict(mechanism=mechanism, path=path, seq_len=n, params=params, heads=2, kv_heads=2,
                head_dim=64, value_dim=64, suite="tiny", time_median_ms=1.0,
                mem_fwd_bytes=1000 * n)  # fmt: skip
    return speed_base_row(**{**base, **over})


def write_speed(folder: Path, rows: list[dict]) -> Path:
    """``folder/results.csv`` of ``rows`` as run speed writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    write_results(folder / "results.csv", rows)
    return folder
