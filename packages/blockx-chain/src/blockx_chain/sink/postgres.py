"""The sink on a PostgreSQL server (it may be the block database's own database).

A write holds one pooled connection in a transaction and takes a transaction-level
advisory lock per (table, block) it writes, waiting at most
``SINK_LOCK_TIMEOUT_MS``: writers of different blocks run side by side, two writers
of one block take turns, and a longer wait is retryable. NUMERIC columns are
written from Decimal and read back as decimal text; JSON columns are JSONB. A
chunk of rows is converted on the store's thread before asyncpg sends it.

A statement the server refuses as such (class 42: a name taken, a duplicate
column, no such table or column; class 54: too many columns, a row too big) fails
the same way every time: not retryable. Widening a column is ``ALTER TABLE ...
ALTER COLUMN ... TYPE``, which rewrites the table under an ACCESS EXCLUSIVE lock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from decimal import Decimal
from typing import Any, Final

import asyncpg

from blockx_chain.sink.base import DEFAULT_CHUNK_ROWS, SinkStore
from blockx_chain.sink.errors import SinkError, SinkRejected, SinkUnavailable
from blockx_chain.sink.schema import SinkType, quoted, sql_type
from blockx_chain.sink.tx import IndexInfo, SinkTx
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
_MISFITS: Final = (
    asyncpg.exceptions.IntegrityConstraintViolationError,
    asyncpg.exceptions.DataError,
)
# The statement is refused as such (a name taken, a duplicate column, too many
# columns, a change the server does not make): it fails the same way every time.
_REFUSED: Final = (
    asyncpg.exceptions.SyntaxOrAccessError,
    asyncpg.exceptions.ProgramLimitExceededError,
    asyncpg.exceptions.FeatureNotSupportedError,
)
# PostgreSQL's MaxHeapAttributeNumber.
MAX_COLUMNS: Final = 1600


@contextmanager
def _classified(description: str) -> Iterator[None]:
    try:
        yield
    except _UNREACHABLE as exc:
        raise SinkUnavailable(f"{description}: {_said(exc)}") from None
    except _MISFITS as exc:
        raise SinkRejected(f"{description}: rows that do not fit: {_said(exc)}") from None
    except _REFUSED as exc:
        raise SinkRejected(f"{description} refuses the write: {_said(exc)}") from None
    except asyncpg.PostgresError as exc:
        raise SinkError(f"{description}: {_said(exc)}") from None


def _said(exc: BaseException) -> str:
    """The error's class and text on one line (the server's DETAIL included)."""
    return f"{type(exc).__name__}: " + "; ".join(str(exc).splitlines())


def _decoded(record: asyncpg.Record) -> dict[str, Any]:
    row = dict(record)
    for name, value in row.items():
        if isinstance(value, Decimal):
            row[name] = format(value, "f")
    return row


# The indexes of the current schema with their columns in order, and their tables
# (``c`` the index, ``t`` its table, ``n`` its schema): the rest of a SELECT.
_INDEXES: Final = (
    "ARRAY(SELECT a.attname FROM unnest(i.indkey::int2[]) WITH ORDINALITY "
    "AS k(attnum, position) JOIN pg_attribute a ON a.attrelid = i.indrelid "
    "AND a.attnum = k.attnum ORDER BY k.position)::text[] AS columns "
    "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "JOIN pg_class t ON t.oid = i.indrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace"
)


class _PostgresTx(SinkTx):
    postgres = True
    max_columns = MAX_COLUMNS

    def __init__(self, conn: asyncpg.pool.PoolConnectionProxy[Any], sink: PostgresSink) -> None:
        self._conn = conn
        self._sink = sink
        self._description = sink.description

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

    async def insert(
        self, sql: str, encode: Callable[[], list[tuple[Any, ...]]], count: int
    ) -> None:
        await self.executemany(sql, await self._sink.offload(encode, count))

    async def lock(self, keys: Sequence[str]) -> None:
        with _classified(self._description):
            for key in keys:
                await self._conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key
                )

    async def taken(self, name: str) -> str | None:
        # A table's name is its row type's too; a type of its own (not a table's row
        # type, not an array type) would collide with it.
        rows = await self.fetch(
            "SELECT CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' "
            "WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'v' THEN 'view' "
            "WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence' "
            "ELSE 'relation' END AS kind "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relname = ? "
            "UNION ALL SELECT 'type' FROM pg_type t "
            "JOIN pg_namespace n ON n.oid = t.typnamespace "
            "WHERE n.nspname = current_schema() AND t.typname = ? "
            "AND t.typrelid = 0 AND t.typcategory <> 'A'",
            (name, name),
        )
        return str(rows[0]["kind"]) if rows else None

    async def widen(self, table: str, columns: Mapping[str, SinkType]) -> None:
        changes = ", ".join(
            f"ALTER COLUMN {quoted(name)} TYPE {sql_type(kind, True)}"
            for name, kind in columns.items()
        )
        try:
            await self._conn.execute(f"ALTER TABLE {quoted(table)} {changes}")
        except asyncpg.exceptions.FeatureNotSupportedError as exc:
            # A view (or rule) on the column: PostgreSQL will not change its type.
            names = ", ".join(repr(name) for name in columns)
            raise SinkRejected(
                f"{self._description}: column {names} of table {table!r} cannot be widened "
                f"while a view depends on it ({_said(exc)}): drop the view, let the write "
                "widen the column, then make the view again"
            ) from None

    async def legacy_indexes(self) -> list[IndexInfo]:
        rows = await self.fetch(
            f"SELECT c.relname AS name, t.relname AS table_name, {_INDEXES} "
            "WHERE n.nspname = current_schema() AND c.relname ~ '^(ux|ix)_[0-9a-f]{16}$'",
            (),
        )
        return [IndexInfo(r["name"], r["table_name"], list(r["columns"])) for r in rows]

    async def rename_index(self, index: IndexInfo, new_name: str, *, unique: bool) -> None:
        await self.execute(f"ALTER INDEX {quoted(index.name)} RENAME TO {quoted(new_name)}")

    async def column_names(self, table: str) -> list[str]:
        rows = await self.fetch(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position",
            (table,),
        )
        return [str(row["column_name"]) for row in rows]

    async def table_indexes(self, table: str) -> list[IndexInfo]:
        rows = await self.fetch(
            f"SELECT c.relname AS name, {_INDEXES} "
            "WHERE n.nspname = current_schema() AND t.relname = ? "
            "AND c.relname LIKE '\\_blockx\\_%'",
            (table,),
        )
        return [IndexInfo(r["name"], table, list(r["columns"])) for r in rows]


class PostgresSink(SinkStore):
    def __init__(
        self, pool: asyncpg.Pool[Any], description: str, chunk_rows: int, *, read_only: bool
    ) -> None:
        super().__init__(description, chunk_rows=chunk_rows, read_only=read_only)
        self._pool = pool

    @classmethod
    async def open(
        cls,
        url: PostgresUrl,
        *,
        pool_size: int = POOL_SIZE,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        read_only: bool = False,
    ) -> PostgresSink:
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
        return cls(pool, description, chunk_rows, read_only=read_only)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SinkTx]:
        with _classified(self.description):
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {SINK_LOCK_TIMEOUT_MS}")
                yield _PostgresTx(conn, self)

    async def _close(self) -> None:
        await self._pool.close()
