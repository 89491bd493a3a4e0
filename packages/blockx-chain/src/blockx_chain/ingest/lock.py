"""One ingest per database for a whole run.

The store's writer lock covers one transaction, and a run is many (one per batch),
so a run also holds a lock of its own from start to end, taken without waiting: a
second ingest fails at once with WriterBusy. Both kinds die with their process, so
a killed ingest never leaves the database locked.

* SQLite: ``flock`` on ``<database>-ingest.lock`` beside the database file (not on
  the database file itself: closing another descriptor of it would drop SQLite's
  own POSIX locks).
* PostgreSQL: a session-level advisory lock, held on a connection of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from typing import Final

from blockx_chain.store import StoreUnavailable, WriterBusy
from blockx_chain.url import BlockDbUrl, PostgresUrl, SqliteUrl, describe

# Not the store's writer or migration keys: this one is held across transactions.
INGEST_LOCK: Final = 0x626C6B7849
# SQLite: the lock file beside the database, ``<database>-ingest.lock``.
LOCK_SUFFIX: Final = "-ingest.lock"
_CLOSE_TIMEOUT_S: Final = 5.0


def _busy(url: BlockDbUrl) -> WriterBusy:
    return WriterBusy(
        f"{describe(url)} is being written by another ingest; one ingest writes a "
        "database at a time"
    )


@contextlib.asynccontextmanager
async def ingest_lock(url: BlockDbUrl) -> AsyncIterator[None]:
    match url:
        case SqliteUrl(path):
            lock_path = path.with_name(path.name + LOCK_SUFFIX)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise _busy(url) from None
                yield
            finally:
                os.close(fd)
        case PostgresUrl():
            # The PostgreSQL driver is loaded only for a PostgreSQL database: an
            # ingest into SQLite starts a tenth of a second sooner.
            import asyncpg

            from blockx_chain.store.postgres import UNREACHABLE

            try:
                conn = await asyncpg.connect(url.dsn, timeout=10)
            except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
                raise StoreUnavailable(f"{describe(url)} is unreachable: {exc}") from None
            try:
                try:
                    locked = await conn.fetchval("SELECT pg_try_advisory_lock($1)", INGEST_LOCK)
                except UNREACHABLE as exc:
                    raise StoreUnavailable(f"{describe(url)} is unreachable: {exc}") from None
                if not locked:
                    raise _busy(url)
                yield
            finally:
                # A server gone meanwhile took the lock with it; its error is the
                # run's, not this close's.
                try:
                    await conn.close(timeout=_CLOSE_TIMEOUT_S)
                except (*UNREACHABLE, asyncpg.PostgresError):
                    conn.terminate()
