"""The executor's function code: module sources by digest, compiled once on first
use, and the functions they define, each cached with why it cannot be called when
it cannot (a module that does not compile, a name it does not define)."""

from __future__ import annotations

import inspect
import linecache
import os
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any, Final

from blockx_executor.protocol import FailureKind, LoadCode

# Tracebacks start at the user's first frame: frames of this package are skipped.
_PACKAGE_DIR: Final = os.path.dirname(os.path.abspath(__file__))


class Unavailable:
    """Why a function cannot be called (cached like a function)."""

    __slots__ = ("kind", "message")

    def __init__(self, kind: FailureKind, message: str) -> None:
        self.kind = kind
        self.message = message


class Function:
    __slots__ = ("fn", "is_async")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn)


class CodeCache:
    def __init__(self) -> None:
        self._sources: dict[str, LoadCode] = {}
        self._modules: dict[str, dict[str, Any] | Unavailable] = {}
        self._functions: dict[tuple[str, str], Function | Unavailable] = {}

    def load(self, code: LoadCode) -> None:
        self._sources[code.digest] = code

    def function(self, digest: str, name: str) -> Function | Unavailable:
        key = (digest, name)
        entry = self._functions.get(key)
        if entry is None:
            entry = self._resolve(digest, name)
            self._functions[key] = entry
        return entry

    def _resolve(self, digest: str, name: str) -> Function | Unavailable:
        namespace = self._modules.get(digest)
        if namespace is None:
            namespace = self._compile(digest)
            self._modules[digest] = namespace
        if isinstance(namespace, Unavailable):
            return namespace
        fn = namespace.get(name)
        if fn is None or not callable(fn):
            module = self._sources[digest].module
            return Unavailable(
                FailureKind.FUNCTION_NOT_FOUND, f"module {module}.py defines no function {name!r}"
            )
        return Function(fn)

    def _compile(self, digest: str) -> dict[str, Any] | Unavailable:
        code = self._sources.get(digest)
        if code is None:
            return Unavailable(FailureKind.COMPILE_ERROR, f"no source loaded for digest {digest}")
        filename = f"{code.module}.py"
        # Tracebacks show the user's source lines.
        linecache.cache[filename] = (
            len(code.source),
            None,
            code.source.splitlines(keepends=True),
            filename,
        )
        module = types.ModuleType(f"blockx_functions.{code.module}_{digest[:12]}")
        module.__file__ = filename
        sys.modules[module.__name__] = module
        try:
            compiled = compile(code.source, filename, "exec")
            exec(compiled, module.__dict__)
        except SyntaxError as exc:
            return Unavailable(
                FailureKind.COMPILE_ERROR,
                f"{filename} does not compile: {exc.msg} (line {exc.lineno}, column {exc.offset})",
            )
        except BaseException as exc:
            return Unavailable(
                FailureKind.COMPILE_ERROR,
                f"{filename} failed while loading: {describe(exc)}",
            )
        return module.__dict__


def describe(exc: BaseException) -> str:
    """``Type: message`` and the traceback from the user's first frame on."""
    tb = exc.__traceback__
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == _PACKAGE_DIR:
        tb = tb.tb_next
    headline = f"{type(exc).__name__}: {exc}"
    if tb is None and exc.__cause__ is None and exc.__context__ is None:
        return headline  # raised before any user frame ran (e.g. wrong arguments)
    text = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()
    return f"{headline}\n{text}"
