"""The shape of blockx_server: process folders wire subsystems and never import
each other, subsystems never import a process folder, and no module imports
itself back through a cycle (in any package of the workspace)."""

from __future__ import annotations

import ast
from collections.abc import Mapping
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


def _modules() -> dict[str, Path]:
    paths = [p for p in PACKAGES.glob("*/src/blockx_*/**/*.py") if "_gen" not in p.parts]
    return {_module_name(p): p for p in paths}


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
    modules = _modules()
    return {name: _runtime_imports(path) & modules.keys() for name, path in modules.items()}


def _every_import(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The workspace modules ``module`` imports, as a reader counts them: at the top,
    under ``TYPE_CHECKING`` and inside functions alike, relative imports resolved.
    ``from X import name`` imports ``X.name`` when that is a module, else ``X``
    (a package's ``__init__``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                name = f"{base}.{alias.name}"
                found.add(name if name in modules else base)
    return (found & modules.keys()) - {module}


def import_circles() -> list[list[str]]:
    """Every strongly connected component (Tarjan) of more than one module in the
    graph of ``_every_import``, each sorted, in order."""
    modules = _modules()
    edges = {name: sorted(_every_import(name, path, modules)) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

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
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(circles)


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


def test_no_import_circles() -> None:
    """No module imports itself back, counting every import a reader sees: at the
    top, under ``TYPE_CHECKING`` and inside functions."""
    assert import_circles() == []


IMPORT_CASES = [
    # (source of blockx_x/pkg/mod.py, the modules it imports)
    ("import blockx_x.a", {"blockx_x.a"}),
    ("from blockx_x import a", {"blockx_x.a"}),
    ("from blockx_x import A", {"blockx_x"}),
    ("from blockx_x.pkg import A", {"blockx_x.pkg"}),
    ("from . import b", {"blockx_x.pkg.b"}),
    ("from .b import B", {"blockx_x.pkg.b"}),
    ("from .. import a", {"blockx_x.a"}),
    ("from ..a import A", {"blockx_x.a"}),
    ("if TYPE_CHECKING:\n    from blockx_x.a import A", {"blockx_x.a"}),
    ("def f() -> None:\n    from blockx_x.pkg.b import B", {"blockx_x.pkg.b"}),
    ("import os\nfrom blockx_x.pkg import mod", set()),
]


@pytest.mark.parametrize(("source", "expected"), IMPORT_CASES)
def test_every_import_counts_what_a_reader_sees(
    tmp_path: Path, source: str, expected: set[str]
) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    modules = {
        name: tmp_path / f"{name}.py"
        for name in ("blockx_x", "blockx_x.a", "blockx_x.pkg", "blockx_x.pkg.b")
    }
    modules["blockx_x.pkg.mod"] = path
    assert _every_import("blockx_x.pkg.mod", path, modules) == expected
