"""The package's shape: its parts form layers, each importing only its own part and the layers
below it, and there is no import cycle.

    launch -> cli -> costreport -> bench | extrapolation | gpucheck -> api | layers | render
        -> registry -> variants -> kernels | libraries -> measure | runtime -> core

Parts on one layer do not import each other (the two experiments share only what is below them).
Inside the extrapolation experiment the stages are layered the same way:

    experiment -> analysis -> evaluation -> training -> model
Read from the source with ``ast`` (imports inside functions count too), so a cycle that only
shows at run time, or only on some import order, is caught here.

The house rules that keep the code small and the tests independent are checked here too: modules
of at most MAX_MODULE_LINES lines and functions of at most MAX_FUNCTION_LINES (Triton kernels
exempt, by name), no test module importing another (shared helpers live in ``tests/helpers/``,
shared files in ``tests/fixtures/``), and ``scripts/`` holding only what orchestrates a machine.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "attnbench"
TESTS = ROOT / "tests"

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


#: The stages of the extrapolation experiment, lowest first: each imports only itself and those
#: below it (a model knows nothing of training, training nothing of evaluation, ...).
EXTRAPOLATION_STAGES = ("model", "training", "evaluation", "analysis", "experiment")


def stage(module: str) -> str | None:
    """``attnbench.extrapolation.STAGE.x`` -> STAGE (None outside the extrapolation part)."""
    parts = module.split(".")
    return parts[2] if parts[1:2] == ["extrapolation"] and len(parts) > 2 else None


def test_every_extrapolation_module_sits_in_a_stage():
    found = {stage(m) for m in import_graph() if part(m) == "extrapolation"} - {None}
    assert found == set(EXTRAPOLATION_STAGES), "add the new stage to EXTRAPOLATION_STAGES"
    loose = [
        m
        for m in import_graph()
        if part(m) == "extrapolation" and m.count(".") == 2 and stage(m) not in found
    ]
    assert loose == [], "put the module in the stage it belongs to"


def test_extrapolation_stages_point_down():
    rank = {name: i for i, name in enumerate(EXTRAPOLATION_STAGES)}
    wrong = [
        f"{src} imports {dst}"
        for src, targets in import_graph().items()
        if stage(src) is not None
        for dst in targets
        if stage(dst) is not None and rank[stage(dst)] > rank[stage(src)]
    ]
    assert wrong == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# --------------------------------------------------------------------------------------------
# Size, test independence, scripts
# --------------------------------------------------------------------------------------------

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
TRITON = (
    "a Triton kernel module: each @triton.jit kernel is compiled whole, its tile loops and "
    "masked boundary passes written out in one function, beside the launch code that picks its "
    "tiles; split, the kernels and their launchers would be read apart"
)
#: Modules the two size limits do not hold for, by path, each with its reason.
SIZE_EXEMPT: dict[str, str] = {
    "attnbench/kernels/triton_gau.py": TRITON,
    "attnbench/kernels/triton_linear.py": TRITON,
    "attnbench/kernels/triton_retention.py": TRITON,
}
#: What ``scripts/`` may hold: what orchestrates a machine (SLURM jobs, library wheels).
SCRIPTS_ALLOWED = ("scripts/slurm/*", "scripts/fetch_library_wheels.sh")


def source_files() -> list[Path]:
    """Every Python file of the package and the tests."""
    return sorted([*PACKAGE.rglob("*.py"), *TESTS.rglob("*.py")])


def relative(path: Path) -> str:
    """``path`` from the repository's root (as given when it lies elsewhere)."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def test_modules_are_at_most_600_lines():
    long = [
        f"{relative(p)}: {n} lines"
        for p in source_files()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
        and relative(p) not in SIZE_EXEMPT
    ]
    assert long == [], f"split these modules (at most {MAX_MODULE_LINES} lines)"


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (N lines)`` for each function or method of ``path`` longer than
    ``limit`` lines (from its ``def`` to its last line)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append(f"{relative(path)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_functions_are_at_most_80_lines():
    long = [f for p in source_files() if relative(p) not in SIZE_EXEMPT for f in long_functions(p)]
    assert long == [], f"split these functions (at most {MAX_FUNCTION_LINES} lines)"


def test_the_exempt_modules_exist():
    assert [m for m in SIZE_EXEMPT if not (ROOT / m).is_file()] == []


def test_the_size_guards_find_what_is_too_long(tmp_path):
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES - 1))  # 80 with the def
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n")
    assert [line.split(" ")[1] for line in long_functions(tmp_path / "m.py", limit=80)] == []
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n    return x\n")
    assert [line.split(" ")[1] for line in long_functions(tmp_path / "m.py", limit=80)] == ["f"]


def imports_from_tests(path: Path) -> set[str]:
    """The ``tests.*`` modules ``path`` imports (inside functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tests."))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests"):
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_no_test_module_imports_another():
    """A test module imports only shared helpers (``tests.helpers``) and reads shared files from
    ``tests/fixtures/``: another test module's import runs its tests' module-level code and
    ties two files' tests together."""
    shared = ("tests.helpers", "tests.fixtures")
    wrong = [
        f"{relative(p)} imports {name}"
        for p in sorted(TESTS.rglob("*.py"))
        if not relative(p).startswith(("tests/helpers/", "tests/fixtures/"))
        for name in sorted(imports_from_tests(p))
        if not name.startswith(shared)
    ]
    assert wrong == [], "move what they share to tests/helpers/"


def test_scripts_hold_only_what_orchestrates_a_machine():
    """Everything else is a command of the tool (``attnbench ...``), tested as one."""
    import fnmatch

    present = [
        relative(p)
        for p in sorted((ROOT / "scripts").rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    ]
    stray = [p for p in present if not any(fnmatch.fnmatch(p, a) for a in SCRIPTS_ALLOWED)]
    assert stray == [], "make these commands of attnbench (or a SLURM job in scripts/slurm/)"
