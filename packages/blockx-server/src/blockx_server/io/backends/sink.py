"""``io.sink``: the sink database (``SINK_DB_URL``), written only by Writer Plugins.

Writes, no reads: ``replace_blocks(table, chain_id, blocks, key=None,
columns=None, code_epoch=0, task_id="", now_ms=0, sink_identity=None,
claim_unmarked=False, code_digest=None, code_sources=None)`` with ``blocks`` a
list of ``[block_number, block_hash, rows]`` of the chain ``chain_id``, and
``upsert(table, rows, key, columns=None, sink_identity=None, code_digest=None,
code_sources=None, code_epoch=0, task_id="", now_ms=0)`` (see
``blockx_chain.sink``). ``code_digest`` and ``code_sources`` (``{module:
source}``) are the task's module set, which the sink keeps with the task
(``blockx_chain.sink.code``); a caller that gives neither records no code. A
function's scope is read-only, so the router refuses both with WRITE_FORBIDDEN
before they reach the database.

Failures: rows that do not fit their table, a column type that cannot change so,
a refused or taken table name, code arguments that are no digest and sources, a
statement the database refuses as such (too many columns, a duplicate name), a
sink whose identity is not ``sink_identity`` and a sink whose rows do not say
their chain yet (without ``claim_unmarked``) are BAD_REQUEST (not retryable); an
unreachable database, a lock not granted in time and any unclassified database
error are UNAVAILABLE
(retryable). The store is opened at start-up when it can be, and again on the
next write when it could not; a write inserts its rows ``chunk_rows`` at a time
(SINK_WRITE_CHUNK_ROWS), off the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Final

from blockx_chain.sink import DEFAULT_CHUNK_ROWS, SinkError, SinkRejected, SinkStore, open_sink
from blockx_chain.url import BlockDbUrl, describe
from blockx_core.failures import IoErrorKind
from blockx_server.io.errors import BackendError

log = logging.getLogger(__name__)

WRITES: Final = ("replace_blocks", "upsert")
_SIGNATURES: Final = {
    op: inspect.signature(getattr(SinkStore, op)).replace(
        parameters=list(inspect.signature(getattr(SinkStore, op)).parameters.values())[1:]
    )
    for op in WRITES
}


class SinkBackend:
    name = "sink"
    read_ops: frozenset[str] = frozenset()
    write_ops = frozenset(WRITES)

    def __init__(self, url: BlockDbUrl, *, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> None:
        self.url = url
        self.chunk_rows = chunk_rows
        self._store: SinkStore | None = None
        self._opening = asyncio.Lock()

    async def start(self) -> None:
        """Open the store now; an unreachable database is logged and retried on first use."""
        try:
            await self._opened()
        except SinkError as exc:
            log.warning("io.sink: %s; writes answer UNAVAILABLE until it answers", exc)

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None

    async def _opened(self) -> SinkStore:
        async with self._opening:
            if self._store is None:
                self._store = await open_sink(self.url, chunk_rows=self.chunk_rows)
                log.info("io.sink writes %s", describe(self.url))
            return self._store

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        signature = _SIGNATURES.get(op)
        if signature is None:
            raise BackendError(IoErrorKind.UNKNOWN_OP, op)
        bound = signature.bind(*args, **kwargs)  # TypeError: BAD_REQUEST
        try:
            store = await self._opened()
            return await getattr(store, op)(*bound.args, **bound.kwargs)
        except SinkRejected as exc:
            raise BackendError(IoErrorKind.BAD_REQUEST, f"io.sink.{op}: {exc}") from None
        except SinkError as exc:
            raise BackendError(IoErrorKind.UNAVAILABLE, f"io.sink.{op}: {exc}") from None

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        return False
