"""SQLite reads on the event loop's thread: a long answer finishes on a reader
thread, whole and in order; a busy file is waited for on a reader thread, never on
the loop."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from chain_rows import GENESIS, block_hash, make_block

from blockx_chain.store import BlockStore, open_store
from blockx_chain.store import sqlite as sqlite_store
from blockx_chain.url import parse_blockdb_url

BLOCKS = range(0, 20)


async def _seeded(path: Path) -> None:
    store = await open_store(parse_blockdb_url(f"sqlite:///{path}"))
    try:
        async with store.writer() as w:
            await w.init_chain(31337, GENESIS)
            await w.insert_blocks([make_block(n, txs=3) for n in BLOCKS])
            await w.set_chain(
                head_number=BLOCKS[-1],
                head_hash=block_hash(BLOCKS[-1]),
                finalized_number=0,
                epoch=0,
            )
    finally:
        await store.close()


@pytest.fixture
async def chain_file(tmp_path: Path) -> Path:
    path = tmp_path / "chain.db"
    await _seeded(path)
    return path


@contextlib.asynccontextmanager
async def reader(path: Path) -> AsyncIterator[BlockStore]:
    store = await open_store(parse_blockdb_url(f"sqlite:///{path}"), read_only=True)
    try:
        yield store
    finally:
        await store.close()


def expected_logs(path: Path) -> list[tuple[int, int]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(
            "SELECT block_number, log_index FROM logs ORDER BY block_number, log_index"
        ).fetchall()


def keys(logs: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(log["block_number"], log["log_index"]) for log in logs]


async def test_a_long_answer_is_read_whole_and_in_order(
    chain_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with reader(chain_file) as store:
        whole = await store.logs(BLOCKS[0], BLOCKS[-1])
    monkeypatch.setattr(sqlite_store, "LOOP_READ_ROWS", 7)
    async with reader(chain_file) as store:
        split = await store.logs(BLOCKS[0], BLOCKS[-1])
        # Exactly the loop's share, then one more row than it.
        assert keys(await store.logs(0, 0)) == keys(whole[:6])
        assert len(await store.logs(0, 1)) == 12
    assert len(whole) == len(expected_logs(chain_file)) == 120
    assert keys(whole) == expected_logs(chain_file)
    assert split == whole


async def test_reads_made_while_another_answer_finishes_on_a_thread_are_answered(
    chain_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "LOOP_READ_ROWS", 5)
    async with reader(chain_file) as store:
        answers = await asyncio.gather(
            *(store.logs(n, n + 4) for n in range(0, 15)),
            *(store.blocks(n, n + 9) for n in range(0, 10)),
        )
    logs, blocks = answers[:15], answers[15:]
    for n, answer in enumerate(logs):
        assert keys(answer) == [(b, i) for b in range(n, n + 5) for i in range(6)]
    for n, answer in enumerate(blocks):
        assert [b["block_number"] for b in answer] == list(range(n, n + 10))


async def test_a_cancelled_read_leaves_the_store_reading(
    chain_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "LOOP_READ_ROWS", 3)
    async with reader(chain_file) as store:
        for _ in range(5):
            pending = asyncio.create_task(store.logs(BLOCKS[0], BLOCKS[-1]))
            await asyncio.sleep(0)  # its first rows read, the rest handed to a thread
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending
            assert keys(await store.logs(BLOCKS[0], BLOCKS[-1])) == expected_logs(chain_file)


async def test_a_locked_file_is_waited_for_on_a_reader_thread_while_the_loop_runs(
    chain_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rollback journal (not WAL): an exclusive lock keeps every reader out.
    with contextlib.closing(sqlite3.connect(chain_file)) as db:
        db.execute("PRAGMA journal_mode = DELETE")
    loop = asyncio.get_running_loop()
    on_thread = asyncio.Event()
    thread_reader = sqlite_store.SqliteStore._reader

    def noticed(store: sqlite_store.SqliteStore) -> sqlite3.Connection:
        loop.call_soon_threadsafe(on_thread.set)
        return thread_reader(store)

    monkeypatch.setattr(sqlite_store.SqliteStore, "_reader", noticed)
    locker = sqlite3.connect(chain_file, isolation_level=None)
    try:
        async with reader(chain_file) as store:
            locker.execute("BEGIN EXCLUSIVE")
            pending = asyncio.create_task(store.blocks(0, 4))
            # The loop's own try fails at once; a reader thread takes the read and
            # waits for the lock. Were the loop waiting, nothing here would run.
            await on_thread.wait()
            assert not pending.done()
            locker.execute("COMMIT")
            assert [b["block_number"] for b in await pending] == [0, 1, 2, 3, 4]
            # The loop's own connection gives up on a lock at once.
            loop_conn = store._loop_conn  # type: ignore[attr-defined]
            assert loop_conn.execute("PRAGMA busy_timeout").fetchone() == (0,)
    finally:
        locker.close()
