"""The package's shape: dependencies point one way, and there is no import cycle.

    cli -> bench, extrapolation -> api, layers, registry -> variants, kernels, libraries -> spec,
    measure

Read from the source with ``ast`` (imports inside functions count too), so a cycle that only
shows at run time, or only on some import order, is caught here.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "attnbench"

#: Top-level parts of the package and the parts each must never import.
_ABOVE_RECORDS = (
    "registry", "api", "layers", "variants", "kernels", "libraries", "bench", "extrapolation"
)  # fmt: skip
FORBIDDEN = {
    "spec": (*_ABOVE_RECORDS, "cli"),
    "sources": (*_ABOVE_RECORDS, "cli"),
    "measure": ("registry", "api", "layers", "variants", "bench", "extrapolation", "cli"),
    "kernels": ("registry", "api", "layers", "variants", "bench", "extrapolation", "cli"),
    "libraries": ("registry", "api", "layers", "variants", "bench", "extrapolation", "cli"),
    "variants": ("registry", "api", "layers", "bench", "extrapolation", "cli"),
    "registry": ("api", "layers", "bench", "extrapolation", "cli"),
    "api": ("layers", "bench", "extrapolation", "cli"),
    "layers": ("bench", "extrapolation", "cli"),
    "bench": ("extrapolation", "cli"),
    "extrapolation": ("bench", "cli"),
}


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


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    assert "attnbench.variants.softmax" in graph["attnbench.registry"]  # the graph is read
    assert cycles(graph) == []


def test_dependencies_point_one_way():
    wrong = [
        f"{src} imports {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if part(dst) in FORBIDDEN.get(part(src), ())
    ]
    assert wrong == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
