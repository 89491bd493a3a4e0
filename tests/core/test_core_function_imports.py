"""Which sibling modules a module imports, and the digests executors load them by."""

from __future__ import annotations

import ast
import hashlib

import pytest

from blockx_core.code_view import FunctionCodeView, build_snapshot
from blockx_core.function_imports import import_closures, sibling_imports

SIBLINGS = {"main", "helpers", "util", "other"}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import helpers", {"helpers"}),
        ("import helpers.sub, json", {"helpers"}),
        ("from helpers import f", {"helpers"}),
        ("from . import helpers, util", {"helpers", "util"}),
        ("from .util import f", {"util"}),
        ("def f():\n    import other\n", {"other"}),
        ("import json\nfrom os import path", set()),
        ("import main", set()),  # itself
        ("from ..helpers import f", set()),  # outside the directory
    ],
)
def test_sibling_imports(source: str, expected: set[str]) -> None:
    assert sibling_imports(ast.parse(source), "main", SIBLINGS) == expected


def test_closures_are_transitive_and_survive_cycles() -> None:
    closures = import_closures({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()})
    assert closures == {
        "a": frozenset({"b", "c"}),
        "b": frozenset({"a", "c"}),
        "c": frozenset({"a", "b"}),
        "d": frozenset(),
    }


def test_a_module_carries_what_it_imports_and_is_digested_with_it() -> None:
    sources = {"main": "import helpers\n\ndef f():\n    return helpers.X\n", "helpers": "X = 1\n"}
    snapshot = build_snapshot(1, sources)
    main, helper = snapshot.modules["main"], snapshot.modules["helpers"]
    assert list(main.package) == ["helpers"]
    assert main.package["helpers"].source == "X = 1\n"
    # A module importing no sibling keeps the plain sha256 of its source.
    assert helper.digest == hashlib.sha256(b"X = 1\n").hexdigest()
    assert main.package["helpers"].digest == helper.digest
    assert main.digest != hashlib.sha256(sources["main"].encode()).hexdigest()
    changed = build_snapshot(2, {**sources, "helpers": "X = 2\n"})
    assert changed.modules["main"].digest != main.digest
    assert build_snapshot(3, sources).modules["main"].digest == main.digest


def test_modules_of_an_import_cycle_load_under_digests_of_their_own() -> None:
    snapshot = build_snapshot(1, {"a": "import b\n", "b": "import a\n"})
    assert snapshot.modules["a"].digest != snapshot.modules["b"].digest


def test_unchanged_sources_with_imports_make_no_new_epoch() -> None:
    view = FunctionCodeView(retention_ms=0)
    sources = {"main": "import helpers\n", "helpers": "X = 1\n"}
    assert view.publish(sources, 0) is not None
    assert view.publish(dict(sources), 1) is None
