"""Imports between function modules: which sibling modules a module's code reaches.

``FUNCTIONS_DIR`` is one flat package: a module may import another one of the same
directory as ``import helpers``, ``from helpers import f``, ``from . import helpers``
or ``from .helpers import f``, at its top level or inside a function. The Worker
finds these statements in the source (no import, no execution) and sends each
module to the executor together with every sibling its imports reach, directly or
through other siblings, all of the same code epoch. A call in epoch N therefore
sees epoch N's helpers even after the files change.

Only import statements count: ``importlib.import_module("helpers")`` and
``__import__`` with a computed name are not followed.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Mapping


def sibling_imports(tree: ast.Module, module: str, siblings: Collection[str]) -> set[str]:
    """The modules of ``siblings`` that ``module``'s import statements name."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module is not None:
                found.add(node.module.partition(".")[0])
            elif node.level == 1 and node.module is None:
                found.update(alias.name for alias in node.names)
            elif node.level == 1 and node.module is not None:
                found.add(node.module.partition(".")[0])
    found.discard(module)
    return {name for name in found if name in siblings}


def import_closures(direct: Mapping[str, set[str]]) -> dict[str, frozenset[str]]:
    """For each module, every other module its imports reach (transitively)."""
    closures: dict[str, frozenset[str]] = {}
    for module in direct:
        seen: set[str] = set()
        pending = list(direct[module])
        while pending:
            name = pending.pop()
            if name in seen or name == module:
                continue
            seen.add(name)
            pending.extend(direct.get(name, ()))
        closures[module] = frozenset(seen)
    return closures
