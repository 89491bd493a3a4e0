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

from blockx_chain.sink.base import DEFAULT_BLOCK_KEY, DEFAULT_CHUNK_ROWS, SinkStore
from blockx_chain.sink.code import BlockCode, WriteKind, WrittenCode
from blockx_chain.sink.errors import SinkError, SinkMismatch, SinkRejected, SinkUnavailable
from blockx_chain.sink.jobs import JobEntry
from blockx_chain.sink.schema import LEDGER, SinkType
from blockx_chain.url import BlockDbUrl, PostgresUrl, SqliteUrl

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
    url: BlockDbUrl, *, chunk_rows: int = DEFAULT_CHUNK_ROWS, read_only: bool = False
) -> SinkStore:
    """The sink at ``url``; its tables are made by the first write that needs them.
    A write inserts its rows ``chunk_rows`` at a time (within its one transaction).
    ``read_only``: a store that only reads the job records (``jobs``) and makes
    nothing, not even a missing SQLite file (SinkUnavailable: no sink database)."""
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
