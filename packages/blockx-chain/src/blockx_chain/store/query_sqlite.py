"""Read-only SQL on a SQLite block database (``io.blockdb_executor``).

Statements run on connections of their own, opened read-only (``mode=ro``: the
file is never created nor written), one per thread of a small pool, off the event
loop. Each connection has an authorizer that allows a SELECT, reads of the query
tables (``blockx_chain.store.query.QUERY_TABLES``) of the main database, functions,
recursive CTEs and the table-valued ``json_each``/``json_tree``, and denies
everything else: a write of any kind, ATTACH and DETACH (also limited to 0
databases), every PRAGMA (its table-valued forms too), a read of any other table
(another database's, the temp schema's, a sink sharing the file), a temp table or
view. A denied action fails the statement as it is prepared, and the refusal names
it.

The wall-time limit is a progress handler that interrupts the statement once its
deadline passes; rows and bytes are counted as they are fetched, and fetching
stops at the first bound passed. A string or blob is limited to the byte bound
(SQLITE_LIMIT_LENGTH), so no function builds a value larger than an answer may be.

A pinned statement (``through_block``) is first compiled (EXPLAIN, never run) with
empty common tables named like the block tables and an authorizer that denies
every table read: a statement that reads any table but through those names (
``main.blocks``, a view) is refused, so the pinned run reads only the rows at
blocks <= its block.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from blockx_chain.store.errors import StoreError, StoreUnavailable
from blockx_chain.store.query import (
    QUERY_TABLES,
    QueryLimits,
    QueryRefused,
    RowBudget,
    Statement,
    empty_tables,
    timed_out,
)
from blockx_chain.store.sqlite import read_only_uri

QUERY_THREADS: Final = 2
_BUSY_TIMEOUT_MS: Final = 5000
_FETCH: Final = 256
# VM instructions between two looks at the clock.
_PROGRESS_STEPS: Final = 10_000
# Table-valued functions a statement may read: they read only their arguments.
_TABLE_FUNCTIONS: Final = frozenset({"json_each", "json_tree"})

_ACTIONS: Final = {
    getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ")
    for name in (
        "CREATE_INDEX",
        "CREATE_TABLE",
        "CREATE_TEMP_INDEX",
        "CREATE_TEMP_TABLE",
        "CREATE_TEMP_TRIGGER",
        "CREATE_TEMP_VIEW",
        "CREATE_TRIGGER",
        "CREATE_VIEW",
        "DELETE",
        "DROP_INDEX",
        "DROP_TABLE",
        "DROP_TEMP_INDEX",
        "DROP_TEMP_TABLE",
        "DROP_TEMP_TRIGGER",
        "DROP_TEMP_VIEW",
        "DROP_TRIGGER",
        "DROP_VIEW",
        "INSERT",
        "PRAGMA",
        "READ",
        "SELECT",
        "TRANSACTION",
        "UPDATE",
        "ATTACH",
        "DETACH",
        "ALTER_TABLE",
        "REINDEX",
        "ANALYZE",
        "CREATE_VTABLE",
        "DROP_VTABLE",
        "FUNCTION",
        "SAVEPOINT",
        "RECURSIVE",
    )
}


class _Guard(threading.local):
    """What the authorizer of this thread's connection refused last, and whether it
    compiles a pinned statement's check."""

    refused: str | None = None
    pinned_check: bool = False


class SqliteQueries:
    def __init__(self, path: Path, limits: QueryLimits, threads: int = QUERY_THREADS) -> None:
        self.path = path
        self.limits = limits
        self.description = f"sqlite:///{path}"
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="blockdb-query")
        self._local = threading.local()
        self._guard = _Guard()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()

    def _authorize(
        self, action: int, arg1: str | None, arg2: str | None, database: str | None, _: Any
    ) -> int:
        guard = self._guard
        if action == sqlite3.SQLITE_SELECT or action == sqlite3.SQLITE_RECURSIVE:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ:
            if arg1 in _TABLE_FUNCTIONS:
                return sqlite3.SQLITE_OK
            # A column read names its database; a table read for no column (a count,
            # a join on its key alone) names none, and so does a common table's.
            column_read = database is not None
            if guard.pinned_check and column_read:
                guard.refused = (
                    f"a pinned query (through_block) reads the chain tables by their plain "
                    f"names only: reading {database}.{arg1} would read past through_block"
                )
                return sqlite3.SQLITE_DENY
            if database in ("main", None) and arg1 in QUERY_TABLES:
                return sqlite3.SQLITE_OK
            if not column_read and not self._is_table(arg1):
                return sqlite3.SQLITE_OK  # a common table or subquery of the statement
            where = f"{database}.{arg1}" if database not in (None, "main") else str(arg1)
            guard.refused = (
                f"reading {where} is refused: io.blockdb_executor reads only the chain "
                f"tables ({', '.join(sorted(QUERY_TABLES))})"
            )
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master":
            # SQLite declaring a table-valued function's columns on its first use.
            guard.refused = (
                "a table-valued function other than json_each and json_tree is refused "
                "(PRAGMA functions too): io.blockdb_executor reads only the chain tables"
            )
            return sqlite3.SQLITE_DENY
        what = _ACTIONS.get(action, f"action {action}")
        target = " ".join(str(a) for a in (arg1, arg2) if a)
        guard.refused = (
            f"{what}{' ' + target if target else ''} is refused: io.blockdb_executor "
            "only reads the chain tables"
        )
        return sqlite3.SQLITE_DENY

    def _connect(self) -> sqlite3.Connection:
        """A read-only connection to the file, closed with the engine."""
        if not self.path.is_file():
            raise StoreUnavailable(f"no block database at {self.path}")
        try:
            conn = sqlite3.connect(read_only_uri(self.path), uri=True, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.description}: {exc}") from None
        with self._conns_lock:
            self._conns.append(conn)
        return conn

    def _is_table(self, name: str | None) -> bool:
        """Whether the file holds a table or view ``name`` (asked on a connection of
        this thread without the authorizer: a sink may add tables at any time)."""
        plain: sqlite3.Connection | None = getattr(self._local, "plain", None)
        if plain is None:
            plain = self._local.plain = self._connect()
        found = plain.execute(
            "SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ? "
            "COLLATE NOCASE",
            (name,),
        ).fetchone()
        return found is not None

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection for statements, behind the authorizer."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(1000, self.limits.max_bytes))
            # The allowed table-valued functions declare their columns on first use
            # (a statement of SQLite's own the authorizer would see): before it.
            for function in sorted(_TABLE_FUNCTIONS):
                conn.execute(f"SELECT * FROM {function}('[]')").fetchall()
            conn.set_authorizer(self._authorize)
            self._local.conn = conn
        return conn

    async def query(self, statement: Statement) -> list[dict[str, Any]]:
        """The rows of ``statement``; QueryRefused, QueryTimedOut, TooManyRows,
        QueryTooLarge, or StoreUnavailable when the file cannot be read now."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self._run, statement)

    def _run(self, statement: Statement) -> list[dict[str, Any]]:
        conn = self._conn()
        guard = self._guard
        guard.refused = None
        if statement.pinned is not None:
            self._check_pinned(conn, statement)
        deadline = time.monotonic() + self.limits.timeout_ms / 1000
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
        budget = RowBudget(self.limits)
        cursor: sqlite3.Cursor | None = None
        try:
            sql = statement.sql if statement.pinned is None else statement.pinned_sql("main")
            cursor = conn.execute(sql, statement.params)
            names = [d[0] for d in cursor.description or ()]
            while batch := cursor.fetchmany(_FETCH):
                for row in batch:
                    budget.add(dict(zip(names, row, strict=True)))
        except sqlite3.Error as exc:
            raise self._failure(exc) from None
        finally:
            conn.set_progress_handler(None, 0)
            if cursor is not None:
                cursor.close()
        return budget.rows

    def _check_pinned(self, conn: sqlite3.Connection, statement: Statement) -> None:
        """Compile the statement over empty tables named like the block tables; any
        table it still reads is read past its block."""
        self._guard.pinned_check = True
        try:
            conn.execute(f"EXPLAIN {statement.with_tables(empty_tables())}", statement.params)
        except sqlite3.Error as exc:
            raise self._failure(exc) from None
        finally:
            self._guard.pinned_check = False

    def _failure(self, exc: sqlite3.Error) -> StoreError:
        refused = self._guard.refused
        self._guard.refused = None
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if refused is not None:
            return QueryRefused(refused)
        if code == sqlite3.SQLITE_INTERRUPT:
            return timed_out(self.limits)
        if code in (
            sqlite3.SQLITE_BUSY,
            sqlite3.SQLITE_LOCKED,
            sqlite3.SQLITE_IOERR,
            sqlite3.SQLITE_CANTOPEN,
            sqlite3.SQLITE_CORRUPT,
            sqlite3.SQLITE_NOTADB,
            sqlite3.SQLITE_NOMEM,
        ):
            return StoreUnavailable(f"{self.description}: {exc}")
        if isinstance(exc, sqlite3.ProgrammingError) and "one statement" in str(exc):
            return QueryRefused("multiple statements are refused: io.blockdb_executor runs one")
        return QueryRefused(f"the SQL failed: {exc}")

    async def close(self) -> None:
        self._threads.shutdown()
        with self._conns_lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
