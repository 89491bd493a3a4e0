"""The executor's function code: module sources by digest, compiled once on first
use, the sibling modules they import, and the functions they define, each cached
with why it cannot be called when it cannot (a module that does not compile, a
name it does not define)."""

from __future__ import annotations

import builtins
import inspect
import linecache
import os
import sys
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from blockx_executor.no_event_loop import NO_EVENT_LOOP
from blockx_executor.protocol import FailureKind, ImportedSource, LoadCode

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
    """Sources by digest; each module is loaded (its top level run) once, on first
    use, whether it is called or imported by another module.

    Each module imports its siblings (its ``LoadCode``'s package) through an
    ``__import__`` of its own (in the module's ``__builtins__``): ``import helpers``,
    ``from helpers import f``, ``from . import helpers`` and ``from .helpers import
    f`` get the sibling of the same code epoch, loaded under its digest, and any
    other import goes to Python's. Nothing is added to ``sys.path``, so two epochs'
    ``helpers`` never meet.
    """

    def __init__(self) -> None:
        self._sources: dict[str, LoadCode] = {}
        self._modules: dict[str, types.ModuleType | Unavailable] = {}
        self._functions: dict[tuple[str, str], Function | Unavailable] = {}

    def load(self, code: LoadCode) -> None:
        self._sources[code.digest] = code
        if not code.package:
            return
        # A sibling resolves its own imports in the importer's package (it reaches
        # only modules the importer reaches too, of the same epoch) and the importer
        # itself (an import cycle back to it).
        package = {**code.package, code.module: ImportedSource(code.digest, code.source)}
        for name, sibling in code.package.items():
            self._sources.setdefault(
                sibling.digest, LoadCode(sibling.digest, name, sibling.source, package)
            )

    def function(self, digest: str, name: str) -> Function | Unavailable:
        key = (digest, name)
        entry = self._functions.get(key)
        if entry is None:
            entry = self._resolve(digest, name)
            self._functions[key] = entry
        return entry

    def _resolve(self, digest: str, name: str) -> Function | Unavailable:
        module = self.module(digest)
        if isinstance(module, Unavailable):
            return module
        fn = module.__dict__.get(name)
        if fn is None or not callable(fn):
            stem = self._sources[digest].module
            return Unavailable(
                FailureKind.FUNCTION_NOT_FOUND, f"module {stem}.py defines no function {name!r}"
            )
        return Function(fn)

    def module(self, digest: str) -> types.ModuleType | Unavailable:
        """The loaded module; while its top level runs (an import cycle), the
        partly initialised module, as Python's own import gives."""
        module = self._modules.get(digest)
        if module is None:
            module = self._compile(digest)
            self._modules[digest] = module
        return module

    def _compile(self, digest: str) -> types.ModuleType | Unavailable:
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
        module.__dict__["__builtins__"] = {
            **builtins.__dict__,
            "__import__": _SiblingImporter(self, code.package or {}),
        }
        sys.modules[module.__name__] = module
        self._modules[digest] = module  # seen by an import cycle back to this module
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
        return module


class _SiblingImporter:
    """``__import__`` for a module of a package: siblings from the package, the rest
    from Python."""

    __slots__ = ("_cache", "_package")

    def __init__(self, cache: CodeCache, package: Mapping[str, ImportedSource]) -> None:
        self._cache = cache
        self._package = package

    def __call__(
        self,
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Mapping[str, Any] | None = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> types.ModuleType:
        if level == 0:
            if name in self._package:  # import helpers / from helpers import f
                return self._sibling(name)
            module = _python_import(name, globals, locals, fromlist or (), level)
            NO_EVENT_LOOP.after_import()  # asyncio may have just been imported
            return module
        if level > 1 or "." in name:
            raise ImportError(
                f"cannot import {'.' * level}{name}: FUNCTIONS_DIR is one flat package "
                "(import a sibling module as `import helpers` or `from . import helpers`)"
            )
        if name:  # from .helpers import f
            return self._sibling(name)
        # from . import helpers, other: a stand-in package holding the siblings asked for.
        package = types.ModuleType("blockx_functions")
        for sibling in fromlist or ():
            setattr(package, sibling, self._sibling(sibling))
        return package

    def _sibling(self, name: str) -> types.ModuleType:
        imported = self._package.get(name)
        if imported is None:
            raise ModuleNotFoundError(
                f"FUNCTIONS_DIR has no module {name}.py in this code epoch", name=name
            )
        module = self._cache.module(imported.digest)
        if isinstance(module, Unavailable):
            raise ImportError(module.message, name=name)
        return module


_python_import: Final = builtins.__import__


def describe(exc: BaseException) -> str:
    """``Type: message`` and the traceback from the user's first frame on."""
    tb = exc.__traceback__
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == _PACKAGE_DIR:
        tb = tb.tb_next
    headline = f"{type(exc).__name__}: {exc}"
    if tb is None and exc.__cause__ is None and exc.__context__ is None:
        return headline  # raised before any user frame ran (e.g. wrong arguments)
    report = traceback.TracebackException(type(exc), exc, tb)
    _drop_own_frames(report)
    return f"{headline}\n{''.join(report.format()).rstrip()}"


def _drop_own_frames(report: traceback.TracebackException) -> None:
    """Leave out this package's frames (its importer between two user modules)."""
    pending, seen = [report], set()
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        frames = [f for f in item.stack if os.path.dirname(f.filename) != _PACKAGE_DIR]
        item.stack = traceback.StackSummary.from_list(frames)
        pending.extend(x for x in (item.__cause__, item.__context__) if x is not None)
