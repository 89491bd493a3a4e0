"""The block database in one SQLite file.

WAL mode, so reads never wait for ingest. A read runs on the event loop's own
thread, on a read-only connection that never waits for a lock, for its first
``LOOP_READ_ROWS`` rows: a reader thread beside a busy loop costs two context
switches a row, as sqlite3 hands the GIL over at every row it steps (about 15 %
of a bundle Worker's CPU in bench/backfill_bench.py). The rest of a longer
answer, and a read that found the file busy, go to a small pool of reader threads
with one connection each, so the loop is never held long.

Writes run on one connection, on the event loop's own thread: a writer's work is
mostly Python (every cell checked), which the GIL would run one thread at a time
anyway, and a hand-over to a writer thread per statement, with the GIL passed
back and forth at every row SQLite steps, cost ingest about 5 % of
its CPU against a node on the same cores. A batch of ingest holds the loop for a
few tens of milliseconds; its next fetches are already under way. Only the commit,
which waits for the disk, goes to the writer's thread. A writer is
``BEGIN IMMEDIATE`` with no busy wait: a second writer, in this process or
another, fails at once with WriterBusy.

After each commit the writer wakes the readers that asked to be woken
(``changes()``, through the sockets of ``blockx_chain.store.wake``).

A store opened ``read_only`` (every reader: the drivers, the Worker's io.blockdb)
never creates nor migrates the file: a missing or empty file is StoreUnavailable
"no block database at PATH", and an older schema waits for ingest to migrate it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

from blockx_chain.schema import (
    BLOCK_TABLES,
    MIGRATIONS,
    SCHEMA_VERSION,
    TABLES,
    Engine,
    SchemaError,
    refuse_existing_tables,
)
from blockx_chain.store import reads
from blockx_chain.store.base import BlockStore, BlockWriter, block_columns
from blockx_chain.store.errors import SchemaRefused, StoreError, StoreUnavailable, WriterBusy
from blockx_chain.store.reads import DEFAULT_MAX_ROWS
from blockx_chain.store.wake import WakeSocket, wake_readers

T = TypeVar("T")

READ_THREADS = 4
# Rows a read answers on the event loop's thread; the rest on a reader thread.
LOOP_READ_ROWS: Final = 2_000
_READ_BUSY_TIMEOUT_MS = 5000


def _rows(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    return _dicts(cursor, cursor.fetchall())


def _dicts(cursor: sqlite3.Cursor, rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in rows]


class _SqliteWriter(BlockWriter):
    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        return await self._store._on_writer(lambda c: _rows(c.execute(sql, params)))

    async def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        return await self._store._on_writer(lambda c: c.execute(sql, params).rowcount)

    async def _delete_blocks(self, numbers: list[int]) -> None:
        await self._store._on_writer(lambda c: _delete(c, numbers))

    async def _load(self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
        await self._store._on_writer(lambda c: c.executemany(_insert_sql(table, columns), rows))

    async def _replace_blocks(
        self, numbers: list[int], checked: Callable[[], dict[str, list[tuple[Any, ...]]]]
    ) -> dict[str, list[tuple[Any, ...]]]:
        """The rows checked, the old deleted and the new loaded in one call, on the
        loop's thread like every write (``checked`` is not sent to a thread of its
        own as the base class does)."""

        def replace(conn: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
            rows = checked()
            _delete(conn, numbers)
            for table in BLOCK_TABLES:
                if rows[table.name]:
                    sql = _insert_sql(table.name, block_columns(table))
                    conn.executemany(sql, rows[table.name])
            return rows

        return await self._store._on_writer(replace)


def _insert_sql(table: str, columns: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def _delete(conn: sqlite3.Connection, numbers: list[int]) -> None:
    keys = [(n,) for n in numbers]
    for table in BLOCK_TABLES:
        conn.executemany(f"DELETE FROM {table.name} WHERE block_number = ?", keys)


def read_only_uri(path: Path) -> str:
    """``path`` as a URI SQLite opens read-only and never creates."""
    return f"file:{urllib.parse.quote(str(path))}?mode=ro"


class SqliteStore(BlockStore):
    def __init__(self, path: Path, max_rows: int, read_threads: int, *, read_only: bool) -> None:
        super().__init__(f"sqlite:///{path}", max_rows)
        self.path = path
        self.read_only = read_only
        self._write_thread = ThreadPoolExecutor(1, thread_name_prefix="blockdb-write")
        self._read_threads = ThreadPoolExecutor(read_threads, thread_name_prefix="blockdb-read")
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._loop_conn: sqlite3.Connection | None = None
        # A reader thread is reading the rest of an answer on the loop's connection.
        self._loop_conn_lent = False
        self._conn: sqlite3.Connection | None = None
        self._writing = False
        # The columns of a file of an older schema, with its version.
        self._older: tuple[int, reads.Layout] | None = None

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
        read_threads: int = READ_THREADS,
        read_only: bool = False,
    ) -> SqliteStore:
        """Open (and create) the file and apply missing migrations; SchemaRefused for
        a file that is no BlockX block database or has a newer schema.

        ``read_only``: open an existing block database without writing to it;
        StoreUnavailable "no block database at PATH" when there is none, and for a
        schema older than this BlockX's (ingest migrates it)."""
        store = cls(path, max_rows, read_threads, read_only=read_only)
        connect = store._check_read_only if read_only else store._connect
        try:
            await asyncio.get_running_loop().run_in_executor(store._write_thread, connect)
        except BaseException:
            await store.close()
            raise
        return store

    def _connect(self) -> None:
        if not self.path.parent.is_dir():
            raise StoreUnavailable(
                f"{self.description}: the directory {self.path.parent} does not exist"
            )
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.description}: {exc}") from None
        self._conn = conn
        try:
            conn.execute(f"PRAGMA busy_timeout = {_READ_BUSY_TIMEOUT_MS}")
            version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            _check_version(self.description, version, conn)
            conn.execute("PRAGMA journal_mode = WAL")
            if version < SCHEMA_VERSION:
                conn.execute("BEGIN IMMEDIATE")
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                for target, migrate in enumerate(MIGRATIONS[version:], start=version + 1):
                    statements = migrate(Engine.SQLITE)
                    refuse_existing_tables(statements, _table_names(conn), target, self.description)
                    for statement in statements:
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            # Writers never wait for each other: a second ingest fails at once.
            conn.execute("PRAGMA busy_timeout = 0")
        except SchemaError as exc:
            raise SchemaRefused(str(exc)) from None
        except sqlite3.DatabaseError as exc:
            raise SchemaRefused(
                f"{self.description} is not a usable SQLite database: {exc}"
            ) from None

    def _check_read_only(self) -> None:
        """The file holds a block database this BlockX reads; nothing is written."""
        missing = StoreUnavailable(f"no block database at {self.path}")
        if not self.path.is_file():
            raise missing
        try:
            conn = sqlite3.connect(read_only_uri(self.path), uri=True)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.description}: {exc}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {_READ_BUSY_TIMEOUT_MS}")
            version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            _check_version(self.description, version, conn)
        except sqlite3.DatabaseError as exc:
            raise SchemaRefused(
                f"{self.description} is not a usable SQLite database: {exc}"
            ) from None
        finally:
            conn.close()
        if version == 0:
            raise missing  # an empty file: ingest has not made its tables yet
        # A reader goes on while the next ingest has yet to migrate the file: its
        # reads see the columns the file lacks as NULL (reads.Layout).
        self.schema_version = version

    def _file_layout(self, conn: sqlite3.Connection) -> reads.Layout:
        """The columns of the file's block tables, or None once it is of the current
        schema."""
        version: int = conn.execute("PRAGMA user_version").fetchone()[0]
        self.schema_version = version
        if version >= SCHEMA_VERSION:
            return None
        if self._older is not None and self._older[0] == version:
            return self._older[1]
        layout: dict[str, frozenset[str]] = {}
        for table in BLOCK_TABLES:
            names = frozenset(row[1] for row in conn.execute(f"PRAGMA table_info({table.name})"))
            if names:
                layout[table.name] = names
        self._older = (version, layout)
        return layout

    async def _layout(self) -> reads.Layout:
        if self.schema_version >= SCHEMA_VERSION:
            return None  # the current schema: never checked again

        def check() -> reads.Layout:
            try:
                return self._file_layout(self._reader())
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"{self.description}: {exc}") from None

        return await asyncio.get_running_loop().run_in_executor(self._read_threads, check)

    async def _on_writer(
        self, work: Callable[[sqlite3.Connection], T], *, waits: bool = False
    ) -> T:
        """``work`` on the write connection, on this thread (see the module's text);
        ``waits``: on the writer's thread, for work that waits for the disk."""

        def run() -> T:
            if self._conn is None:
                raise StoreError(f"{self.description} is closed")
            try:
                return work(self._conn)
            except sqlite3.Error as exc:
                raise StoreError(f"{self.description}: {exc}") from None

        if waits:
            return await asyncio.get_running_loop().run_in_executor(self._write_thread, run)
        return run()

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(read_only_uri(self.path), uri=True, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {_READ_BUSY_TIMEOUT_MS}")
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def _loop_reader(self) -> sqlite3.Connection:
        if self._loop_conn is None:
            conn = sqlite3.connect(read_only_uri(self.path), uri=True, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 0")  # the loop never waits for a lock
            self._loop_conn = conn
        return self._loop_conn

    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        if self._loop_conn_lent:
            return await self._fetch_on_thread(sql, params)
        try:
            cursor = self._loop_reader().execute(sql, params)
            first = cursor.fetchmany(LOOP_READ_ROWS)
        except sqlite3.OperationalError:
            # Busy (a checkpoint or a recovery holds the file), or a refusal the
            # thread's read reports the same way: read there, where a read may wait.
            return await self._fetch_on_thread(sql, params)
        except sqlite3.Error as exc:
            raise self._read_error(exc) from None
        if len(first) < LOOP_READ_ROWS:
            return _dicts(cursor, first)

        def rest() -> list[dict[str, Any]]:
            try:
                return _rows(cursor)
            except sqlite3.Error as exc:
                raise self._read_error(exc) from None
            finally:
                self._loop_conn_lent = False

        self._loop_conn_lent = True
        try:
            more = self._read_threads.submit(rest)
        except BaseException:
            self._loop_conn_lent = False
            raise
        return _dicts(cursor, first) + await asyncio.wrap_future(more)

    async def _fetch_on_thread(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        def run() -> list[dict[str, Any]]:
            try:
                return _rows(self._reader().execute(sql, params))
            except sqlite3.Error as exc:
                raise self._read_error(exc) from None

        return await asyncio.get_running_loop().run_in_executor(self._read_threads, run)

    def _read_error(self, exc: sqlite3.Error) -> StoreError:
        """A failed read: busy, locked or the like is StoreUnavailable."""
        if isinstance(exc, sqlite3.OperationalError):
            return StoreUnavailable(f"{self.description}: {exc}")
        return StoreError(f"{self.description}: {exc}")

    @asynccontextmanager
    async def writer(self) -> AsyncIterator[BlockWriter]:
        if self.read_only:
            raise StoreError(f"{self.description} is open read-only: it takes no writer")
        if self._writing:
            raise WriterBusy(f"{self.description} already has a writer in this process")
        self._writing = True
        try:
            await self._on_writer(_begin_immediate(self.description))
            try:
                yield _SqliteWriter(self)
            except BaseException:
                await self._on_writer(lambda c: c.execute("ROLLBACK"))
                raise
            # The commit waits for the disk (fsync): on the writer's thread, while
            # the loop goes on with the next batch.
            await self._on_writer(self._commit, waits=True)
        finally:
            self._writing = False

    def _commit(self, conn: sqlite3.Connection) -> None:
        conn.execute("COMMIT")
        wake_readers(self.path)

    @asynccontextmanager
    async def changes(self) -> AsyncIterator[asyncio.Event | None]:
        """Woken by every writer's commit through a socket in the wake directory
        beside the file (``blockx_chain.store.wake``)."""
        wake = WakeSocket(self.path)
        if not wake.open():
            yield None
            return
        try:
            yield wake.event
        finally:
            wake.close()

    async def close(self) -> None:
        def close_writer() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._write_thread, close_writer)
        self._write_thread.shutdown()
        self._read_threads.shutdown()
        if self._loop_conn is not None:
            self._loop_conn.close()
            self._loop_conn = None
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()


def _begin_immediate(description: str) -> Callable[[sqlite3.Connection], None]:
    def begin(conn: sqlite3.Connection) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            # The primary result code (the low byte of an extended one).
            if exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise WriterBusy(
                    f"{description} is being written by another ingest; one writes at a time"
                ) from None
            raise StoreError(f"{description}: {exc}") from None

    return begin


def _check_version(description: str, version: int, conn: sqlite3.Connection) -> None:
    if version > SCHEMA_VERSION:
        raise SchemaRefused(
            f"{description} has schema version {version}, newer than this BlockX's "
            f"({SCHEMA_VERSION}): upgrade BlockX"
        )
    if version == 0:
        names = _table_names(conn)
        if names:
            ours = {t.name for t in TABLES}
            what = "some of the block tables" if names & ours else "tables"
            raise SchemaRefused(
                f"{description} holds {what} but no BlockX schema version (user_version 0): "
                "it is no BlockX block database"
            )


def _table_names(conn: sqlite3.Connection) -> set[str]:
    return {
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    }
