"""Checks that user code has not changed the executor's own code.

Executors are shared across tasks: a call that rebinds ``Runner._complete`` (or
any function, class attribute or collaborator of the executor) would forge the
results of every later call on that executor. ``IntegrityCheck.of(runner)`` is
taken at start-up, before any user code runs, and records by identity:

* every global of ``blockx_executor``'s modules (functions, classes, modules,
  constants), and every entry of the classes they define;
* each of those functions' code object, defaults and keyword defaults;
* the runner's own attributes that are objects it works with (socket, encoders,
  code cache, ...), and that no instance attribute shadows one of its methods.

``changed()`` compares them again (C-level ``itemgetter`` over each namespace,
then one tuple comparison) and says what differs. Under the sandbox, reading a
function's ``__code__``, ``__defaults__`` or ``__kwdefaults__`` raises an audit
event, and the sandbox's hook counts every change of them (``code_writes``):
the functions are then compared only when that count moved since the last check.
The runner runs it before each frame of results leaves; on a change it fails the
calls of that frame and the executor exits, so the pool replaces it. This is a
check inside the process, not a boundary: code that reaches the runner's frames
can still send on its socket before the check runs. What it guarantees is that a
change never outlives the calls that were running when it was made.
"""

from __future__ import annotations

import operator
import socket
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, NoReturn

from blockx_executor.protocol import CallFailed, FailureKind, FrameEncoder

_PACKAGE: Final = "blockx_executor"
# Instance attributes whose value is replaced in normal running (outboxes, counters).
_CHANGING: Final = (list, int, float, bool, tuple, str, bytes, type(None))


class ExecutorCodeChanged(Exception):
    """A call changed the executor's own code; ``str()`` says what changed."""


class _Namespace:
    """One mapping's recorded entries, read back with one ``itemgetter`` call and
    compared by identity (never ``==``: a replacement could claim to be equal)."""

    __slots__ = ("expected", "get", "keys", "label", "mapping")

    def __init__(self, label: str, mapping: Mapping[str, Any], keys: list[str]) -> None:
        self.label = label
        self.mapping = mapping
        self.keys = keys
        getter = operator.itemgetter(*keys)
        self.get: Callable[[Mapping[str, Any]], tuple[Any, ...]] = (
            getter if len(keys) > 1 else lambda m: (getter(m),)
        )
        self.expected = self.get(mapping)

    def intact(self) -> bool:
        try:
            return all(map(operator.is_, self.get(self.mapping), self.expected))
        except KeyError:
            return False

    def differences(self) -> list[str]:
        values = [self.mapping.get(key, _GONE) for key in self.keys]
        return [
            f"{self.label}.{key}"
            for key, value, before in zip(self.keys, values, self.expected, strict=True)
            if value is not before
        ]


_GONE: Final = object()


def _own(obj: Any) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and (module == _PACKAGE or module.startswith(_PACKAGE + "."))


def _functions_of(value: Any) -> Iterable[types.FunctionType]:
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    if isinstance(value, property):
        accessors = (value.fget, value.fset, value.fdel)
        yield from (f for f in accessors if isinstance(f, types.FunctionType))
    elif isinstance(value, types.FunctionType):
        yield value


class IntegrityCheck:
    def __init__(
        self,
        namespaces: list[_Namespace],
        functions: list[types.FunctionType],
        code_writes: Iterator[int] | None = None,
    ) -> None:
        self._namespaces = namespaces
        self._functions = functions
        self._code_of: Callable[[types.FunctionType], tuple[Any, Any, Any]] = operator.attrgetter(
            "__code__", "__defaults__", "__kwdefaults__"
        )
        self._code = [self._code_of(f) for f in functions]
        # The sandbox's count of code changes (None: no hook counts them, compare
        # every time), and the value it gives next when nothing changed meanwhile.
        self._code_writes = code_writes
        self._next_write = 0 if code_writes is None else next(code_writes) + 1
        self._instance: tuple[Any, frozenset[str]] | None = None
        self._instance_keys: list[str] = []
        self._instance_values: list[Any] = []

    @classmethod
    def of(cls, runner: object, code_writes: Iterator[int] | None = None) -> IntegrityCheck:
        """The check of ``runner`` and the package as they are now; ``code_writes``
        is the installed sandbox's count of code changes (``sandbox.CODE_WRITES``)."""
        namespaces: list[_Namespace] = []
        functions: dict[int, types.FunctionType] = {}
        classes: dict[int, type] = {}
        for name, module in sorted(sys.modules.items()):
            if not (name == _PACKAGE or name.startswith(_PACKAGE + ".")):
                continue
            # Every global: none of the package's changes while it runs.
            glob = vars(module)
            keys = list(glob)
            if keys:
                namespaces.append(_Namespace(name, glob, keys))
            for v in glob.values():
                if isinstance(v, type) and _own(v):
                    classes[id(v)] = v
                for f in _functions_of(v):
                    if _own(f):
                        functions[id(f)] = f
        for klass in classes.values():
            entries = klass.__dict__
            keys = [k for k in entries if k not in ("__doc__", "__weakref__", "__dict__")]
            if keys:
                namespaces.append(_Namespace(klass.__qualname__, entries, keys))
            for v in entries.values():
                for f in _functions_of(v):
                    functions[id(f)] = f
        check = cls(namespaces, list(functions.values()), code_writes)
        check._watch(runner)
        return check

    def _watch(self, runner: object) -> None:
        # The runner's collaborators; its "integrity" (this check) is compared apart,
        # since the runner is given it after the snapshot.
        attrs = vars(runner)
        self._instance_keys = [
            k for k, v in attrs.items() if k != "integrity" and not isinstance(v, _CHANGING)
        ]
        self._instance_values = [attrs[k] for k in self._instance_keys]
        methods = frozenset(k for k in dir(type(runner)) if callable(getattr(type(runner), k)))
        self._instance = (runner, methods)

    def changed(self) -> str | None:
        """None when everything recorded is as it was; else what changed."""
        changed: list[str] = []
        for namespace in self._namespaces:
            if not namespace.intact():
                changed.extend(namespace.differences())
        if self._code_changes_possible():
            code_of = self._code_of
            for function, before in zip(self._functions, self._code, strict=True):
                if not all(map(operator.is_, code_of(function), before)):
                    changed.append(f"{function.__qualname__}.__code__")
        if self._instance is not None:
            runner, methods = self._instance
            attrs = vars(runner)
            if attrs.get("integrity", self) is not self:
                changed.append("the runner's integrity check")
            shadowed = methods & attrs.keys()
            changed.extend(f"the runner's {k}" for k in sorted(shadowed))
            for key, before in zip(self._instance_keys, self._instance_values, strict=True):
                if attrs.get(key, _GONE) is not before:
                    changed.append(f"the runner's {key}")
        if not changed:
            return None
        return "the call changed the executor's own code (" + ", ".join(changed[:8]) + ")"

    def _code_changes_possible(self) -> bool:
        if self._code_writes is None:
            return True
        seen = next(self._code_writes)
        unchanged = seen == self._next_write
        self._next_write = seen + 1
        return not unchanged


def fail_and_stop(
    sock: socket.socket, send_lock: threading.Lock, outbox: list[Any], changed: str
) -> NoReturn:
    """Fail every call with an outcome in ``outbox`` (call ids and messages; any of it
    may be forged), then stop: the pool replaces the executor and retries its other
    calls elsewhere. Sent on the socket directly: the runner's methods may be what
    was changed."""
    call_ids = [m if isinstance(m, int) else getattr(m, "call_id", None) for m in outbox]
    failures = [
        CallFailed(i, FailureKind.USER_ERROR, changed, retryable=False)
        for i in dict.fromkeys(call_ids)
        if isinstance(i, int)
    ]
    with send_lock:
        sock.sendall(FrameEncoder().encode(failures))
    raise ExecutorCodeChanged(changed)
