"""Precheck a function against a local ``FUNCTIONS_DIR``, loading its module the way
a call would (``blockx precheck --functions DIR``).

The Sync Invoker's Precheck never runs user code, so it cannot see a module whose
top level fails (a missing package, a bad constant, a helper that raises). Here the
directory is read as the Worker reads it, checked as Precheck checks it, and then
the function's module is loaded with its sibling imports in a child process
(:func:`blockx_executor.load_check.check_load`), bounded in time.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import msgspec

from blockx_core.code_view import CodeLoadError, FunctionSource, build_snapshot
from blockx_core.signature import precheck
from blockx_executor.load_check import DEFAULT_TIMEOUT_S, check_load
from blockx_executor.protocol import ImportedSource, LoadCode
from blockx_server.calls.functions import DirectoryFunctionStore

__all__ = ["DEFAULT_TIMEOUT_S", "DirectoryPrecheck", "load_code", "precheck_directory"]


class DirectoryPrecheck(msgspec.Struct, frozen=True, kw_only=True):
    """``failure_code`` is empty when ok. ``loaded`` says the module's top level ran
    to the end; ``message`` is one line, ``detail`` the whole report."""

    failure_code: str = ""
    message: str = ""
    detail: str = ""
    signature: str = ""
    is_async: bool = False
    loaded: bool = False

    @property
    def ok(self) -> bool:
        return not self.failure_code


def load_code(source: FunctionSource) -> LoadCode:
    """The executor's LoadCode for a module of a snapshot, its package included."""
    package = {n: ImportedSource(i.digest, i.source) for n, i in source.package.items()}
    return LoadCode(source.digest, source.module, source.source, package or None)


async def precheck_directory(
    directory: str | os.PathLike[str],
    function: str,
    args: Sequence[Any] | None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> DirectoryPrecheck:
    """Would ``function(*args)`` start with the code in ``directory``? ``args`` None
    skips the argument check. Raises FunctionStoreError when the directory cannot
    be read."""
    sources = await DirectoryFunctionStore(directory).load()
    try:
        snapshot = build_snapshot(1, sources)
    except CodeLoadError as exc:
        return DirectoryPrecheck(failure_code="COMPILE_ERROR", message=str(exc), detail=str(exc))
    checked = precheck(snapshot, function, args)
    if not checked.ok:
        assert checked.failure is not None
        return DirectoryPrecheck(
            failure_code=checked.failure.value, message=checked.message, detail=checked.message
        )
    source = snapshot.resolve(function)
    assert source is not None  # precheck found it
    verdict = await asyncio.to_thread(check_load, load_code(source), function, timeout_s)
    return DirectoryPrecheck(
        failure_code=verdict.kind,
        message=verdict.message or checked.message,
        detail=verdict.detail or checked.message,
        signature=checked.signature,
        is_async=checked.is_async,
        loaded=verdict.ok,
    )
