"""The block database on a PostgreSQL server, through an asyncpg pool.

asyncpg prepares each statement once per connection and reuses it (its statement
cache), and loads rows with COPY, about three times faster than INSERTs. A writer
holds one pooled connection in a transaction and takes a transaction-level
advisory lock without waiting: a second writer fails at once with WriterBusy.
Each writer's transaction ends with ``NOTIFY blockx_blocks``, delivered at its
commit to the readers that ``LISTEN`` (``changes()``).
uint256 columns are NUMERIC(78,0): written as decimal text (asyncpg's encoder
makes the Decimal), read back as decimal strings.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from decimal import Decimal
from typing import Any, Final

import asyncpg

from blockx_chain.schema import (
    BLOCK_TABLES,
    MIGRATIONS,
    SCHEMA_VERSION,
    TABLES,
    Engine,
    SchemaError,
    refuse_existing_tables,
)
from blockx_chain.store.base import BlockStore, BlockWriter
from blockx_chain.store.errors import SchemaRefused, StoreError, StoreUnavailable, WriterBusy
from blockx_chain.store.reads import DEFAULT_MAX_ROWS
from blockx_chain.url import PostgresUrl, describe
from blockx_core.backoff import Backoff

_log = logging.getLogger(__name__)

# Advisory lock keys (any two distinct bigints): one for writers, one for migrations.
WRITER_LOCK: Final = 0x626C6B7857
MIGRATION_LOCK: Final = 0x626C6B784D
POOL_SIZE: Final = 4
# Notified in every writer's transaction (at its commit); readers LISTEN to it.
CHANNEL: Final = "blockx_blocks"
LISTEN_BACKOFF: Final = Backoff(initial_s=0.5, max_s=30.0)
_CONNECT_TIMEOUT_S: Final = 10.0

_MARK: Final = re.compile(r"\?")


def numbered(sql: str) -> str:
    """``?`` placeholders as PostgreSQL's ``$1, $2, ...``."""
    counter = iter(range(1, 1_000_000))
    return _MARK.sub(lambda _: f"${next(counter)}", sql)


def _decoded(record: asyncpg.Record) -> dict[str, Any]:
    row = dict(record)
    for name, value in row.items():
        if isinstance(value, Decimal):
            row[name] = format(value, "f")
    return row


# The server is down, restarting, full or gone: a later try may succeed. (A
# connection lost in the middle of an operation can leave asyncpg's protocol in a
# state it reports as InternalClientError.)
UNREACHABLE: Final = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.InterfaceError,
    asyncpg.TooManyConnectionsError,
    asyncpg.exceptions.InternalClientError,
)


def lost_connection_report(context: dict[str, Any]) -> bool:
    """Whether an event loop's exception report is asyncpg noting a connection lost
    under an operation (a future of it nobody awaits any more, a connection reset
    with a transaction open). The operation itself fails StoreUnavailable, which is
    what a command reports, once."""
    message = str(context.get("message", ""))
    return isinstance(context.get("exception"), UNREACHABLE) or message.startswith(
        "Resetting connection with an active transaction"
    )


@contextmanager
def _reachable(description: str) -> Iterator[None]:
    """asyncpg's failures as StoreErrors: StoreUnavailable when the server cannot
    answer now, StoreError for any other error the server reports."""
    try:
        yield
    except UNREACHABLE as exc:
        raise StoreUnavailable(f"{description} is unreachable: {exc}") from None
    except asyncpg.PostgresError as exc:
        raise StoreError(f"{description}: {type(exc).__name__}: {exc}") from None


class _PostgresWriter(BlockWriter):
    def __init__(self, conn: asyncpg.pool.PoolConnectionProxy[Any], description: str) -> None:
        self._conn = conn
        self._description = description

    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        with _reachable(self._description):
            return [_decoded(r) for r in await self._conn.fetch(numbered(sql), *params)]

    async def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        with _reachable(self._description):
            status = await self._conn.execute(numbered(sql), *params)
        # "DELETE 3", "UPDATE 1", "INSERT 0 1": the last word counts rows.
        return int(status.rsplit(" ", 1)[-1])

    async def _delete_blocks(self, numbers: list[int]) -> None:
        with _reachable(self._description):
            for table in BLOCK_TABLES:
                await self._conn.execute(
                    f"DELETE FROM {table.name} WHERE block_number = ANY($1::bigint[])", numbers
                )

    async def _load(self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
        # uint256 columns go as their decimal text: asyncpg's NUMERIC encoder makes
        # the Decimal itself, in C, with no copy of the row.
        with _reachable(self._description):
            await self._conn.copy_records_to_table(table, records=rows, columns=list(columns))


class PostgresStore(BlockStore):
    def __init__(self, pool: asyncpg.Pool[Any], description: str, max_rows: int, dsn: str) -> None:
        super().__init__(description, max_rows)
        self._pool = pool
        self._dsn = dsn

    @classmethod
    async def open(
        cls, url: PostgresUrl, *, max_rows: int = DEFAULT_MAX_ROWS, pool_size: int = POOL_SIZE
    ) -> PostgresStore:
        """Connect and apply missing migrations; StoreUnavailable when the server cannot
        be reached, SchemaRefused for a database of a newer schema or no block database."""
        description = describe(url)
        try:
            with _reachable(description):
                # No floor of idle connections: asyncpg restores a floor from a
                # background task that logs a traceback at every failed reconnect
                # while the server is down.
                pool = await asyncpg.create_pool(
                    url.dsn, min_size=0, max_size=pool_size, timeout=_CONNECT_TIMEOUT_S
                )
        except StoreError as exc:
            # A missing database or a refused login: nothing here can use it until fixed.
            raise StoreUnavailable(str(exc)) from None
        store = cls(pool, description, max_rows, url.dsn)
        try:
            await store._migrate()
        except BaseException:
            await pool.close()
            raise
        return store

    async def _migrate(self) -> None:
        with _reachable(self.description):
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
                version = await _version(conn, self.description)
                if version > SCHEMA_VERSION:
                    raise SchemaRefused(
                        f"{self.description} has schema version {version}, newer than this "
                        f"BlockX's ({SCHEMA_VERSION}): upgrade BlockX"
                    )
                if version == SCHEMA_VERSION:
                    return
                if version == 0:
                    await conn.execute("CREATE TABLE blockx_schema (version INTEGER NOT NULL)")
                    await conn.execute("INSERT INTO blockx_schema (version) VALUES (0)")
                for target, migrate in enumerate(MIGRATIONS[version:], start=version + 1):
                    statements = migrate(Engine.POSTGRES)
                    existing = await conn.fetch(
                        "SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema = current_schema()"
                    )
                    try:
                        refuse_existing_tables(
                            statements,
                            [r["table_name"] for r in existing],
                            target,
                            self.description,
                        )
                    except SchemaError as exc:
                        raise SchemaRefused(str(exc)) from None
                    for statement in statements:
                        await conn.execute(statement)
                await conn.execute("UPDATE blockx_schema SET version = $1", SCHEMA_VERSION)

    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        with _reachable(self.description):
            return [_decoded(r) for r in await self._pool.fetch(numbered(sql), *params)]

    @asynccontextmanager
    async def writer(self) -> AsyncIterator[BlockWriter]:
        with _reachable(self.description):
            async with self._pool.acquire() as conn, conn.transaction():
                locked = await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", WRITER_LOCK)
                if not locked:
                    raise WriterBusy(
                        f"{self.description} is being written by another ingest; "
                        "one writes at a time"
                    )
                yield _PostgresWriter(conn, self.description)
                await conn.execute(f"NOTIFY {CHANNEL}")

    @asynccontextmanager
    async def changes(self) -> AsyncIterator[asyncio.Event | None]:
        """Set by every writer's commit: a connection of its own LISTENs (made again,
        with back-off, when it is lost; the Event is set then too, for the commits
        it may have missed)."""
        event = asyncio.Event()
        listener = asyncio.create_task(self._listen(event), name="blockdb-listen")
        try:
            yield event
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _listen(self, event: asyncio.Event) -> None:
        failures = 0
        while True:
            conn: asyncpg.Connection[Any] | None = None
            try:
                conn = await asyncpg.connect(self._dsn, timeout=_CONNECT_TIMEOUT_S)
                lost = asyncio.Event()
                conn.add_termination_listener(functools.partial(_set, lost))
                await conn.add_listener(CHANNEL, functools.partial(_set, event))
                failures = 0
                event.set()
                await lost.wait()
            except (*UNREACHABLE, asyncpg.PostgresError) as exc:
                level = logging.WARNING if failures == 0 else logging.DEBUG
                _log.log(level, "cannot LISTEN on %s (%s): it is polled", self.description, exc)
            except Exception:
                # Pushes are only wake-ups: whatever else breaks them, readers poll.
                _log.exception("LISTEN on %s failed", self.description)
            finally:
                if conn is not None:
                    conn.terminate()
            failures += 1
            await asyncio.sleep(LISTEN_BACKOFF.delay(failures, random.random()))

    async def close(self) -> None:
        await self._pool.close()


def _set(event: asyncio.Event, *_: object) -> None:
    event.set()


async def _version(conn: asyncpg.pool.PoolConnectionProxy[Any], description: str) -> int:
    """The schema version; 0 for a database without BlockX tables, SchemaRefused for
    one that has block tables but no version."""
    if await conn.fetchval("SELECT to_regclass('blockx_schema')") is not None:
        version: int | None = await conn.fetchval("SELECT max(version) FROM blockx_schema")
        return version or 0
    present = await conn.fetch(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = current_schema() AND table_name = ANY($1::text[])",
        [t.name for t in TABLES],
    )
    if present:
        names = ", ".join(sorted(r["table_name"] for r in present))
        raise SchemaRefused(
            f"{description} has tables named like the block tables ({names}) but no "
            "blockx_schema version: it is no BlockX block database"
        )
    return 0
