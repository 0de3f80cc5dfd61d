"""The package's shape: its parts form layers, each importing only its own part and the layers
below it, and there is no import cycle.

    launch -> cli -> costreport -> bench | extrapolation | gpucheck -> api | layers | render
        -> registry -> variants -> kernels | libraries -> measure | runtime -> core

Parts on one layer do not import each other (the two experiments share only what is below them).
Read from the source with ``ast`` (imports inside functions count too), so a cycle that only
shows at run time, or only on some import order, is caught here.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "attnbench"

#: Every part of the package (a sub-package or a top-level module), lowest layer first.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),  # records, errors, cited works, capability checks, the judging rule
    ("measure", "runtime", "data"),  # timing, memory, the machine; units, writes, configs; corpora
    ("kernels", "libraries"),  # fused kernels; other projects' packages
    ("variants",),  # every mechanism's paths and record
    ("registry",),  # what exists
    ("api", "layers", "render"),  # the public surface; drawing patterns
    ("bench", "extrapolation", "gpucheck"),  # the two experiments; the GPU machine's check
    ("costreport",),  # the one place that joins them: accuracy against cost
    ("cli",),  # the command line
)
#: Top-level modules above everything (the package docstring, ``python -m attnbench``, and the
#: executable's entry point, which imports the command line while turning Ctrl-C into a line).
ENTRY = ("", "__main__", "launch")
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in modules else base)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_every_part_of_the_package_has_a_layer():
    parts = {part(m) for m in import_graph()} - set(ENTRY)
    assert parts == set(RANK), "add the new part to LAYERS (or remove the stale name)"


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    assert "attnbench.variants.softmax" in graph["attnbench.registry"]  # the graph is read
    assert cycles(graph) == []


def test_dependencies_point_down_the_layers():
    wrong = [
        f"{src} imports {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if part(src) not in ENTRY
        and part(dst) != part(src)
        and dst != "attnbench"  # the package root holds only __version__
        and (part(dst) in ENTRY or RANK[part(dst)] >= RANK[part(src)])
    ]
    assert wrong == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
