"""The results history: speed runs, one row per case, in one SQLite file (``history.sqlite``) in
a folder the user chooses (a CI cache, an artifact store, a shared disk).

Why SQLite (Python's ``sqlite3``, no server, no extra package): a team's history grows to
thousands of runs of a hundred cases each, and every question asked of it is a query over all of
them (every series of one machine class, the last 20 commits of the cases of one run); one
indexed file answers those without reading a CSV per run, a run is added in one transaction
(a killed ``history add`` leaves the history as it was, never half a run), and one file is what
a CI cache or artifact keeps between jobs.

What is kept of a run (:meth:`History.add`): its commit (the sidecar's ``git.sha``), when it
started, the command, and per case its status, median time, p20/p80, rounds, ratio to the
reference and time in units of matmul work (what ``attnbench compare`` judges). Each case row
belongs to an **environment**: the machine class (device, the CPU's class
:func:`attnbench.measure.cpu_class.cpu_class`, the device's name, threads, clock), the library
versions (python, torch, cuda, cudnn, triton and the library-backed paths' packages; numpy and
attnbench itself are not: attnbench is the code under test) and the suite. A series never
crosses environments: a new torch version starts new series.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attnbench.bench.export import benchmark_name
from attnbench.bench.results import plain, read_results, read_sidecar, row_key
from attnbench.bench.thresholds import WORK_METRIC
from attnbench.core.errors import AttnbenchError
from attnbench.measure.cpu_class import cpu_class
from attnbench.runtime.outputs import ensure_dir

DB_NAME = "history.sqlite"
SCHEMA_VERSION = "1"
#: The version fields of the sidecar that split series (``libraries``, a dict, as well).
VERSION_FIELDS = ("python", "torch", "cuda", "cudnn", "triton")
#: The metric of a series: time over the reference's in the same rounds (for every case but the
#: reference), the reference's own time in units of matmul work, or plain milliseconds.
TIME_METRIC = "time (ms)"
METRICS = ("auto", "time")

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS envs (
    id INTEGER PRIMARY KEY, machine_class TEXT NOT NULL, versions TEXT NOT NULL,
    suite TEXT NOT NULL, UNIQUE (machine_class, versions, suite));
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, commit_sha TEXT NOT NULL, branch TEXT, started TEXT NOT NULL,
    added TEXT NOT NULL, digest TEXT NOT NULL UNIQUE, source TEXT NOT NULL, command TEXT);
CREATE TABLE IF NOT EXISTS cases (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, label TEXT NOT NULL, family TEXT NOT NULL,
    direction TEXT NOT NULL, causal INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS results (
    run_id INTEGER NOT NULL REFERENCES runs (id), case_id INTEGER NOT NULL REFERENCES cases (id),
    env_id INTEGER NOT NULL REFERENCES envs (id), status TEXT NOT NULL, time_ms REAL,
    time_p20_ms REAL, time_p80_ms REAL, rounds INTEGER, reference TEXT, ref_ratio REAL,
    work REAL, matmul_size INTEGER, PRIMARY KEY (run_id, case_id));
CREATE INDEX IF NOT EXISTS results_by_env ON results (env_id, case_id);
"""


@dataclass(frozen=True)
class Env:
    """What a series never crosses: machine class, library versions, suite."""

    machine_class: str
    versions: str
    suite: str

    def describe(self) -> str:
        return f"{self.machine_class}; {self.versions}; suite {self.suite}"


@dataclass(frozen=True)
class Added:
    """What :meth:`History.add` did: the run's commit, its rows, its environments, and whether
    it was there already."""

    commit: str
    rows: int
    envs: tuple[Env, ...]
    already: bool = False


@dataclass(frozen=True)
class Series:
    """One case in one environment on one metric: a value per commit (the median of that
    commit's runs), in the order the commits were first measured."""

    env: Env
    key: str
    label: str
    family: str
    direction: str
    causal: bool
    metric: str
    commits: tuple[str, ...]
    values: tuple[float, ...]
    runs: tuple[int, ...]


def _versions(side: Mapping[str, Any] | None, row: Mapping[str, Any]) -> str:
    found = dict((side or {}).get("versions") or {})
    parts = {name: found.get(name) for name in VERSION_FIELDS}
    parts["torch"] = parts["torch"] or plain(row.get("torch_version"))
    parts.update(sorted((found.get("libraries") or {}).items()))
    return " ".join(f"{k}={v}" for k, v in parts.items() if v is not None)


def env_of(row: Mapping[str, Any], side: Mapping[str, Any] | None) -> Env:
    """The environment of one results row, with its run's sidecar (None: from the row alone)."""
    signature = ((side or {}).get("machine") or {}).get("cpu_signature")
    cpu = cpu_class(signature) if signature else "cpu-unknown"
    machine = (
        f"{row['device']}|{cpu}|{row['device_name']}|threads={plain(row['threads'])}|"
        f"clock={row['clock']}"
    )
    return Env(machine, _versions(side, row), str(row["suite"]))


def metric_of(row: Mapping[str, Any]) -> tuple[str, float] | None:
    """(metric, value) that ``compare`` judges a row's time by: its ratio to the reference, or
    for the reference itself its time in units of matmul work; None when neither is known."""
    ratio, reference = plain(row.get("ref_ratio")), plain(row.get("reference"))
    own = f"{row['mechanism']}:{row['path']}"
    if ratio is not None and reference and reference != own:
        return f"time / {reference}", float(ratio)
    rate, ms = plain(row.get("matmul_flop_per_s")), plain(row.get("time_median_ms"))
    if rate is not None and ms is not None:
        return WORK_METRIC, float(ms) * float(rate) / 1e12
    return None


def matmul_size(side: Mapping[str, Any] | None, dtype: str) -> int | None:
    """The size of the roofline's matmul a run timed for ``dtype`` (its sidecar's calibration;
    a run sizes it by time, and times in units of matmul work compare only at one size)."""
    calibration = (side or {}).get("calibration") or {}
    for name, cal in calibration.items():
        if str(name).removeprefix("torch.") == dtype and isinstance(cal, Mapping):
            size = cal.get("matmul_size")
            return int(size) if size is not None else None
    return None


def work_metric(size: int | None) -> str:
    """The metric of a time in units of matmul work, naming the matmul's size when known."""
    return WORK_METRIC if size is None else f"{WORK_METRIC} (matmul {size})"


def run_commit(
    csv_path: Path, side: Mapping[str, Any] | None, commit: str | None, allow_dirty: bool
) -> str:
    """The commit a run measured: ``commit`` if given, else its sidecar's; a run of a working
    tree with uncommitted changes is refused unless ``allow_dirty`` (then ``<sha>-dirty``)."""
    git = (side or {}).get("git") or {}
    sha = commit or git.get("sha")
    if not sha:
        raise AttnbenchError(
            f"{csv_path}: no commit recorded (no sidecar, or a run outside a git checkout); "
            "give it with --commit SHA"
        )
    if git.get("dirty") and not commit:
        if not allow_dirty:
            raise AttnbenchError(
                f"{csv_path}: measured from a working tree with uncommitted changes (commit "
                f"{str(sha)[:10]}); accepted: runs of a clean checkout, or --allow-dirty"
            )
        return f"{sha}-dirty"
    return str(sha)


def results_csv(path: Path) -> Path:
    """A results CSV from a results folder (``results.csv`` in it) or the CSV itself."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.csv"
    if not path.is_file():
        raise AttnbenchError(
            f"{path}: no such results file; give a folder written by attnbench run speed "
            "(results.csv and results.json) or a results CSV"
        )
    return path


def runs_text(count: int) -> str:
    """``1 run``, ``3 runs``."""
    return f"{count} run{'s' * (count != 1)}"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class History:
    """The history in ``folder`` (see the module docstring). ``create``: make the folder and
    the file when missing (``add``); otherwise a folder without one is an error."""

    def __init__(self, folder: Path, create: bool = False) -> None:
        self.folder = Path(folder)
        self.path = self.folder / DB_NAME
        if not self.path.is_file() and not create:
            raise AttnbenchError(
                f"{self.folder}: no results history there ({DB_NAME}); start one with "
                "attnbench history add RESULTS_DIR --history DIR"
            )
        ensure_dir(self.folder, "history folder")
        try:
            self.db = sqlite3.connect(self.path)
            self.db.executescript(_TABLES)
            self._check_schema()
        except sqlite3.DatabaseError as e:
            raise AttnbenchError(f"{self.path}: not a readable results history ({e})") from None

    def _check_schema(self) -> None:
        found = self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if found is None:
            with self.db:
                self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        elif found[0] != SCHEMA_VERSION:
            raise AttnbenchError(
                f"{self.path}: a history of schema {found[0]}; this attnbench reads schema "
                f"{SCHEMA_VERSION}"
            )

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, path: Path, commit: str | None = None, allow_dirty: bool = False) -> Added:
        """Record one speed run (a results folder or CSV, with its sidecar) in one transaction;
        the same results file added again is not added twice (``already``)."""
        csv_path = results_csv(path)
        side = read_sidecar(csv_path)
        sha = run_commit(csv_path, side, commit, allow_dirty)
        df = read_results(csv_path)
        digest = hashlib.sha256(csv_path.read_bytes()).hexdigest()
        rows = [{c: plain(v) for c, v in r.items()} for r in df.to_dict("records")]
        envs = tuple(dict.fromkeys(env_of(r, side) for r in rows))
        if self.db.execute("SELECT 1 FROM runs WHERE digest = ?", (digest,)).fetchone():
            return Added(sha, len(rows), envs, already=True)
        started = (side or {}).get("started") or _dt.datetime.fromtimestamp(
            csv_path.stat().st_mtime, _dt.timezone.utc
        ).isoformat(timespec="seconds")
        git = (side or {}).get("git") or {}
        with self.db:
            run = self.db.execute(
                "INSERT INTO runs (commit_sha, branch, started, added, digest, source, command) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    sha,
                    git.get("branch"),
                    started,
                    _now(),
                    digest,
                    str(csv_path.resolve()),
                    (side or {}).get("command"),
                ),
            ).lastrowid
            for row in rows:
                self._add_row(run, row, env_of(row, side), matmul_size(side, str(row["dtype"])))
        return Added(sha, len(rows), envs)

    def _id(self, table: str, unique: Mapping[str, Any], more: Mapping | None = None) -> int:
        """The id of the row of ``table`` with the ``unique`` values, inserted (with ``more``)
        when missing."""
        where = " AND ".join(f"{k} = ?" for k in unique)
        found = self.db.execute(f"SELECT id FROM {table} WHERE {where}", tuple(unique.values()))
        hit = found.fetchone()
        if hit:
            return int(hit[0])
        cols = {**unique, **(more or {})}
        marks = ", ".join("?" for _ in cols)
        sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})"
        return int(self.db.execute(sql, tuple(cols.values())).lastrowid)

    def _add_row(self, run: int, row: Mapping[str, Any], env: Env, size: int | None) -> None:
        env_id = self._id(
            "envs",
            {"machine_class": env.machine_class, "versions": env.versions, "suite": env.suite},
        )
        case_id = self._id(
            "cases",
            {"key": case_key(row)},
            {
                "label": benchmark_name(row),
                "family": str(row.get("family") or row["mechanism"]),
                "direction": str(row["direction"]),
                "causal": int(bool(row["causal"])),
            },
        )
        work = metric_of({**row, "ref_ratio": None})
        self.db.execute(
            "INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run,
                case_id,
                env_id,
                row["status"],
                row.get("time_median_ms"),
                row.get("time_p20_ms"),
                row.get("time_p80_ms"),
                row.get("samples"),
                row.get("reference"),
                row.get("ref_ratio"),
                work[1] if work else None,
                size,
            ),
        )

    def runs(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0])

    def frame(self, env: Env | None = None) -> pd.DataFrame:
        """Every ok case row (with its run, environment and case), optionally of one env."""
        sql = (
            "SELECT e.machine_class, e.versions, e.suite, r.commit_sha, r.started, c.key, "
            "c.label, c.family, c.direction, c.causal, x.time_ms, x.reference, x.ref_ratio, "
            "x.work, x.matmul_size, x.run_id FROM results x JOIN runs r ON r.id = x.run_id "
            "JOIN envs e ON e.id = x.env_id JOIN cases c ON c.id = x.case_id "
            "WHERE x.status = 'ok'"
        )
        params: tuple = ()
        if env is not None:
            sql += " AND e.machine_class = ? AND e.versions = ? AND e.suite = ?"
            params = (env.machine_class, env.versions, env.suite)
        return pd.read_sql_query(sql, self.db, params=params)

    def commits(self, env: Env) -> list[tuple[str, str]]:
        """(commit, first start) of every commit with an ok row in ``env``, in the order of the
        series (:func:`series_of`)."""
        sql = (
            "SELECT r.commit_sha, MIN(r.started) AS first FROM results x JOIN runs r ON "
            "r.id = x.run_id JOIN envs e ON e.id = x.env_id WHERE x.status = 'ok' AND "
            "e.machine_class = ? AND e.versions = ? AND e.suite = ? GROUP BY r.commit_sha "
            "ORDER BY first, r.commit_sha"
        )
        found = self.db.execute(sql, (env.machine_class, env.versions, env.suite))
        return [(str(sha), str(first)) for sha, first in found]

    def series(self, metric: str = "auto", env: Env | None = None) -> list[Series]:
        """Every series (of ``env`` only, when given): see :func:`series_of`."""
        return list(series_of(self.frame(env), metric))


def _metric_columns(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``df`` with each row's metric name and value (``metric``: auto or time)."""
    if metric not in METRICS:
        raise AttnbenchError(f"--metric {metric!r}: accepted: {', '.join(METRICS)}")
    df = df.copy()
    if metric == "time":
        df["metric"], df["value"] = TIME_METRIC, df["time_ms"]
    else:
        own = df["key"].map(lambda k: ":".join(json.loads(k)[:2]))
        ratio = df["ref_ratio"].notna() & df["reference"].notna() & (df["reference"] != own)
        work = df["matmul_size"].map(lambda v: work_metric(None if pd.isna(v) else int(v)))
        df["metric"] = np.where(ratio, "time / " + df["reference"].fillna(""), work)
        df["value"] = np.where(ratio, df["ref_ratio"], df["work"])
    return df[df["value"].notna() & (df["value"] > 0)]


def series_of(df: pd.DataFrame, metric: str = "auto") -> Iterator[Series]:
    """The series in a :meth:`History.frame`: per environment, case and metric, the median of
    each commit's runs, the commits in the order their first run started in that environment."""
    df = _metric_columns(df, metric)
    env_cols = ["machine_class", "versions", "suite"]
    for env_key, in_env in df.groupby(env_cols, sort=True):
        env = Env(*env_key)
        order = in_env.groupby("commit_sha")["started"].min().sort_values(kind="stable")
        rank = {sha: i for i, sha in enumerate(order.index)}
        for (key, name), rows in in_env.groupby(["key", "metric"], sort=True):
            per = rows.groupby("commit_sha")["value"].agg(["median", "count"])
            per = per.sort_index(key=lambda idx: idx.map(rank))
            first = rows.iloc[0]
            yield Series(
                env,
                key,
                first["label"],
                first["family"],
                first["direction"],
                bool(first["causal"]),
                name,
                tuple(per.index),
                tuple(float(v) for v in per["median"]),
                tuple(int(c) for c in per["count"]),
            )


def case_key(row: Mapping[str, Any]) -> str:
    """How the history stores a case's key (the results' KEY columns as written)."""
    return json.dumps(list(row_key(row)))
