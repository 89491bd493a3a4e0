"""Access to the block database: ``await open_store(url)`` for either engine.

The reads functions see (``head``, ``block``, ``blocks``, ``transactions``,
``logs``, ``erc20_transfers``), ``chain()`` for finality, and ``writer()`` for
ingest; see ``blockx_chain.store.base``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from blockx_chain.store.errors import (
    ChainMismatch,
    NotHeld,
    SchemaRefused,
    StoreError,
    StoreUnavailable,
    TooManyRows,
    WriterBusy,
)
from blockx_chain.store.reads import DEFAULT_MAX_ROWS
from blockx_chain.url import BlockDbUrl, PostgresUrl, SqliteUrl

if TYPE_CHECKING:
    from blockx_chain.store.base import BlockStore, BlockWriter

# The store's classes load on first use: the errors and the row tables (what the
# CLI's help names) do not load the store and asyncio.
_MODULES: dict[str, str] = {
    "BlockStore": "blockx_chain.store.base",
    "BlockWriter": "blockx_chain.store.base",
}


def __getattr__(name: str) -> object:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEFAULT_MAX_ROWS",
    "BlockStore",
    "BlockWriter",
    "ChainMismatch",
    "NotHeld",
    "SchemaRefused",
    "StoreError",
    "StoreUnavailable",
    "TooManyRows",
    "WriterBusy",
    "open_store",
]


async def open_store(
    url: BlockDbUrl, *, max_rows: int = DEFAULT_MAX_ROWS, read_only: bool = False
) -> BlockStore:
    """The block database at ``url``, opened and migrated to this BlockX's schema.

    ``read_only``, for whatever only reads (backfill, follow, the Worker's
    io.blockdb): a SQLite file is opened read-only and never created; a missing one
    is StoreUnavailable "no block database at PATH". PostgreSQL creates no file
    and is opened as for a writer."""
    match url:
        case SqliteUrl(path):
            from blockx_chain.store.sqlite import SqliteStore

            return await SqliteStore.open(path, max_rows=max_rows, read_only=read_only)
        case PostgresUrl():
            from blockx_chain.store.postgres import PostgresStore

            return await PostgresStore.open(url, max_rows=max_rows)
