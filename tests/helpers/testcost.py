"""Where the test suite's time goes: a pytest plugin and its summary (docs/contributing.md).

    python -m pytest -p tests.helpers.testcost   # writes runs/testcost*.jsonl (TESTCOST_OUT)
    python -m tests.helpers.testcost runs        # the tables, by file and by kind

For every test (setup, call and teardown together) it records the wall time, the CPU time of the
process and of the child processes it waited for (compilers, ``attnbench`` subprocesses), how
many subprocesses it started, and how many graphs torch.compile traced. CPU time is the figure to
compare between machines and loads: a busy machine stretches the wall time, not the work. Each
test is put in one kind, the first that applies: ``subprocess`` (started one), ``compile``
(torch.compile traced a graph, or a C++ compiler ran), ``training`` (under tests/extrapolation/
and over 2 s of CPU), else ``plain``. Under pytest-xdist each worker writes its own file
(``testcost-gw0.jsonl``, ...); the summary reads them all.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

_started = {"popen": 0}
_rows: list[dict] = []


def _cpu_s() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _traced_graphs() -> int:
    if "torch" not in sys.modules:
        return 0
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - a torch without dynamo
        return 0
    return int(counters["stats"].get("unique_graphs", 0))


_popen_init = subprocess.Popen.__init__


def _counted_popen_init(self, *args, **kwargs):
    _started["popen"] += 1
    return _popen_init(self, *args, **kwargs)


def pytest_configure(config):
    subprocess.Popen.__init__ = _counted_popen_init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _started["popen"] = 0
    graphs, wall = _traced_graphs(), time.perf_counter()
    own, kids = _cpu_s()
    yield
    own2, kids2 = _cpu_s()
    _rows.append({
        "test": item.nodeid,
        "wall_s": round(time.perf_counter() - wall, 4),
        "cpu_s": round(own2 - own, 4),
        "child_cpu_s": round(kids2 - kids, 4),
        "subprocesses": _started["popen"],
        "graphs": _traced_graphs() - graphs,
    })  # fmt: skip


def pytest_sessionfinish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    default = Path(session.config.rootpath) / "runs" / "testcost.jsonl"
    out = Path(os.environ.get("TESTCOST_OUT", default))
    if worker:
        out = out.with_name(f"{out.stem}-{worker}{out.suffix}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for row in _rows:
            f.write(json.dumps(row) + "\n")


def kind(row: dict) -> str:
    """The one kind a test is counted under (see the module docstring)."""
    if row["subprocesses"] and not row["graphs"]:
        return "subprocess"
    if row["graphs"] or row["child_cpu_s"] > 0.5:
        return "compile"
    if row["test"].startswith("tests/extrapolation/") and row["cpu_s"] > 2:
        return "training"
    return "plain"


def read(path: Path) -> list[dict]:
    files = [path] if path.is_file() else []
    files += sorted(path.parent.glob(f"{path.stem}-gw*{path.suffix}"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line]


def summary(rows: list[dict], top: int = 15) -> str:
    """Markdown: the time by kind, and the files that take the most."""

    def table(key, title: str, limit: int | None) -> list[str]:
        groups: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for row in rows:
            g = groups[key(row)]
            g[0] += 1
            g[1] += row["wall_s"]
            g[2] += row["cpu_s"] + row["child_cpu_s"]
        total_cpu = sum(g[2] for g in groups.values()) or 1.0
        ordered = sorted(groups.items(), key=lambda kv: -kv[1][2])[:limit]
        lines = [
            f"| {title} | tests | wall s | CPU s | share of CPU |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {name} | {n} | {wall:.0f} | {cpu:.0f} | {100 * cpu / total_cpu:.1f} % |"
            for name, (n, wall, cpu) in ordered
        ]
        return lines

    wall = sum(r["wall_s"] for r in rows)
    cpu = sum(r["cpu_s"] + r["child_cpu_s"] for r in rows)
    head = [f"{len(rows)} tests, {wall:.0f} s of test wall time, {cpu:.0f} s of CPU time.", ""]
    by_kind = table(kind, "kind", None)
    by_file = table(lambda r: r["test"].split("::")[0], "file", top)
    return "\n".join(head + by_kind + [""] + by_file) + "\n"


if __name__ == "__main__":
    where = Path(sys.argv[1] if len(sys.argv) > 1 else "runs")
    print(summary(read(where / "testcost.jsonl" if where.is_dir() else where)))
