"""``attnbench merge``: the unit folders of one or more unit-wise runs of a speed sweep
(:mod:`attnbench.bench.units`: shards of an array job, a Ray run, resumed runs) joined into the
files of a single run: ``results.csv`` with rows in plan order whatever the order the units
finished in, ``samples.jsonl``, ``complexity.csv`` re-fitted over all rows, and ``results.json``.

A unit that no folder finished, or that failed, becomes ``error`` rows naming it (its cases are in
the plan). Results measured on different device models or torch versions are refused unless
``allow_mixed``: a ratio between two of them would compare machines, not mechanisms.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.bench.complexity import fit_exponents
from attnbench.bench.results import (
    COLUMNS,
    SAMPLES_NAME,
    plain,
    read_results,
    read_samples_file,
    results_text,
    row_key,
)
from attnbench.bench.summary import COMPLEXITY_NAME, CSV_NAME, SIDECAR_NAME, SpeedRun
from attnbench.bench.units import (
    PLAN_KIND,
    PLAN_NAME,
    UNITS_DIR,
    Unit,
    read_plan,
    read_record,
    row_order,
    write_json_atomic,
    write_plan,
)
from attnbench.core.errors import AttnbenchError
from attnbench.runtime.outputs import refuse_to_replace, write_csv, write_text
from attnbench.runtime.portable import portable

EXTRAPOLATE_HINT = (
    "a sharded extrapolation run is not merged: its shards share one --checkpoints folder, and "
    "`attnbench run extrapolate --eval-only` with the same options evaluates them all; finished "
    "runs' tables are joined by `attnbench merge LABEL=RUN ... --rows ... --seeds ...`"
)


def _plan_of(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise AttnbenchError(f"merge: {folder} is not a folder")
    if (folder / "extrapolate.json").is_file() or (folder / "checkpoints").is_dir():
        raise AttnbenchError(f"merge: {folder} holds an extrapolation run; {EXTRAPOLATE_HINT}")
    doc = read_plan(folder / PLAN_NAME)
    if doc["kind"] != PLAN_KIND:
        raise AttnbenchError(f"merge: {folder / PLAN_NAME} is a {doc['kind']!r} plan, not a "
                             "speed sweep's")  # fmt: skip
    return doc


def _same_plan(folders: Sequence[Path]) -> dict[str, Any]:
    plans = [(f, _plan_of(f)) for f in folders]
    first_folder, first = plans[0]
    for folder, doc in plans[1:]:
        if doc["suite"] != first["suite"] or doc["units"] != first["units"]:
            what = "suites" if doc["suite"].get("name") != first["suite"].get("name") else "plans"
            raise AttnbenchError(
                f"merge: {folder} and {first_folder} hold different {what} "
                f"({doc['suite'].get('name')!r}, {len(doc['units'])} units vs "
                f"{first['suite'].get('name')!r}, {len(first['units'])} units); merge only "
                "folders of one sweep"
            )
    return first


def _best_records(folders: Sequence[Path], units: list[Unit]) -> dict[str, tuple[Path, dict]]:
    """Per unit, the folder and record to take: a finished one if any folder has it (the
    newest), else the newest failure."""
    best: dict[str, tuple[Path, dict]] = {}
    for unit in units:
        for folder in folders:
            rec = read_record(folder / UNITS_DIR / unit.id)
            if rec is None:
                continue
            old = best.get(unit.id)
            rank = (rec.get("status") == "ok", rec.get("finished", ""))
            if old is None or rank > (old[1].get("status") == "ok", old[1].get("finished", "")):
                best[unit.id] = (folder / UNITS_DIR / unit.id, rec)
    return best


def _check_mixed(taken: dict[str, tuple[Path, dict]], allow_mixed: bool) -> list[str]:
    ok = [rec for _, rec in taken.values() if rec.get("status") == "ok"]
    devices = sorted({str(r.get("device_name")) for r in ok})
    torches = sorted({str(r.get("torch_version")) for r in ok})
    mixed = []
    if len(devices) > 1:
        mixed.append(f"device models {', '.join(devices)}")
    if len(torches) > 1:
        mixed.append(f"torch versions {', '.join(torches)}")
    if mixed and not allow_mixed:
        raise AttnbenchError(
            f"merge: the units were measured on different {' and '.join(mixed)}; their ratios "
            "would compare machines. Pass --allow-mixed to merge them anyway"
        )
    return mixed


def merge_runs(folders: Sequence[Path], out: Path, *, allow_mixed: bool = False,
               command: str = "attnbench merge", overwrite: bool = False) -> SpeedRun:  # fmt: skip
    """Merge ``folders`` into ``out``; returns a :class:`~attnbench.bench.summary.SpeedRun`.
    Results already in ``out`` are replaced only when they are this sweep's (``out`` holds its
    plan: a merge again, as more shards finish) or with ``overwrite``."""
    if not folders:
        raise AttnbenchError("merge: name at least one folder")
    folders = [Path(f) for f in folders]
    doc = _same_plan(folders)
    ours = (out / PLAN_NAME).is_file() and _plan_of(out) == doc
    refuse_to_replace(
        [out / name for name in (CSV_NAME, SAMPLES_NAME, COMPLEXITY_NAME, SIDECAR_NAME)],
        option="--out", folder=out, overwrite=overwrite or ours,
    )  # fmt: skip
    units = [Unit.from_plain(u) for u in doc["units"]]
    taken = _best_records(folders, units)
    mixed = _check_mixed(taken, allow_mixed)
    ordered, samples, base_sidecar, unit_summaries = _gather(units, taken)
    df, exponents = _write_rows(out, folders, doc, ordered, samples)
    calibration = _calibration(df, doc, _anchor_sizes(taken))
    wall = sum(float(u.get("wall_s") or 0) for u in unit_summaries)
    sidecar = dict(base_sidecar or {"kind": "attnbench-speed", "suite": doc["suite"]})
    sidecar.update(
        command=command,
        merged={
            "from": [str(f) for f in folders],
            "units": unit_summaries,
            "mixed": mixed,
            "missing_or_failed": [u["unit"] for u in unit_summaries if u["status"] != "ok"],
        },
        calibration=calibration,
        counts={s: int(n) for s, n in df["status"].value_counts(sort=False).items()},
        noisy_rows=int(df["noisy"].fillna(False).astype(bool).sum()) if len(df) else 0,
        not_run=[],
        interrupted=False,
        stopped=None,
        wall_s=round(wall, 2),
    )
    sidecar.pop("unit", None)
    sidecar.setdefault("files", {}).update(
        rows=CSV_NAME, complexity=COMPLEXITY_NAME, samples=SAMPLES_NAME
    )
    write_json_atomic(out / SIDECAR_NAME, portable(sidecar, out))  # no machine's paths
    return SpeedRun(
        out_dir=out,
        csv=out / CSV_NAME,
        sidecar=out / SIDECAR_NAME,
        complexity=out / COMPLEXITY_NAME,
        rows=ordered,
        exponents=exponents,
        calibration=calibration,
        interrupted=False,
        not_run=[],
        wall_s=wall,
    )


def _gather(
    units: list[Unit], taken: dict[str, tuple[Path, dict]]
) -> tuple[list[dict[str, Any]], list[str], dict[str, Any] | None, list[dict[str, Any]]]:
    """Every unit's rows and sample lines, each in plan order; the sidecar of the first
    finished unit (the merged one starts from it); and a summary of every unit."""
    rows: list[tuple[int, dict[str, Any]]] = []
    samples: list[tuple[int, str]] = []
    base_sidecar: dict[str, Any] | None = None
    unit_summaries = []
    for unit in units:
        folder, rec = taken.get(unit.id, (None, None))
        if rec is not None and rec.get("status") == "ok":
            unit_rows, unit_samples = _finished_unit(unit, folder)
            rows += unit_rows
            samples += unit_samples
            if base_sidecar is None:
                base_sidecar = _read_sidecar(folder)
        else:
            rows += _failed_unit(unit, rec)
        unit_summaries.append(
            {"unit": unit.id, "status": rec.get("status") if rec else "missing",
             "folder": str(folder) if folder else None,
             **({k: rec.get(k) for k in ("host", "device_name", "torch_version", "exit_code",
                                         "attempts", "reason", "wall_s", "finished")}
                if rec else {})}
        )  # fmt: skip
    rows.sort(key=lambda x: x[0])
    samples.sort(key=lambda x: x[0])
    return [r for _, r in rows], [line for _, line in samples], base_sidecar, unit_summaries


def _finished_unit(
    unit: Unit, folder: Path
) -> tuple[list[tuple[int, dict[str, Any]]], list[tuple[int, str]]]:
    """A finished unit's rows and sample lines, each with its place in the plan; a row that is
    not one of the unit's cases is refused."""
    stubs = {row_key(c): c for c in unit.cases}
    rows, samples = [], []
    found = read_results(folder / CSV_NAME)
    for r in found.to_dict("records"):
        row = {c: plain(r.get(c)) for c in COLUMNS}
        stub = stubs.get(row_key(row))
        if stub is None:
            raise AttnbenchError(f"merge: {folder / CSV_NAME} holds a row that is not in "
                                 f"the plan ({row_key(row)})")  # fmt: skip
        rows.append((row_order(stub, row["status"]), row))
    for key, line in _sample_lines(folder / SAMPLES_NAME):
        if key in stubs:
            samples.append((row_order(stubs[key], "ok"), line))
    return rows, samples


def _read_sidecar(folder: Path) -> dict[str, Any] | None:
    """A finished unit's ``results.json`` (None when it has none)."""
    if not (folder / SIDECAR_NAME).is_file():
        return None
    try:
        return json.loads((folder / SIDECAR_NAME).read_text("utf-8"))
    except ValueError as e:
        raise AttnbenchError(
            f"merge: {folder / SIDECAR_NAME}: not readable JSON ({e}); run that "
            "unit again (--resume)"
        ) from None


def _failed_unit(unit: Unit, rec: dict[str, Any] | None) -> list[tuple[int, dict[str, Any]]]:
    """An ``error`` row for every case of a unit that failed or that no folder holds, naming
    why."""
    why = (f"unit {unit.id} failed after {rec.get('attempts', '?')} attempts: "
           f"{rec.get('reason') or 'no reason recorded'}" if rec is not None
           else f"unit {unit.id} was not run (no folder holds it)")  # fmt: skip
    rows = []
    for c in unit.cases:
        row = {col: None for col in COLUMNS}
        row.update({k: v for k, v in c.items() if k in COLUMNS})
        row.update(status="error", reason=why)
        rows.append((row_order(c, "error"), row))
    return rows


def _write_rows(
    out: Path,
    folders: list[Path],
    doc: dict[str, Any],
    ordered: list[dict[str, Any]],
    samples: list[str],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``results.csv``, ``samples.jsonl`` and the re-fitted ``complexity.csv`` in ``out`` (and
    the plan, when ``out`` is none of the folders); returns the rows and their exponents."""
    out.mkdir(parents=True, exist_ok=True)
    if out.resolve() not in {f.resolve() for f in folders}:
        write_plan(out, doc)  # a merged folder can be merged again, or resumed into
    # whole or not at all, under private temporary names (two shards finishing together may
    # both merge); a full disk names the file and leaves the one there before
    write_text(out / CSV_NAME, results_text(ordered))
    write_text(out / SAMPLES_NAME, "".join(line + "\n" for line in samples))
    df = pd.DataFrame(ordered, columns=list(COLUMNS))
    exponents = fit_exponents(df)
    write_csv(exponents, out / COMPLEXITY_NAME, index=False, float_format="%.4g")
    return df, exponents


def _sample_lines(path: Path) -> list[tuple[tuple[str, ...], str]]:
    """A unit's samples file as (case key, line), read with the samples reader's checks."""
    if not path.is_file():
        return []
    read_samples_file(path)  # refuses a malformed file with its line number
    lines = [line for line in path.read_text(encoding="utf-8").split("\n")[:-1] if line.strip()]
    return [(row_key(json.loads(line)), line) for line in lines]


def _anchor_sizes(taken: dict[str, tuple[Path, dict]]) -> dict[str, list[int]]:
    """dtype -> the matmul sizes the finished units timed, from their sidecars (each unit sizes
    its own matmul by time, so under another load two units may have kept different sizes)."""
    sizes: dict[str, set[int]] = {}
    for folder, rec in taken.values():
        if rec.get("status") != "ok":
            continue
        for dtype, cal in ((_read_sidecar(folder) or {}).get("calibration") or {}).items():
            if isinstance(cal, dict) and isinstance(cal.get("matmul_size"), int):
                sizes.setdefault(dtype.removeprefix("torch."), set()).add(cal["matmul_size"])
    return {dtype: sorted(found) for dtype, found in sizes.items()}


def _calibration(
    df: pd.DataFrame, doc: dict[str, Any], sizes: dict[str, list[int]]
) -> dict[str, dict[str, Any]]:
    """The matmul rate per dtype over the merged rows (each unit timed its own), and the
    matmul's size: one number, or the sizes when the units kept different ones."""
    out = {}
    ok = df[df["status"] == "ok"].dropna(subset=["matmul_flop_per_s"])
    for dtype, g in ok.groupby("dtype"):
        rates = g["matmul_flop_per_s"].astype(float).unique()
        kept = sizes.get(str(dtype)) or [doc["suite"].get("matmul_size")]
        out[f"torch.{dtype}"] = {
            "matmul_size": kept[0] if len(kept) == 1 else kept,
            "matmul_size_max": doc["suite"].get("matmul_size"),
            "flop_per_s_median": float(pd.Series(rates).median()),
            "flop_per_s_min": float(rates.min()),
            "flop_per_s_max": float(rates.max()),
            "groups": len(rates),
        }
    return out
