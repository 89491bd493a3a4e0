"""The Worker side of a function's IO: one registry of backends, the single entry point.

An executor's ``IoRequested(backend, op, args)`` comes here; the answer goes back
in a ``ResumeCall`` with the backend time, which is charged to the call's budget.
Functions are read-only: each backend declares its read and write operations, and
a write is refused before it reaches the backend (the call then fails
WRITE_FORBIDDEN). This step has one backend, ``memory``; the read cache, task
singleflight, IO windows, adaptive admission and the real data backends of a later
step grow from this registry.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec


class IoErrorKind(enum.StrEnum):
    UNKNOWN_BACKEND = "UNKNOWN_BACKEND"
    UNKNOWN_OP = "UNKNOWN_OP"
    BAD_REQUEST = "BAD_REQUEST"
    WRITE_FORBIDDEN = "WRITE_FORBIDDEN"
    UNAVAILABLE = "UNAVAILABLE"
    BAD_VALUE = "BAD_VALUE"


class BackendError(Exception):
    """Raised by a backend; ``kind`` is what the function sees as ``IoError.kind``."""

    def __init__(self, kind: IoErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class IoBackend(Protocol):
    name: str
    read_ops: frozenset[str]
    write_ops: frozenset[str]

    async def read(self, op: str, args: list[Any]) -> Any: ...


class IoOutcome(msgspec.Struct, frozen=True):
    ok: bool
    value_json: bytes = b"null"
    error_kind: str = ""
    error: str = ""
    io_us: int = 0

    @property
    def write_forbidden(self) -> bool:
        return self.error_kind == IoErrorKind.WRITE_FORBIDDEN


_json = msgspec.json.Encoder()


class IoRegistry:
    def __init__(self, backends: list[IoBackend] | None = None) -> None:
        self._backends: dict[str, IoBackend] = {}
        for backend in backends or []:
            self.register(backend)

    def register(self, backend: IoBackend) -> None:
        if backend.name in self._backends:
            raise ValueError(f"IO backend {backend.name!r} is registered twice")
        self._backends[backend.name] = backend

    def names(self) -> list[str]:
        return sorted(self._backends)

    async def execute(self, backend_name: str, op: str, args: list[Any]) -> IoOutcome:
        backend = self._backends.get(backend_name)
        if backend is None:
            known = ", ".join(self.names()) or "none"
            return IoOutcome(
                False,
                error_kind=IoErrorKind.UNKNOWN_BACKEND,
                error=f"no IO backend {backend_name!r} (known: {known})",
            )
        if op in backend.write_ops:
            return IoOutcome(
                False,
                error_kind=IoErrorKind.WRITE_FORBIDDEN,
                error=(
                    f"io.{backend_name}.{op} is a write, and functions are read-only: return "
                    "the data and let the task's Writer Plugin (result handler) write it"
                ),
            )
        if op not in backend.read_ops:
            reads = ", ".join(sorted(backend.read_ops))
            return IoOutcome(
                False,
                error_kind=IoErrorKind.UNKNOWN_OP,
                error=f"io.{backend_name} has no operation {op!r} (reads: {reads})",
            )
        started = time.perf_counter_ns()
        try:
            value = await backend.read(op, args)
        except BackendError as exc:
            return IoOutcome(
                False, error_kind=exc.kind, error=exc.message, io_us=_since_us(started)
            )
        except (TypeError, ValueError) as exc:
            return IoOutcome(
                False,
                error_kind=IoErrorKind.BAD_REQUEST,
                error=f"io.{backend_name}.{op}{tuple(args)!r}: {exc}",
                io_us=_since_us(started),
            )
        io_us = _since_us(started)
        try:
            return IoOutcome(True, _json.encode(value), io_us=io_us)
        except (TypeError, ValueError) as exc:
            return IoOutcome(False, error_kind=IoErrorKind.BAD_VALUE, error=str(exc), io_us=io_us)


def _since_us(started_ns: int) -> int:
    return (time.perf_counter_ns() - started_ns) // 1000


class MemoryBackend:
    """``io.memory``: reads of an in-memory key -> value map (JSON-compatible values).

    Reads: ``get(key, default=None)``, ``mget(keys)``, ``has(key)``,
    ``keys(prefix="")``. ``put``/``set``/``delete`` exist only to be refused.
    Seed it from a mapping or a JSON object file (``IO_MEMORY_SEED_FILE``).
    """

    name = "memory"
    read_ops = frozenset({"get", "mget", "has", "keys"})
    write_ops = frozenset({"put", "set", "delete", "mput"})

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = dict(data or {})

    @classmethod
    def from_file(cls, path: Path) -> MemoryBackend:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read memory seed {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"memory seed {path} must hold a JSON object")
        return cls(data)

    def seed(self, data: Mapping[str, Any]) -> None:
        """For tests and configuration; not reachable from functions."""
        self._data.update(data)

    async def read(self, op: str, args: list[Any]) -> Any:
        if op == "get":
            if not 1 <= len(args) <= 2:
                raise TypeError("get(key, default=None)")
            return self._data.get(_key(args[0]), args[1] if len(args) == 2 else None)
        if op == "mget":
            if len(args) != 1 or not isinstance(args[0], list):
                raise TypeError("mget(keys: list)")
            return [self._data.get(_key(k)) for k in args[0]]
        if op == "has":
            if len(args) != 1:
                raise TypeError("has(key)")
            return _key(args[0]) in self._data
        if op == "keys":
            prefix = args[0] if args else ""
            if not isinstance(prefix, str):
                raise TypeError("keys(prefix: str = '')")
            return sorted(k for k in self._data if k.startswith(prefix))
        raise BackendError(IoErrorKind.UNKNOWN_OP, op)


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"keys are strings, got {type(key).__name__}")
    return key


class TaskIoScope:
    """A task's view of the IO registry, opened at activation and closed at convergence.

    Builders and Writer Plugins read through it; the later IO subsystem hangs the
    task's singleflight and IO windows here.
    """

    def __init__(self, registry: IoRegistry, task_id: str) -> None:
        self._registry = registry
        self.task_id = task_id
        self._closed = False

    async def read(self, backend: str, op: str, args: list[Any]) -> IoOutcome:
        if self._closed:
            return IoOutcome(
                False, error_kind=IoErrorKind.UNAVAILABLE, error="the task's IO scope is closed"
            )
        return await self._registry.execute(backend, op, args)

    def close(self) -> None:
        self._closed = True
