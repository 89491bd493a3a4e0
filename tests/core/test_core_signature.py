"""Signatures from source and the Precheck decision: tables, no code is run.

Every signature case is also checked against ``inspect.signature`` of the same
source compiled for real, so "as Python prints it" is Python's own answer.
"""

from __future__ import annotations

import inspect
from textwrap import dedent
from typing import Any

import pytest

from blockx_core.code_view import build_snapshot
from blockx_core.failures import PrecheckFailure
from blockx_core.signature import (
    DECORATED_NOTE,
    PrecheckResult,
    find_function,
    precheck,
    signature_from_ast,
)

SIGNATURES = [
    # (source, how its f's signature prints)
    ("def f(): pass", "()"),
    ("def f(name): pass", "(name)"),
    ("def f(name, count=1): pass", "(name, count=1)"),
    ("def f(a, b=2, /, c=3): pass", "(a, b=2, /, c=3)"),
    ("def f(a, /): pass", "(a, /)"),
    ("def f(*args): pass", "(*args)"),
    ("def f(**kwargs): pass", "(**kwargs)"),
    ("def f(a, *args, key, flag=False, **kw): pass", "(a, *args, key, flag=False, **kw)"),
    ("def f(*, key): pass", "(*, key)"),
    ("def f(x='a', y=None, z=(1, 2)): pass", "(x='a', y=None, z=(1, 2))"),
    ("def f(x: int, y: 'str' = 'a') -> dict: pass", "(x: int, y: 'str' = 'a') -> dict"),
    ("def f(x: list[int] = []) -> None: pass", "(x: list[int] = []) -> None"),
    ("def f(*args: int, **kw: str): pass", "(*args: int, **kw: str)"),
    ("async def f(block, *, full=False): pass", "(block, *, full=False)"),
    ("def f(x=-1, y=1e3, z={'k': 1}): pass", "(x=-1, y=1000.0, z={'k': 1})"),
]


def _real_signature(source: str) -> str:
    namespace: dict[str, Any] = {}
    # dont_inherit: this module's `from __future__ import annotations` would
    # turn the case's annotations into strings.
    exec(compile(source, "<case>", "exec", dont_inherit=True), namespace)
    return str(inspect.signature(namespace["f"]))


@pytest.mark.parametrize(("source", "expected"), SIGNATURES)
def test_signature_from_ast_prints_like_python(source: str, expected: str) -> None:
    node = find_function(source, "f")
    assert node is not None
    shown = str(signature_from_ast(node))
    assert shown == expected
    assert shown == _real_signature(source)


def test_a_default_that_is_a_name_prints_as_written() -> None:
    # Python would print the value (10); without running the module, the source is all.
    node = find_function("LIMIT = 10\ndef f(n=LIMIT): pass\n", "f")
    assert node is not None
    assert str(signature_from_ast(node)) == "(n=LIMIT)"


BINDS = [
    # (def line, positional args, None when they bind, else words of the TypeError)
    ("def f(name, count=1): pass", ["x"], None),
    ("def f(name, count=1): pass", ["x", 2], None),
    ("def f(name, count=1): pass", [], "missing a required argument: 'name'"),
    ("def f(name, count=1): pass", ["x", 2, 3], "too many positional arguments"),
    ("def f(a, /, b): pass", [1, 2], None),
    ("def f(*args): pass", [1, 2, 3, 4], None),
    ("def f(a, *, key): pass", [1], "missing a required argument: 'key'"),
    ("def f(a, *, key=0): pass", [1], None),
    ("def f(a, *, key=0): pass", [1, 2], "too many positional arguments"),
    ("def f(**kw): pass", [], None),
    ("def f(**kw): pass", [1], "too many positional arguments"),
]


@pytest.mark.parametrize(("source", "args", "error"), BINDS)
def test_bind_matches_python(source: str, args: list[Any], error: str | None) -> None:
    node = find_function(source, "f")
    assert node is not None
    signature = signature_from_ast(node)
    if error is None:
        signature.bind(*args)
    else:
        with pytest.raises(TypeError, match=error):
            signature.bind(*args)


def test_the_last_definition_wins_and_nested_defs_are_not_found() -> None:
    source = dedent("""
        def f(a):
            def inner(b):
                pass
        def f(a, b):
            pass
    """)
    node = find_function(source, "f")
    assert node is not None
    assert str(signature_from_ast(node)) == "(a, b)"
    assert find_function(source, "inner") is None


SOURCES = {
    "fns": dedent("""
        def named(name, count=1):
            raise RuntimeError("never run")

        async def fetch(block, *, full=False):
            return block

        def deco(f):
            return f

        @deco
        def wrapped(x):
            return x

        def _private(x):
            return x
    """),
    "explodes": 'raise RuntimeError("top level")\n\ndef quiet(x):\n    return x\n',
    "broken": "def broken_fn(x:\n    return x\n\nasync def also_broken():\n    pass\n",
}
SNAPSHOT = build_snapshot(3, SOURCES)

PRECHECKS = [
    # (function, args, expected)
    ("named", None, PrecheckResult(epoch=3, signature="(name, count=1)")),
    ("named", ["x"], PrecheckResult(epoch=3, signature="(name, count=1)")),
    (
        "named",
        ["x", 1, 2],
        PrecheckResult(
            epoch=3,
            failure=PrecheckFailure.SIGNATURE_MISMATCH,
            message="named(name, count=1) cannot take 3 positional arguments: "
            "too many positional arguments",
            signature="(name, count=1)",
        ),
    ),
    (
        "named",
        [],
        PrecheckResult(
            epoch=3,
            failure=PrecheckFailure.SIGNATURE_MISMATCH,
            message="named(name, count=1) cannot take 0 positional arguments: "
            "missing a required argument: 'name'",
            signature="(name, count=1)",
        ),
    ),
    ("fetch", [1], PrecheckResult(epoch=3, signature="(block, *, full=False)", is_async=True)),
    ("wrapped", [1, 2], PrecheckResult(epoch=3, signature="(x)", message=DECORATED_NOTE)),
    ("quiet", [1], PrecheckResult(epoch=3, signature="(x)")),
    (
        "nope",
        [],
        PrecheckResult(
            epoch=3,
            failure=PrecheckFailure.FUNCTION_NOT_FOUND,
            message=SNAPSHOT.describe_missing("nope"),
        ),
    ),
    (
        "_private",
        [1],
        PrecheckResult(
            epoch=3,
            failure=PrecheckFailure.FUNCTION_NOT_FOUND,
            message=SNAPSHOT.describe_missing("_private"),
        ),
    ),
    (
        "broken_fn",
        [1],
        PrecheckResult(
            epoch=3,
            failure=PrecheckFailure.COMPILE_ERROR,
            message="broken.py does not compile (SyntaxError at line 1: '(' was never closed); "
            "'broken_fn' is defined there and cannot be called until it does",
        ),
    ),
    (
        "also_broken",
        None,
        PrecheckResult(
            epoch=3,
            failure=PrecheckFailure.COMPILE_ERROR,
            message="broken.py does not compile (SyntaxError at line 1: '(' was never closed); "
            "'also_broken' is defined there and cannot be called until it does",
        ),
    ),
]


@pytest.mark.parametrize(("function", "args", "expected"), PRECHECKS)
def test_precheck(function: str, args: list[Any] | None, expected: PrecheckResult) -> None:
    assert precheck(SNAPSHOT, function, args) == expected
    assert expected.ok is (expected.failure is None)


def test_a_name_in_a_broken_module_needs_a_top_level_def() -> None:
    # Mentioned, indented or commented: not a definition, so not COMPILE_ERROR.
    snapshot = build_snapshot(
        1, {"broken": "x = (\n    def_me = 1\n# def ghost(\n  def ghost(x):\n"}
    )
    for function in ("def_me", "ghost"):
        answer = precheck(snapshot, function, [])
        assert answer.failure is PrecheckFailure.FUNCTION_NOT_FOUND, function
