"""The sink in one SQLite file (it may be the block database's own file).

One connection, in WAL mode so readers of the file never wait. Statements run on
a thread of its own (``BEGIN`` waits for another writer's lock, ``COMMIT`` for
the disk, one ``DELETE`` may take a while), except the inserts of a write's rows:
each chunk of ``chunk_rows`` rows is converted and inserted on the event loop's
thread, as a thread beside a busy loop would cost two context switches a row
(sqlite3 hands the GIL over at every row it steps). A write is ``BEGIN
IMMEDIATE``, which holds the file's write lock for the whole transaction: two
writers of one block (or any two writers) take turns, each waiting up to
``SINK_BUSY_TIMEOUT_MS`` for the other; a longer wait is retryable. A statement
SQLite refuses as such (SQLITE_ERROR: a name taken, too many columns, a duplicate
column; a value too big or of the wrong kind) fails the same way every time: not
retryable.

Widening a column rewrites the table (SQLite cannot change a column's type): a
copy with the new types is filled from it, the old one dropped, the copy renamed
and the indexes and triggers made again, all in the write's transaction.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

from blockx_chain.sink.base import DEFAULT_CHUNK_ROWS, SinkStore
from blockx_chain.sink.errors import SinkError, SinkRejected, SinkUnavailable
from blockx_chain.sink.schema import SinkType, quoted, sql_type
from blockx_chain.sink.tx import IndexInfo, SinkTx

T = TypeVar("T")

SINK_BUSY_TIMEOUT_MS: Final = 10_000
# The copy a widening fills (a writer-side name: no sink table can take it).
_REWRITE_TABLE: Final = "_blockx_rewrite"
# Primary result codes of a statement refused as such: retrying cannot help.
_REFUSED: Final = frozenset(
    {sqlite3.SQLITE_ERROR, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_RANGE}
)


class _SqliteTx(SinkTx):
    postgres = False

    def __init__(self, sink: SqliteSink) -> None:
        self._sink = sink
        self.max_columns = sink.max_columns

    async def fetch(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        def run(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            cursor = conn.execute(sql, params)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

        return await self._sink._run(run)

    async def execute(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        await self._sink._run(lambda conn: conn.execute(sql, params))

    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            await self._sink._run(lambda conn: conn.executemany(sql, rows))

    async def insert(
        self, sql: str, encode: Callable[[], list[tuple[Any, ...]]], count: int
    ) -> None:
        await self._sink._rows_in(lambda conn: conn.executemany(sql, encode()))

    async def lock(self, keys: Sequence[str]) -> None:
        """Nothing more to take: BEGIN IMMEDIATE holds the whole file."""

    async def taken(self, name: str) -> str | None:
        # SQLite's names are case-insensitive; tables, indexes and views share them.
        rows = await self.fetch(
            "SELECT type FROM sqlite_master WHERE name = ? COLLATE NOCASE "
            "AND type IN ('table', 'index', 'view')",
            (name,),
        )
        return str(rows[0]["type"]) if rows else None

    async def widen(self, table: str, columns: Mapping[str, SinkType]) -> None:
        def rewrite(conn: sqlite3.Connection) -> None:
            name_sql, copy = quoted(table), quoted(_REWRITE_TABLE)
            # (cid, name, type, notnull, default, pk) in column order.
            info = conn.execute(f"PRAGMA table_info({name_sql})").fetchall()
            # The table's indexes and triggers go with it: made again on the copy.
            dependents = [
                sql
                for (sql,) in conn.execute(
                    "SELECT sql FROM sqlite_master WHERE type IN ('index', 'trigger') "
                    "AND tbl_name = ? AND sql IS NOT NULL",
                    (table,),
                )
            ]
            body, values = [], []
            for _, name, declared, notnull, default, _ in info:
                kind = sql_type(columns[name], False) if name in columns else declared
                body.append(
                    f"{quoted(name)} {kind}"
                    + (" NOT NULL" if notnull else "")
                    + (f" DEFAULT {default}" if default is not None else "")
                )
                values.append(
                    f"CAST({quoted(name)} AS {kind})" if name in columns else quoted(name)
                )
            conn.execute(f"CREATE TABLE {copy} ({', '.join(body)})")
            conn.execute(f"INSERT INTO {copy} SELECT {', '.join(values)} FROM {name_sql}")
            conn.execute(f"DROP TABLE {name_sql}")
            # Views on the table name it, not the table: the legacy rename leaves them
            # alone (the modern one would refuse them while the name is free).
            conn.execute("PRAGMA legacy_alter_table = ON")
            try:
                conn.execute(f"ALTER TABLE {copy} RENAME TO {name_sql}")
            finally:
                conn.execute("PRAGMA legacy_alter_table = OFF")
            for sql in dependents:
                conn.execute(sql)

        await self._sink._run(rewrite)

    async def legacy_indexes(self) -> list[IndexInfo]:
        rows = await self.fetch(
            "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' "
            "AND (name GLOB 'ux_[0-9a-f]*' OR name GLOB 'ix_[0-9a-f]*')",
            (),
        )
        found = []
        for row in rows:
            columns = await self.fetch(
                "SELECT name FROM pragma_index_info(?) ORDER BY seqno", (row["name"],)
            )
            found.append(IndexInfo(row["name"], row["tbl_name"], [c["name"] for c in columns]))
        return found

    async def rename_index(self, index: IndexInfo, new_name: str, *, unique: bool) -> None:
        # SQLite has no ALTER INDEX: the index is made again under its new name.
        columns = ", ".join(quoted(c) for c in index.columns)
        await self.execute(f"DROP INDEX {quoted(index.name)}")
        await self.execute(
            f"CREATE {'UNIQUE ' if unique else ''}INDEX {quoted(new_name)} "
            f"ON {quoted(index.table)} ({columns})"
        )

    async def column_names(self, table: str) -> list[str]:
        rows = await self.fetch("SELECT name FROM pragma_table_info(?) ORDER BY cid", (table,))
        return [row["name"] for row in rows]

    async def table_indexes(self, table: str) -> list[IndexInfo]:
        rows = await self.fetch(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? "
            "AND name GLOB '_blockx_*'",
            (table,),
        )
        found = []
        for row in rows:
            columns = await self.fetch(
                "SELECT name FROM pragma_index_info(?) ORDER BY seqno", (row["name"],)
            )
            found.append(IndexInfo(row["name"], table, [c["name"] for c in columns]))
        return found


class SqliteSink(SinkStore):
    def __init__(self, path: Path, chunk_rows: int, *, read_only: bool = False) -> None:
        super().__init__(f"sqlite:///{path}", chunk_rows=chunk_rows, read_only=read_only)
        self.path = path
        # SQLITE_LIMIT_COLUMN, read from the connection (2000 unless SQLite was built
        # otherwise).
        self.max_columns = 2000
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="sink-write")
        self._conn: sqlite3.Connection | None = None
        # One transaction at a time on the one connection.
        self._turn = asyncio.Lock()

    @classmethod
    async def open(
        cls, path: Path, *, chunk_rows: int = DEFAULT_CHUNK_ROWS, read_only: bool = False
    ) -> SqliteSink:
        """The sink in the file ``path``, made when missing; ``read_only``: opened
        read-only, SinkUnavailable when there is no such file."""
        sink = cls(path, chunk_rows, read_only=read_only)
        try:
            await asyncio.get_running_loop().run_in_executor(sink._thread, sink._connect)
        except BaseException:
            await sink.close()
            raise
        return sink

    def _connect(self) -> None:
        if not self.path.parent.is_dir():
            raise SinkUnavailable(
                f"{self.description}: the directory {self.path.parent} does not exist"
            )
        if self.read_only and not self.path.is_file():
            raise SinkUnavailable(f"no sink database at {self.path}")
        try:
            if self.read_only:
                # A reader never makes the file (nor its -wal and -shm).
                conn = sqlite3.connect(
                    f"{self.path.as_uri()}?mode=ro",
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                )
            else:
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {SINK_BUSY_TIMEOUT_MS}")
            if not self.read_only:
                conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.Error as exc:
            raise SinkUnavailable(f"{self.description}: {exc}") from None
        self.max_columns = conn.getlimit(sqlite3.SQLITE_LIMIT_COLUMN)
        self._conn = conn

    def _on_connection(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise SinkUnavailable(f"{self.description} is closed")
        try:
            return work(self._conn)
        except sqlite3.IntegrityError as exc:
            raise SinkRejected(f"{self.description}: rows that do not fit: {exc}") from None
        except sqlite3.Error as exc:
            raise _classified(self.description, exc) from None

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work`` on the sink's thread."""
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, self._on_connection, work
        )

    async def _rows_in(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """A chunk of rows inserted on the loop's thread: the writer's lock is held,
        nothing waits but the page cache. The loop's other work (a heartbeat,
        another task's calls) runs between two chunks."""
        done = self._on_connection(work)
        await asyncio.sleep(0)
        return done

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SinkTx]:
        begin = "BEGIN" if self.read_only else "BEGIN IMMEDIATE"
        async with self._turn:
            await self._run(lambda conn: conn.execute(begin))
            try:
                yield _SqliteTx(self)
            except BaseException:
                await self._run(_rollback)
                raise
            await self._run(lambda conn: conn.execute("COMMIT"))

    async def _close(self) -> None:
        def close_conn() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        # After the transaction under way: its inserts run on the loop's thread, and
        # the connection must not close under them from the sink's.
        async with self._turn:
            await asyncio.get_running_loop().run_in_executor(self._thread, close_conn)
        self._thread.shutdown()


def _rollback(conn: sqlite3.Connection) -> None:
    # Some failures (a full disk, say) have already ended the transaction.
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _classified(description: str, exc: sqlite3.Error) -> SinkError:
    """``exc`` as a SinkError: busy or locked is SinkUnavailable, a statement refused
    as such SinkRejected, anything else (a disk or I/O error) retryable."""
    text = str(exc)
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # raised by the sqlite3 module itself, not by SQLite
        return SinkError(f"{description}: {text}")
    if code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return SinkUnavailable(f"{description}: {text}")
    if code & 0xFF in _REFUSED:
        return SinkRejected(f"{description} refuses the write: {text}")
    return SinkError(f"{description}: {text}")
