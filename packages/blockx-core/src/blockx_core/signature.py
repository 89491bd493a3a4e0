"""Function signatures read from source, and the Sync Invoker's Precheck decision.

Nothing here imports or runs user code. :func:`signature_from_ast` turns a ``def``
node into the :class:`inspect.Signature` Python would report for it: defaults and
annotations are kept as their source text, so ``str()`` prints them as written,
e.g. ``(name, count=1)`` or ``(block: int, *, full: bool = False) -> dict``.

:func:`precheck` answers "would ``function(*args)`` start in this code epoch?":
the function exists, its module compiles, and the arguments bind to its
signature. What it cannot see without running code is said in
``docs/sync-invoker.md`` (a module whose top level raises, a decorator that
changes the signature).
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from blockx_core.code_view import CodeSnapshot
from blockx_core.failures import PrecheckFailure

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


class _SourceText:
    """Stands for an expression by its source text: ``repr()`` is that text, which
    is how ``inspect.Signature`` prints a default or an annotation."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _text(node: ast.expr | None) -> Any:
    if node is None:
        return inspect.Parameter.empty
    return _SourceText(ast.unparse(node))


def signature_from_ast(node: FunctionNode) -> inspect.Signature:
    """The signature of ``def``/``async def`` ``node``, as Python would report it."""
    a = node.args
    params: list[inspect.Parameter] = []
    positional = [*a.posonlyargs, *a.args]
    # Defaults belong to the last positional parameters (positional-only included).
    first_default = len(positional) - len(a.defaults)
    for index, arg in enumerate(positional):
        kind = (
            inspect.Parameter.POSITIONAL_ONLY
            if index < len(a.posonlyargs)
            else inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        default = _text(a.defaults[index - first_default]) if index >= first_default else None
        params.append(
            inspect.Parameter(
                arg.arg,
                kind,
                default=inspect.Parameter.empty if default is None else default,
                annotation=_text(arg.annotation),
            )
        )
    if a.vararg is not None:
        params.append(
            inspect.Parameter(
                a.vararg.arg,
                inspect.Parameter.VAR_POSITIONAL,
                annotation=_text(a.vararg.annotation),
            )
        )
    for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append(
            inspect.Parameter(
                arg.arg,
                inspect.Parameter.KEYWORD_ONLY,
                default=_text(kw_default),
                annotation=_text(arg.annotation),
            )
        )
    if a.kwarg is not None:
        params.append(
            inspect.Parameter(
                a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, annotation=_text(a.kwarg.annotation)
            )
        )
    return inspect.Signature(params, return_annotation=_text(node.returns))


@functools.lru_cache(maxsize=256)
def _top_level_defs(source: str) -> dict[str, FunctionNode]:
    """Top-level defs by name (the last definition wins, as at import). Cached by
    source text: a snapshot's modules are immutable and precheck is called often."""
    tree = ast.parse(source)
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def find_function(source: str, name: str) -> FunctionNode | None:
    """The top-level ``def`` of ``name`` in a module's source; raises SyntaxError."""
    return _top_level_defs(source).get(name)


class PrecheckResult(msgspec.Struct, frozen=True, kw_only=True):
    """``failure`` is None when ok. ``message`` explains a failure, or notes what
    was not checked (a decorated function's arguments)."""

    epoch: int
    failure: PrecheckFailure | None = None
    message: str = ""
    signature: str = ""
    is_async: bool = False

    @property
    def ok(self) -> bool:
        return self.failure is None


DECORATED_NOTE: Final = (
    "arguments not checked: the function is decorated, and a decorator may change "
    "the signature it is called with"
)


def _broken_definer(snapshot: CodeSnapshot, function: str) -> tuple[str, str] | None:
    """(module, parse error) of a module that does not parse but seems to define
    ``function`` at top level. It cannot be parsed, so a line match is the best
    evidence; it only picks the failure code, never makes a precheck pass."""
    pattern = re.compile(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(function)}[ \t]*\(", re.M)
    for module in sorted(snapshot.parse_errors):
        if pattern.search(snapshot.modules[module].source):
            return module, snapshot.parse_errors[module]
    return None


def precheck(snapshot: CodeSnapshot, function: str, args: Sequence[Any] | None) -> PrecheckResult:
    """Would ``function(*args)`` start in ``snapshot``? ``args`` None skips the
    argument check. Never imports or runs the module."""
    epoch = snapshot.epoch
    source = snapshot.resolve(function)
    if source is None:
        broken = _broken_definer(snapshot, function)
        if broken is not None:
            module, error = broken
            return PrecheckResult(
                epoch=epoch,
                failure=PrecheckFailure.COMPILE_ERROR,
                message=(
                    f"{module}.py does not compile ({error}); {function!r} is defined there "
                    "and cannot be called until it does"
                ),
            )
        return PrecheckResult(
            epoch=epoch,
            failure=PrecheckFailure.FUNCTION_NOT_FOUND,
            message=snapshot.describe_missing(function),
        )
    try:
        node = find_function(source.source, function)
    except SyntaxError as exc:  # the snapshot compiled it, so this is not expected
        return PrecheckResult(
            epoch=epoch,
            failure=PrecheckFailure.COMPILE_ERROR,
            message=f"{source.module}.py does not compile: {exc}",
        )
    if node is None:
        # The snapshot lists it, so it is defined; guard against drift all the same.
        return PrecheckResult(
            epoch=epoch,
            failure=PrecheckFailure.FUNCTION_NOT_FOUND,
            message=snapshot.describe_missing(function),
        )
    signature = signature_from_ast(node)
    shown = str(signature)
    is_async = isinstance(node, ast.AsyncFunctionDef)
    if args is None:
        return PrecheckResult(epoch=epoch, signature=shown, is_async=is_async)
    if node.decorator_list:
        return PrecheckResult(
            epoch=epoch, signature=shown, is_async=is_async, message=DECORATED_NOTE
        )
    try:
        signature.bind(*args)
    except TypeError as exc:
        return PrecheckResult(
            epoch=epoch,
            failure=PrecheckFailure.SIGNATURE_MISMATCH,
            message=f"{function}{shown} cannot take {len(args)} positional argument"
            f"{'' if len(args) == 1 else 's'}: {exc}",
            signature=shown,
            is_async=is_async,
        )
    return PrecheckResult(epoch=epoch, signature=shown, is_async=is_async)
