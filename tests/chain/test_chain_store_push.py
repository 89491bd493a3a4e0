"""Push from the block database (``BlockStore.changes()``): a writer's commit wakes
the readers that asked, on both engines (PostgreSQL LISTEN/NOTIFY, the SQLite wake
sockets of ``blockx_chain.store.wake``); only a wake-up, the database stays the truth."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from chain_rows import GENESIS, block_hash, make_block

from blockx_chain.store import BlockStore, open_store
from blockx_chain.store.wake import WakeSocket, wake_dir, wake_readers
from blockx_chain.url import BlockDbUrl, PostgresUrl, SqliteUrl, parse_blockdb_url


async def write(store: BlockStore, number: int) -> None:
    async with store.writer() as w:
        if number == 0:
            await w.init_chain(31337, GENESIS)
        await w.insert_blocks([make_block(number)])
        await w.set_chain(
            head_number=number, head_hash=block_hash(number), finalized_number=None, epoch=0
        )


@contextlib.asynccontextmanager
async def watched(url: BlockDbUrl) -> AsyncIterator[tuple[BlockStore, asyncio.Event]]:
    """A store of ``url`` (it writes too) and the Event its commits set."""
    store = await open_store(url)
    try:
        async with store.changes() as changed:
            assert changed is not None
            yield store, changed
    finally:
        await store.close()


async def test_a_commit_wakes_a_reader_that_then_reads_it(db_url: str) -> None:
    url = parse_blockdb_url(db_url)
    writer = await open_store(url)
    try:
        await write(writer, 0)
        reader = await open_store(url, read_only=True)
        try:
            async with reader.changes() as changed:
                assert changed is not None
                if isinstance(url, PostgresUrl):
                    # Set once listening (for the commits it may have missed).
                    await asyncio.wait_for(changed.wait(), 30)
                    changed.clear()
                for number in (1, 2):
                    await write(writer, number)
                    await asyncio.wait_for(changed.wait(), 30)
                    changed.clear()
                    head = await reader.head()
                    assert head is not None
                    assert head["number"] >= number
        finally:
            await reader.close()
    finally:
        await writer.close()


async def test_a_rolled_back_writer_wakes_nobody_but_the_next_commit_does(db_url: str) -> None:
    url = parse_blockdb_url(db_url)
    async with watched(url) as (writer, changed):
        if isinstance(url, PostgresUrl):
            await asyncio.wait_for(changed.wait(), 30)  # listening
            changed.clear()
        await write(writer, 0)
        await asyncio.wait_for(changed.wait(), 30)
        changed.clear()

        async def rolled_back() -> None:
            async with writer.writer() as w:
                await w.insert_blocks([make_block(1)])
                raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            await rolled_back()
        assert not changed.is_set()
        await write(writer, 1)
        await asyncio.wait_for(changed.wait(), 30)
        head = await writer.head()
        assert head is not None
        assert head["number"] == 1


async def test_a_socket_its_reader_left_behind_is_removed_by_the_next_commit(
    tmp_path: Path,
) -> None:
    database = tmp_path / "chain.db"
    directory = wake_dir(database)
    directory.mkdir()
    dead = directory / "1-dead.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as gone:
        gone.bind(str(dead))  # closed without removing its file, as a killed reader
    (directory / "notes.txt").write_text("not a socket: left alone")
    assert wake_readers(database) == 0
    assert not dead.exists()
    assert (directory / "notes.txt").exists()


async def test_a_database_path_too_long_for_a_socket_address_is_woken(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    database = deep / "chain.db"
    assert len(os.fsencode(str(wake_dir(database)))) > 108
    async with watched(SqliteUrl(database)) as (store, changed):
        await write(store, 0)
        await asyncio.wait_for(changed.wait(), 30)


async def test_readers_each_get_a_socket_and_the_last_one_out_removes_the_directory(
    tmp_path: Path,
) -> None:
    database = tmp_path / "chain.db"
    first, second = WakeSocket(database), WakeSocket(database)
    assert first.open()
    assert second.open()
    assert wake_readers(database) == 2
    await asyncio.wait_for(first.event.wait(), 30)
    await asyncio.wait_for(second.event.wait(), 30)
    first.close()
    assert wake_readers(database) == 1
    second.close()
    assert not wake_dir(database).exists()
    assert wake_readers(database) == 0


async def test_a_lost_listen_connection_listens_again(postgres_url: str) -> None:
    async with watched(parse_blockdb_url(postgres_url)) as (store, changed):
        await asyncio.wait_for(changed.wait(), 30)  # listening
        changed.clear()
        await write(store, 0)
        await asyncio.wait_for(changed.wait(), 30)
        admin = await asyncpg.connect(postgres_url)
        try:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE query LIKE 'LISTEN %blockx_blocks%' AND pid <> pg_backend_pid()"
            )
        finally:
            await admin.close()
        assert killed >= 1
        changed.clear()
        # Listening again sets it (commits may have been missed meanwhile); then
        # a commit wakes it through the new connection.
        await asyncio.wait_for(changed.wait(), 30)
        changed.clear()
        await write(store, 1)
        await asyncio.wait_for(changed.wait(), 30)
