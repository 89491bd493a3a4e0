"""``io.logicalTypes``: decoded events and calls, by the ABIs registered in the block
database (``blockx chain abi add``).

Reads:

* ``decode_log(log_row)`` -> ``{"name", "signature", "args"}``, or None when no
  registered ABI matches the log (counted: ``blockx_io_logs_undecoded_total``);
* ``decode_logs(log_rows, abi=None, event=None)`` -> a list of the same, one per row
  (``abi`` and ``event``: match that event alone, as the Builders' ``unit: "event"``);
* ``decode_input(transaction_row)`` -> ``{"function", "signature", "args"}`` or None;
* ``decode(types, data)`` -> the values of ``data`` (0x hex) as ``types`` (a list of
  ABI type strings);
* ``event(abi, event)`` -> ``{"abi", "name", "signature", "topic0", "anonymous",
  "topics", "addresses"}`` of a registered event (BAD_REQUEST naming the registered
  ABIs or the ABI's events when there is none);
* ``abis()`` -> the registry: ``[{"name", "addresses", "events", "functions"}]``.

Values are plain (``blockx_chain.abi.decoder`` says how each ABI type comes out).
Data that does not decode as the types say, a malformed row or type is BAD_REQUEST
with one line naming what is wrong.

The backend reads the registry of its chain's block database (the chain's
``io.blockdb``). It looks for a change at most every ``refresh_ms`` (one tiny
query: the registry's row count and highest revision) and re-reads the ABIs only
after one, so ABIs added while the Worker runs are used without a restart;
``event`` always looks, so a task started after ``abi add`` sees the new ABI.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from blockx_core.failures import IoErrorKind
from blockx_server.io.backends.arguments import bind_arguments
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.errors import BackendError

if TYPE_CHECKING:
    from blockx_chain.abi.decoder import Decoder, EventDecoder

DEFAULT_REFRESH_MS: Final = 1000
# decode_logs of more rows than this runs on a thread.
_INLINE_ROWS: Final = 64


class LogicalTypesBackend:
    name = "logicalTypes"
    read_ops = frozenset({"decode_log", "decode_logs", "decode_input", "decode", "event", "abis"})
    write_ops: frozenset[str] = frozenset()

    def __init__(
        self,
        blockdb: BlockDbBackend,
        *,
        refresh_ms: int = DEFAULT_REFRESH_MS,
        monotonic_ms: Callable[[], float] = lambda: time.monotonic() * 1000,
    ) -> None:
        self.blockdb = blockdb
        self.refresh_ms = refresh_ms
        self._now_ms = monotonic_ms
        self._decoder: Decoder | None = None
        self._revision: tuple[int, int] | None = None
        self._checked_ms: float | None = None
        self._loading = asyncio.Lock()
        # Logs asked about: decoded, and that no registered ABI matched.
        self.logs_decoded = 0
        self.logs_undecoded = 0

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        """Never cached: an answer depends on the registry, which may change."""
        return False

    async def decoder(self, *, fresh: bool = False) -> Decoder:
        """The decoder of the registry as it is now (looked at most every
        ``refresh_ms``, or now when ``fresh``)."""
        now = self._now_ms()
        due = (
            fresh
            or self._decoder is None
            or self._checked_ms is None
            or now - self._checked_ms >= self.refresh_ms
        )
        if not due and self._decoder is not None:
            return self._decoder
        async with self._loading:
            revision = await self.blockdb.abis_revision()
            if self._decoder is None or revision != self._revision:
                self._decoder = await self._load()
                self._revision = revision
            self._checked_ms = now
            return self._decoder

    async def _load(self) -> Decoder:
        from blockx_chain.abi.decoder import Decoder, RegisteredAbi  # the ABI library: here
        from blockx_chain.abi.spec import AbiError, entries_from_stored

        abis = []
        for record in await self.blockdb.abis():
            try:
                entries = entries_from_stored(record.abi, f"registered ABI {record.name!r}")
            except AbiError as exc:
                # ``abi add`` checks every ABI; one edited by hand is left out, loudly.
                raise BackendError(IoErrorKind.UNAVAILABLE, f"io.logicalTypes: {exc}") from None
            abis.append(RegisteredAbi(record.name, tuple(entries), frozenset(record.addresses)))
        return Decoder(abis)

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        from blockx_chain.abi.decoder import DecodeFailure, UnknownEvent, decode

        try:
            match op:
                case "decode_log":
                    (row,) = bind_arguments(args, kwargs, "decode_log(log_row)", ("log_row",))
                    found = (await self.decoder()).decode_log(_row(row, "decode_log"))
                    self._count([found])
                    return found
                case "decode_logs":
                    rows, abi, event = bind_arguments(
                        args,
                        kwargs,
                        "decode_logs(log_rows, abi=None, event=None)",
                        ("log_rows",),
                        ("abi", "event"),
                    )
                    return await self._decode_logs(rows, abi, event)
                case "decode_input":
                    (row,) = bind_arguments(
                        args, kwargs, "decode_input(transaction_row)", ("transaction_row",)
                    )
                    return (await self.decoder()).decode_input(_row(row, "decode_input"))
                case "decode":
                    types, data = bind_arguments(
                        args, kwargs, "decode(types, data)", ("types", "data")
                    )
                    return decode(types, data)
                case "event":
                    abi, event = bind_arguments(args, kwargs, "event(abi, event)", ("abi", "event"))
                    return await self._event(abi, event)
                case "abis":
                    bind_arguments(args, kwargs, "abis()", ())
                    return _listing(await self.decoder(fresh=True))
        except DecodeFailure as exc:
            raise BackendError(IoErrorKind.BAD_REQUEST, f"io.logicalTypes.{op}: {exc}") from None
        except UnknownEvent as exc:
            raise BackendError(IoErrorKind.BAD_REQUEST, f"io.logicalTypes.{op}: {exc}") from None
        raise BackendError(IoErrorKind.UNKNOWN_OP, op)

    async def _decode_logs(self, rows: Any, abi: Any, event: Any) -> list[dict[str, Any] | None]:
        if not isinstance(rows, list):
            raise TypeError("decode_logs(log_rows: list, abi=None, event=None)")
        # One snapshot of the registry for the whole batch.
        decoder = await self.decoder()
        only: list[EventDecoder] | None = None
        if abi is not None or event is not None:
            if not isinstance(abi, str) or not isinstance(event, str):
                raise TypeError("decode_logs: abi and event name one event, both strings")
            if abi not in decoder.abis:
                decoder = await self.decoder(fresh=True)  # added since the last look?
            only = decoder.events(abi, event)

        def decode_all() -> list[dict[str, Any] | None]:
            return [decoder.decode_log(_row(row, "decode_logs"), only) for row in rows]

        # A Builder's chunk of thousands of logs is decoded off the event loop, so the
        # calls of the chunk before go on being dispatched meanwhile.
        found = decode_all() if len(rows) <= _INLINE_ROWS else await asyncio.to_thread(decode_all)
        self._count(found)
        return found

    async def _event(self, abi: Any, event: Any) -> dict[str, Any]:
        if not isinstance(abi, str) or not isinstance(event, str):
            raise TypeError("event(abi: str, event: str)")
        decoder = await self.decoder(fresh=True)
        found = decoder.events(abi, event)
        first = found[0]
        return {
            "abi": abi,
            "name": first.name,
            "signature": [e.signature for e in found],
            "topic0": [e.topic0 for e in found if e.topic0 is not None],
            "anonymous": any(e.topic0 is None for e in found),
            "topics": sorted({e.topic_count for e in found}),
            "addresses": sorted(decoder.abis[abi].addresses),
        }

    def _count(self, found: list[dict[str, Any] | None]) -> None:
        missed = found.count(None)
        self.logs_undecoded += missed
        self.logs_decoded += len(found) - missed


def _row(row: Any, op: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise TypeError(f"{op}: a row is a dict of its columns, got {type(row).__name__}")
    return row


def _listing(decoder: Decoder) -> list[dict[str, Any]]:
    return [
        {
            "name": abi.name,
            "addresses": sorted(abi.addresses),
            "events": [e.signature for e in abi.entries if e.type == "event"],
            "functions": [e.signature for e in abi.entries if e.type == "function"],
        }
        for abi in decoder.abis.values()
    ]
