"""A speed sweep cut into *units*: the contract every engine (a SLURM array, Ray, a worker
process on this machine) runs the sweep through.

One unit = one (device, dtype, head dim, causal flag, mechanism) over all its lengths. A unit
times its mechanism's paths with the suite's reference and the matmul anchor in its own
interleaved rounds (the reference's rows are written only by the reference's own unit), so
ref_ratio, roofline and the out-of-memory / time-limit skipping of a series mean what they mean in
a single-process run. Units are numbered in plan order; ``--shard I/N`` runs the units whose
number is I mod N.

The folder of a unit-wise run::

    OUT/plan.json                 every unit, with the key columns of the rows it will write
    OUT/units/<id>/unit.json      a finished unit's record: status, host, device, versions,
                                  exit code, attempts (written last: no record, no unit)
    OUT/units/<id>/results.csv    its rows; results.json, samples.jsonl beside them

A unit runs in a temporary folder, renamed to ``units/<id>`` once complete, so a folder named
after a unit is always whole. ``attnbench merge`` (:mod:`attnbench.bench.merge`) joins the unit
folders of one or more such runs into one results.csv, in plan order.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from attnbench.core.errors import AttnbenchError
from attnbench.runtime.outputs import private_name, write_text
from attnbench.runtime.units import Unit as RuntimeUnit

PLAN_NAME = "plan.json"
UNITS_DIR = "units"
RECORD_NAME = "unit.json"
PLAN_KIND = "attnbench-speed-units"

#: The columns of a row known before anything runs (what a missing unit's error rows hold).
STUB_COLUMNS = (
    "suite", "mechanism", "family", "path", "path_kind", "params", "device", "dtype", "batch",
    "heads", "kv_heads", "seq_len", "head_dim", "value_dim", "causal", "direction", "flops",
    "flops_method", "query_len", "varlen", "packing",
)  # fmt: skip


@dataclass(frozen=True)
class Unit(RuntimeUnit):
    """One unit of a speed sweep; ``cases`` are the stub rows (STUB_COLUMNS) it writes, each
    with its position in the whole plan (``order``) and its group's (``group``)."""

    device: str
    dtype: str
    head_dim: int
    causal: bool
    mechanism: str
    cases: tuple[dict[str, Any], ...]
    kind: str = field(default="speed", kw_only=True)

    LISTS_KIND: ClassVar[bool] = False  # one kind only: the listing keeps its shape

    def details(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "dtype": self.dtype,
            "head_dim": self.head_dim,
            "causal": self.causal,
            "mechanism": self.mechanism,
            "cases": len(self.cases),
        }

    def plain(self) -> dict[str, Any]:
        """The unit as plan.json holds it: its listing, with the cases themselves."""
        return self.as_dict() | {"cases": [dict(c) for c in self.cases]}

    @classmethod
    def from_plain(cls, d: dict[str, Any]) -> Unit:
        return cls(d["index"], d["id"], d["device"], d["dtype"], d["head_dim"], d["causal"],
                   d["mechanism"], tuple(d["cases"]))  # fmt: skip


def unit_id(device: str, dtype: str, head_dim: int, causal: bool, mechanism: str) -> str:
    """``cpu-float32-d64-bidir-softmax``: stable across runs of the same suite."""
    return f"{device}-{dtype}-d{head_dim}-{'causal' if causal else 'bidir'}-{mechanism}"


def speed_units(suite, mechanisms=None) -> list[Unit]:
    """The suite's units, in plan order (the order their first case runs in a single-process
    run), each listing the rows it writes."""
    from attnbench.bench.inference import case_columns
    from attnbench.bench.plan import plan
    from attnbench.bench.results import params_text
    from attnbench.measure.flops import count_flops

    device = suite.torch_device().type
    found: dict[tuple, list[dict[str, Any]]] = {}
    order = 0
    for group_index, group in enumerate(plan(suite, mechanisms)):
        dname = str(group.dtype).removeprefix("torch.")
        for case in group.cases:
            key = (dname, group.head_dim, group.causal, case.mech.name)
            s = case.shape
            try:
                fc = count_flops(case.mech, s, case.causal, case.params, case.direction, case.path)
                flops, method = fc.flops, fc.method
            except Exception as e:  # as the runner's rows say it
                flops, method = None, f"not counted ({type(e).__name__})"
            found.setdefault(key, []).append(
                {
                    "order": order,
                    "group": group_index,
                    "suite": suite.name,
                    "mechanism": case.mech.name,
                    "family": case.mech.family,
                    "path": case.path.name,
                    "path_kind": case.path.kind,
                    "params": params_text(case.params),
                    "device": device,
                    "dtype": dname,
                    "batch": s.batch,
                    "heads": s.heads,
                    "kv_heads": s.hkv,
                    "seq_len": s.seq_len,
                    "head_dim": s.head_dim,
                    "value_dim": s.dv,
                    "causal": case.causal,
                    "direction": case.direction,
                    "flops": flops,
                    "flops_method": method,
                    **case_columns(case),
                }
            )
            order += 1
    return [
        Unit(i, unit_id(device, *key), device, *key, tuple(cases))
        for i, (key, cases) in enumerate(found.items())
    ]


def plan_document(suite, units: Sequence[Unit], mechanisms: Sequence[str]) -> dict[str, Any]:
    return {
        "kind": PLAN_KIND,
        "suite": suite.settings(),
        "mechanisms": list(mechanisms),
        "units": [u.plain() for u in units],
    }


def write_plan(out: Path, document: dict[str, Any]) -> None:
    """Write ``out/plan.json``, or check that the one there (another shard's, an earlier run's)
    is the same plan: shards of one run must agree on every unit."""
    path = out / PLAN_NAME
    if path.is_file():
        old = read_plan(path)
        if old["units"] != document["units"] or old["suite"] != document["suite"]:
            raise AttnbenchError(
                f"{path} holds the plan of another sweep (other suite, options or registry); "
                "use another --out, or remove that folder"
            )
        return
    write_json_atomic(path, document)


def read_plan(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnbenchError(
            f"{path.parent}: no {PLAN_NAME}; not the folder of a unit-wise run (run speed with "
            "--shard I/N or --executor)"
        ) from None
    except (OSError, ValueError) as e:
        raise AttnbenchError(f"{path}: not a readable plan ({e})") from None
    if not isinstance(doc, dict) or "units" not in doc or "kind" not in doc:
        raise AttnbenchError(f"{path}: not an attnbench plan")
    return doc


def write_json_atomic(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=1, default=str) + "\n")


def unit_dir(out: Path, unit: Unit) -> Path:
    return out / UNITS_DIR / unit.id


def read_record(folder: Path) -> dict[str, Any] | None:
    """A unit folder's record, or None when the unit has not finished there."""
    try:
        return json.loads((folder / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_done(out: Path, unit: Unit) -> bool:
    record = read_record(unit_dir(out, unit))
    return record is not None and record.get("status") == "ok"


def staging_dir(out: Path, unit: Unit) -> Path:
    """Where a unit runs before it is complete (one per host and process: never shared)."""
    return out / UNITS_DIR / private_name(unit.id)


def publish(staging: Path, final: Path) -> None:
    """Move a complete unit folder into place, replacing an older attempt's."""
    if final.exists():
        old = final.with_name(private_name(final.name))
        final.replace(old)
        shutil.rmtree(old, ignore_errors=True)
    staging.replace(final)


def record(
    unit: Unit,
    status: str,
    *,
    exit_code: int,
    attempts: int,
    reason: str = "",
    started: str = "",
    rows: int = 0,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A unit's record (unit.json): what ran, where, and how it ended."""
    from attnbench.measure import machine

    return {
        "unit": unit.id,
        "index": unit.index,
        "device": unit.device,
        "status": status,  # ok | failed
        "reason": reason,
        "exit_code": exit_code,
        "attempts": attempts,
        "rows": rows,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": started,
        "finished": now(),
        **(extra or {}),
        "versions": machine.versions(),
    }


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def row_order(stub: dict[str, Any], status: str) -> tuple[int, int, int]:
    """Where a case's row goes in a merged results.csv: the order a single-process run writes
    rows in, i.e. group by group, and in a group first the cases that did not get timed (written
    as soon as they are known: unsupported, skipped, failed while setting up) in plan order, then
    the timed ones in plan order."""
    return (stub["group"], 1 if status == "ok" else 0, stub["order"])
