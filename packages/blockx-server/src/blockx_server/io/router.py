"""The IO backends of a process, by name, and the one place a request meets one.

A backend declares its read and write operations; the router refuses an
unknown backend or operation, and a write from a scope that may not write,
before the backend sees the request. It times the backend and encodes its answer
as JSON. Callers do not use it directly: every request goes through a
``TaskIoScope`` (``blockx_server.io.scope``).
"""

from __future__ import annotations

import time
from typing import Any, Final, Protocol

import msgspec

from blockx_server.io.errors import BackendError, IoErrorKind, IoOutcome, failure


class IoBackend(Protocol):
    """One backend: ``io.<name>.<op>(*args, **kwargs)`` reaches ``serve(op, args, kwargs)``.

    ``serve`` raises BackendError for a failure a function should see, and TypeError or
    ValueError for arguments it cannot use (BAD_REQUEST).
    """

    name: str
    read_ops: frozenset[str]
    write_ops: frozenset[str]

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any: ...


_json = msgspec.json.Encoder()

# Backends a process has only when a setting names their peer.
_ENABLED_BY: Final = {"blockdb": "BLOCKDB_URL"}


class IoRouter:
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

    async def execute(
        self,
        backend_name: str,
        op: str,
        args: list[Any],
        kwargs: dict[str, Any],
        *,
        writes: bool,
    ) -> IoOutcome:
        """Serve one request; ``writes`` says whether the caller may write."""
        backend = self._backends.get(backend_name)
        if backend is None:
            known = ", ".join(self.names()) or "none"
            hint = _ENABLED_BY.get(backend_name)
            setup = f"; set {hint} to enable io.{backend_name}" if hint else ""
            return failure(
                IoErrorKind.UNKNOWN_BACKEND,
                f"no IO backend {backend_name!r} (known: {known}){setup}",
            )
        if op in backend.write_ops:
            if not writes:
                return failure(
                    IoErrorKind.WRITE_FORBIDDEN,
                    f"io.{backend_name}.{op} is a write, and functions are read-only: return "
                    "the data and let the task's Writer Plugin (result handler) write it",
                )
        elif op not in backend.read_ops:
            reads = ", ".join(sorted(backend.read_ops))
            return failure(
                IoErrorKind.UNKNOWN_OP,
                f"io.{backend_name} has no operation {op!r} (reads: {reads})",
            )
        started = time.perf_counter_ns()
        try:
            value = await backend.serve(op, args, kwargs)
        except BackendError as exc:
            return failure(exc.kind, exc.message, _since_us(started))
        except (TypeError, ValueError) as exc:
            return failure(
                IoErrorKind.BAD_REQUEST,
                f"io.{backend_name}.{op}{_call_text(args, kwargs)}: {exc}",
                _since_us(started),
            )
        io_us = _since_us(started)
        try:
            return IoOutcome(True, _json.encode(value), io_us=io_us)
        except (TypeError, ValueError) as exc:
            return failure(IoErrorKind.BAD_VALUE, str(exc), io_us)


def _since_us(started_ns: int) -> int:
    return (time.perf_counter_ns() - started_ns) // 1000


def _call_text(args: list[Any], kwargs: dict[str, Any]) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"({', '.join(parts)})"
