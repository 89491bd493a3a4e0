"""Dependencies point one way: cli → client + drive + server + chain, client → core +
proto + executor (a function handle makes sub-calls inside a BlockX function;
the executor depends on nothing), drive → client + core + proto + chain (backfill
and follow read the block database and the sink ledger), server → core + proto +
executor + chain, chain → core, testing → server + core + executor (it replays calls
in the server's executors); core and executor depend on nothing here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[2] / "packages"
OURS = {
    "blockx_chain",
    "blockx_cli",
    "blockx_client",
    "blockx_core",
    "blockx_drive",
    "blockx_executor",
    "blockx_proto",
    "blockx_server",
    "blockx_testing",
}
ALLOWED = {
    "blockx_cli": {"blockx_client", "blockx_drive", "blockx_server", "blockx_core", "blockx_chain"},
    "blockx_client": {"blockx_core", "blockx_proto", "blockx_executor"},
    "blockx_drive": {"blockx_client", "blockx_core", "blockx_proto", "blockx_chain"},
    "blockx_server": {"blockx_core", "blockx_proto", "blockx_executor", "blockx_chain"},
    "blockx_chain": {"blockx_core"},
    "blockx_testing": {"blockx_server", "blockx_core", "blockx_executor"},
    "blockx_core": set(),
    "blockx_executor": set(),
}


def _imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_what_it_depends_on(package: str) -> None:
    sources = sorted(PACKAGES.glob(f"*/src/{package}/**/*.py"))
    assert sources
    wrong = {
        str(path.relative_to(PACKAGES)): sorted(_imported(path) - ALLOWED[package] - {package})
        for path in sources
    }
    assert {path: names for path, names in wrong.items() if names} == {}
