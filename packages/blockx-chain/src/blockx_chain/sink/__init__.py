"""The sink database: where Writer Plugins write the rows functions return.

``await open_sink(url)`` for either engine (the block database's URL forms; the
sink may be the block database itself). ``replace_blocks``, ``upsert`` and
``delete_blocks`` are its writes, ``rows`` and ``written`` (the ``_blockx_written``
ledger) its reads; see ``blockx_chain.sink.base``.
"""

from __future__ import annotations

from blockx_chain.sink.base import DEFAULT_BLOCK_KEY, SinkStore
from blockx_chain.sink.errors import SinkError, SinkRejected, SinkUnavailable
from blockx_chain.sink.schema import LEDGER, SinkType
from blockx_chain.url import BlockDbUrl, PostgresUrl, SqliteUrl

__all__ = [
    "DEFAULT_BLOCK_KEY",
    "LEDGER",
    "SinkError",
    "SinkRejected",
    "SinkStore",
    "SinkType",
    "SinkUnavailable",
    "open_sink",
]


async def open_sink(url: BlockDbUrl) -> SinkStore:
    """The sink at ``url``; its tables are made by the first write that needs them."""
    match url:
        case SqliteUrl(path):
            from blockx_chain.sink.sqlite import SqliteSink

            return await SqliteSink.open(path)
        case PostgresUrl():
            from blockx_chain.sink.postgres import PostgresSink

            return await PostgresSink.open(url)
