"""The sink on a PostgreSQL server (it may be the block database's own database).

A write holds one pooled connection in a transaction and takes a transaction-level
advisory lock per (table, block) it writes, waiting at most
``SINK_LOCK_TIMEOUT_MS``: writers of different blocks run side by side, two writers
of one block take turns, and a longer wait is retryable. NUMERIC columns are
written from Decimal and read back as decimal text; JSON columns are JSONB.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from decimal import Decimal
from typing import Any, Final

import asyncpg

from blockx_chain.sink.base import SinkStore, SinkTx
from blockx_chain.sink.errors import SinkError, SinkRejected, SinkUnavailable
from blockx_chain.store.postgres import UNREACHABLE, numbered
from blockx_chain.url import PostgresUrl, describe

SINK_LOCK_TIMEOUT_MS: Final = 10_000
POOL_SIZE: Final = 4
_CONNECT_TIMEOUT_S: Final = 10.0

_UNREACHABLE: Final = (
    *UNREACHABLE,
    # A lock not granted in time, a deadlock broken by the server: try again.
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.QueryCanceledError,
    asyncpg.exceptions.SerializationError,
)
# The rows themselves do not fit: the same rows fail the same way every time.
_REJECTED: Final = (
    asyncpg.exceptions.IntegrityConstraintViolationError,
    asyncpg.exceptions.DataError,
)


@contextmanager
def _classified(description: str) -> Iterator[None]:
    try:
        yield
    except _UNREACHABLE as exc:
        raise SinkUnavailable(f"{description}: {type(exc).__name__}: {exc}") from None
    except _REJECTED as exc:
        raise SinkRejected(f"{description}: rows that do not fit: {exc}") from None
    except asyncpg.PostgresError as exc:
        raise SinkError(f"{description}: {type(exc).__name__}: {exc}") from None


def _decoded(record: asyncpg.Record) -> dict[str, Any]:
    row = dict(record)
    for name, value in row.items():
        if isinstance(value, Decimal):
            row[name] = format(value, "f")
    return row


class _PostgresTx(SinkTx):
    postgres = True

    def __init__(self, conn: asyncpg.pool.PoolConnectionProxy[Any], description: str) -> None:
        self._conn = conn
        self._description = description

    async def fetch(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        with _classified(self._description):
            return [_decoded(r) for r in await self._conn.fetch(numbered(sql), *params)]

    async def execute(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        with _classified(self._description):
            await self._conn.execute(numbered(sql), *params)

    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            with _classified(self._description):
                await self._conn.executemany(numbered(sql), rows)

    async def lock(self, keys: Sequence[str]) -> None:
        with _classified(self._description):
            for key in keys:
                await self._conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key
                )


class PostgresSink(SinkStore):
    def __init__(self, pool: asyncpg.Pool[Any], description: str) -> None:
        super().__init__(description)
        self._pool = pool

    @classmethod
    async def open(cls, url: PostgresUrl, *, pool_size: int = POOL_SIZE) -> PostgresSink:
        description = describe(url)
        try:
            pool = await asyncpg.create_pool(
                url.dsn,
                min_size=1,
                max_size=pool_size,
                timeout=_CONNECT_TIMEOUT_S,
                # Tables change shape under running writers (ALTER TABLE ... ADD
                # COLUMN): a cached plan would fail inside the next transaction.
                statement_cache_size=0,
            )
        except (*_UNREACHABLE, asyncpg.PostgresError) as exc:
            raise SinkUnavailable(f"{description} is unreachable: {exc}") from None
        return cls(pool, description)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SinkTx]:
        with _classified(self.description):
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {SINK_LOCK_TIMEOUT_MS}")
                yield _PostgresTx(conn, self.description)

    async def close(self) -> None:
        await self._pool.close()
