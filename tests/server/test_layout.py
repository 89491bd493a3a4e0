"""The shape of blockx_server: process folders wire subsystems and never import
each other, subsystems never import a process folder, and no module imports
itself back through a cycle (in any package of the workspace)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[2] / "packages"
SERVER = PACKAGES / "blockx-server" / "src" / "blockx_server"
PROCESSES = ("coordinator", "worker", "syncinvoker", "proxy")
SUBSYSTEMS = ("runtime", "etcd", "calls", "io", "pipeline")


def _module_name(path: Path) -> str:
    src = next(parent for parent in path.parents if parent.name == "src")
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_imports(path: Path) -> set[str]:
    """Modules imported when ``path`` runs (``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("blockx_")}


def _graph() -> dict[str, set[str]]:
    paths = [p for p in PACKAGES.glob("*/src/blockx_*/**/*.py") if "_gen" not in p.parts]
    modules = {_module_name(p): p for p in paths}
    return {name: _runtime_imports(path) & modules.keys() for name, path in modules.items()}


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "blockx_server" and len(parts) > 2 else None


@pytest.mark.parametrize("process", PROCESSES)
def test_a_process_folder_imports_no_other_process_folder(process: str) -> None:
    wrong = {
        module: sorted(name for name in imports if _folder(name) in set(PROCESSES) - {process})
        for module, imports in _graph().items()
        if _folder(module) == process
    }
    assert {module: names for module, names in wrong.items() if names} == {}


def test_subsystems_import_no_process_folder() -> None:
    wrong = {
        module: sorted(name for name in imports if _folder(name) in PROCESSES)
        for module, imports in _graph().items()
        if _folder(module) in SUBSYSTEMS
    }
    assert {module: names for module, names in wrong.items() if names} == {}


def test_the_top_level_of_blockx_server_lists_subsystems() -> None:
    modules = sorted(p.name for p in SERVER.glob("*.py") if p.name != "__init__.py")
    folders = sorted(p.name for p in SERVER.iterdir() if (p / "__init__.py").exists())
    assert modules == []
    assert folders == sorted(SUBSYSTEMS + PROCESSES)


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components over module-level imports; a package's
    ``__init__`` re-exporting its own modules is not a cycle."""
    graph = _graph()
    edges = {
        module: {
            name for name in imports if not (module + ".").startswith(name + ".") or name == module
        }
        - {module}
        for module, imports in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert cycles == []
