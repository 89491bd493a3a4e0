"""The sink database: where Writer Plugins write the rows functions return.

``await open_sink(url)`` for either engine (the block database's URL forms; the
sink may be the block database itself). ``replace_blocks``, ``upsert`` and
``delete_blocks`` are its writes, ``rows`` and ``written`` (the ``_blockx_written``
ledger) its reads, ``identity`` the random id that tells it from every other sink,
``put_job`` and ``jobs`` the drivers' job records (``blockx_chain.sink.jobs``),
``code_of``, ``code_of_task`` and ``code_by_digest`` the code that wrote the
rows (``blockx_chain.sink.code``);
see ``blockx_chain.sink.base``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from blockx_chain.sink.errors import SinkError, SinkMismatch, SinkRejected, SinkUnavailable
from blockx_chain.sink.schema import LEDGER, SinkType
from blockx_chain.url import BlockDbUrl, PostgresUrl, SqliteUrl

if TYPE_CHECKING:
    from blockx_chain.sink.base import DEFAULT_BLOCK_KEY, DEFAULT_CHUNK_ROWS, SinkStore
    from blockx_chain.sink.code import BlockCode, WriteKind, WrittenCode
    from blockx_chain.sink.jobs import JobEntry

# The store's names load on first use: the errors and the column types (what
# ``blockx backfill --help`` shows) do not load the store and asyncio.
_MODULES: dict[str, str] = {
    "DEFAULT_BLOCK_KEY": "blockx_chain.sink.base",
    "DEFAULT_CHUNK_ROWS": "blockx_chain.sink.base",
    "SinkStore": "blockx_chain.sink.base",
    "BlockCode": "blockx_chain.sink.code",
    "WriteKind": "blockx_chain.sink.code",
    "WrittenCode": "blockx_chain.sink.code",
    "JobEntry": "blockx_chain.sink.jobs",
}


def __getattr__(name: str) -> object:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEFAULT_BLOCK_KEY",
    "DEFAULT_CHUNK_ROWS",
    "LEDGER",
    "BlockCode",
    "JobEntry",
    "SinkError",
    "SinkMismatch",
    "SinkRejected",
    "SinkStore",
    "SinkType",
    "SinkUnavailable",
    "WriteKind",
    "WrittenCode",
    "open_sink",
    "read_identity",
]


async def open_sink(
    url: BlockDbUrl, *, chunk_rows: int | None = None, read_only: bool = False
) -> SinkStore:
    """The sink at ``url``; its tables are made by the first write that needs them.
    A write inserts its rows ``chunk_rows`` (default ``DEFAULT_CHUNK_ROWS``) at a time
    (within its one transaction). ``read_only``: a store that only reads the job
    records (``jobs``) and makes nothing, not even a missing SQLite file
    (SinkUnavailable: no sink database)."""
    from blockx_chain.sink.base import DEFAULT_CHUNK_ROWS

    if chunk_rows is None:
        chunk_rows = DEFAULT_CHUNK_ROWS
    match url:
        case SqliteUrl(path):
            from blockx_chain.sink.sqlite import SqliteSink

            return await SqliteSink.open(path, chunk_rows=chunk_rows, read_only=read_only)
        case PostgresUrl():
            from blockx_chain.sink.postgres import PostgresSink

            return await PostgresSink.open(url, chunk_rows=chunk_rows, read_only=read_only)


async def read_identity(url: BlockDbUrl) -> str:
    """The identity of the sink at ``url`` (made now if it has none yet): what a
    driver puts into its writer's config, so that a Worker writing another sink
    refuses the task."""
    sink = await open_sink(url)
    try:
        return await sink.identity()
    finally:
        await sink.close()
