"""``localtestservice``: the backend that serves a call record (a fixture) back.

When a call runs in replay (``blockx_server.calls.replay``), every backend name it
uses (``blockdb``, ``rpc``, ``meta``, ``router``, ``memory``, any name) is served
by this backend from the record's IO (``blockx_core.call_record.RecordedAnswers``):
the call sees exactly the answers recorded, an error recorded is raised in the
function as that ``IoError`` kind, and a request the record does not hold fails
``NOT_FOUND`` naming the request. ``ReplayRouter`` is the IO router built for
replay: whatever a request names, it reaches this backend, with no cache, no
chain and no check of the operation (the record decides what exists).

A request is looked up by what the function asked (``io.<backend>.<op>(*args,
**kwargs)``), keyword order aside; identical requests get their answers in the
order recorded. ``io.meta.code_epoch()`` is one exception: the task's scope fills
in the pinned epoch as its argument, so it is looked up by its operation alone.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from blockx_core.call_record import CallRecord, RecordedAnswers, RecordedIo
from blockx_core.failures import IoErrorKind
from blockx_core.io import CacheKey, canonical_arguments
from blockx_server.io.backends.meta import CODE_EPOCH_OP, META
from blockx_server.io.errors import BackendError, IoFailed
from blockx_server.io.router import ROUTER, ROUTER_CHAIN_OP, IoRouter, Prepared
from blockx_server.io.settings import IoSettings

LOCALTESTSERVICE: Final = "localtestservice"

# How much of a request's arguments a NOT_FOUND message shows, and how many of
# the requests the record does hold it lists.
MAX_REQUEST_TEXT: Final = 200
MAX_LISTED: Final = 5


class LocalTestService:
    """The answers of one record. ``answer`` answers one request of any backend;
    ``as_backend(name)`` is the backend ``io.<name>`` for the router. ``served`` and
    ``missing`` count the requests answered from the record and those it lacks."""

    def __init__(self, io: list[RecordedIo], *, truncated: bool = False) -> None:
        self._io = io
        self._answers = RecordedAnswers(io)
        # io.meta.code_epoch() by its operation alone (see the module docstring).
        self._code_epoch = RecordedAnswers(
            [
                msgspec.structs.replace(e, args=[], kwargs={})
                for e in io
                if (e.backend, e.op) == (META, CODE_EPOCH_OP)
            ]
        )
        self._truncated = truncated
        self.served = 0
        self.missing = 0

    @classmethod
    def of(cls, record: CallRecord) -> LocalTestService:
        return cls(record.io, truncated=record.truncated)

    def answer(self, backend: str, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """The recorded answer; BackendError for a recorded error or a request the
        record does not hold (NOT_FOUND)."""
        if (backend, op) == (META, CODE_EPOCH_OP):
            entry = self._code_epoch.answer(backend, op, [], {})
        else:
            entry = self._answers.answer(backend, op, args, kwargs)
        if entry is None:
            self.missing += 1
            raise BackendError(IoErrorKind.NOT_FOUND, self._not_held(backend, op, args, kwargs))
        self.served += 1
        if entry.error is not None:
            raise BackendError(entry.error.kind, entry.error.message)
        return entry.answer

    def as_backend(self, name: str) -> ServedBackend:
        return ServedBackend(name, self)

    def _not_held(self, backend: str, op: str, args: list[Any], kwargs: dict[str, Any]) -> str:
        asked = request_text(backend, op, args, kwargs)
        if self._truncated:
            why = (
                "the record is truncated (its IO outgrew CALL_RECORD_MAX_BYTES), "
                "so the requests after that point are missing"
            )
        else:
            why = "the call asks what the recorded call did not"
        held = [request_text(e.backend, e.op, e.args, e.kwargs) for e in self._io[:MAX_LISTED]]
        more = len(self._io) - len(held)
        listed = ", ".join(held) + (f" and {more} more" if more > 0 else "")
        return (
            f"{LOCALTESTSERVICE}: the fixture holds no answer to {asked}: {why} "
            f"(it holds {len(self._io)} requests{': ' + listed if held else ''})"
        )


class ServedBackend:
    """``io.<name>`` in replay: every operation is a read the service answers."""

    read_ops: frozenset[str] = frozenset()
    write_ops: frozenset[str] = frozenset()

    def __init__(self, name: str, service: LocalTestService) -> None:
        self.name = name
        self._service = service

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        return self._service.answer(self.name, op, args, kwargs)

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        """Never cached: each replay serves its own record."""
        return False


class ReplayRouter(IoRouter):
    """An IO router whose every backend name is served by ``service``: no chain,
    no cache, no check of the operation (what the record holds exists)."""

    def __init__(self, service: LocalTestService) -> None:
        super().__init__(settings=IoSettings(cache_max_bytes=0))
        self.service = service
        self._add_gate(LOCALTESTSERVICE)

    def prepare(
        self,
        backend_name: str,
        op: str,
        args: list[Any],
        kwargs: dict[str, Any],
        *,
        writes: bool,
        chain: str | None = None,
    ) -> Prepared | IoFailed:
        key = CacheKey(backend_name, op, canonical_arguments(args, kwargs), 0)
        backend = self.service.as_backend(backend_name)
        return Prepared(backend, op, args, kwargs, False, key, False, LOCALTESTSERVICE)

    def names(self) -> list[str]:
        return [LOCALTESTSERVICE]


def request_text(backend: str, op: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    """``io.blockdb.block(123)`` (``io.router.chain('base').blockdb.block(5)``), its
    arguments cut to MAX_REQUEST_TEXT characters."""
    if (backend, op) == (ROUTER, ROUTER_CHAIN_OP) and len(args) >= 3:
        chain, inner, inner_op, *args = args
        return f"io.router.chain({chain!r})." + request_text(inner, inner_op, args, kwargs)[3:]
    arguments = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
    if len(arguments) > MAX_REQUEST_TEXT:
        arguments = arguments[: MAX_REQUEST_TEXT - 3] + "..."
    return f"io.{backend}.{op}({arguments})"
