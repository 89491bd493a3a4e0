"""The sink in one SQLite file (it may be the block database's own file).

One connection on one thread of its own, in WAL mode so readers of the file never
wait. A write is ``BEGIN IMMEDIATE``, which holds the file's write lock for the
whole transaction: two writers of one block (or any two writers) take turns, each
waiting up to ``SINK_BUSY_TIMEOUT_MS`` for the other; a longer wait is retryable.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

from blockx_chain.sink.base import SinkStore, SinkTx
from blockx_chain.sink.errors import SinkError, SinkRejected, SinkUnavailable

T = TypeVar("T")

SINK_BUSY_TIMEOUT_MS: Final = 10_000


class _SqliteTx(SinkTx):
    postgres = False

    def __init__(self, sink: SqliteSink) -> None:
        self._sink = sink

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

    async def lock(self, keys: Sequence[str]) -> None:
        """Nothing more to take: BEGIN IMMEDIATE holds the whole file."""


class SqliteSink(SinkStore):
    def __init__(self, path: Path) -> None:
        super().__init__(f"sqlite:///{path}")
        self.path = path
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="sink-write")
        self._conn: sqlite3.Connection | None = None
        # One transaction at a time on the one connection.
        self._turn = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path) -> SqliteSink:
        sink = cls(path)
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
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {SINK_BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.Error as exc:
            raise SinkUnavailable(f"{self.description}: {exc}") from None
        self._conn = conn

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            if self._conn is None:
                raise SinkUnavailable(f"{self.description} is closed")
            try:
                return work(self._conn)
            except sqlite3.IntegrityError as exc:
                raise SinkRejected(f"{self.description}: rows that do not fit: {exc}") from None
            except sqlite3.OperationalError as exc:
                text = str(exc)
                if "locked" in text or "busy" in text:
                    raise SinkUnavailable(f"{self.description}: {text}") from None
                raise SinkError(f"{self.description}: {text}") from None
            except sqlite3.Error as exc:
                raise SinkError(f"{self.description}: {exc}") from None

        return await asyncio.get_running_loop().run_in_executor(self._thread, run)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SinkTx]:
        async with self._turn:
            await self._run(lambda conn: conn.execute("BEGIN IMMEDIATE"))
            try:
                yield _SqliteTx(self)
            except BaseException:
                await self._run(lambda conn: conn.execute("ROLLBACK"))
                raise
            await self._run(lambda conn: conn.execute("COMMIT"))

    async def close(self) -> None:
        def close_conn() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._thread, close_conn)
        self._thread.shutdown()
