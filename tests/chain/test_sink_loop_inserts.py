"""A SQLite sink inserts a write's rows on the event loop's thread, a chunk at a
time: the loop's other work runs between two chunks, and closing the sink waits
for the write under way instead of closing the connection under it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from blockx_chain.sink import open_sink
from blockx_chain.sink import sqlite as sqlite_sink
from blockx_chain.url import parse_blockdb_url

ROWS = 50


def _rows_in_file(path: Path) -> list[tuple[int, int]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT block_number, v FROM many ORDER BY block_number, v").fetchall()


async def test_the_loop_runs_between_two_chunks_of_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = await open_sink(parse_blockdb_url(f"sqlite:///{tmp_path}/sink.db"), chunk_rows=5)
    ticks = 0
    writing = True
    ticks_at_each_chunk: list[int] = []
    rows_in = sqlite_sink.SqliteSink._rows_in

    async def counted(
        self: sqlite_sink.SqliteSink, work: Callable[[sqlite3.Connection], object]
    ) -> object:
        ticks_at_each_chunk.append(ticks)
        return await rows_in(self, work)

    async def tick() -> None:
        nonlocal ticks
        while writing:
            ticks += 1
            await asyncio.sleep(0)

    monkeypatch.setattr(sqlite_sink.SqliteSink, "_rows_in", counted)
    ticker = asyncio.create_task(tick())
    try:
        rows = [{"v": i} for i in range(ROWS)]
        await sink.replace_blocks("many", 1, [(7, "0x07", rows)], task_id="t")
    finally:
        writing = False
        await ticker
        await sink.close()
    # Ten chunks of five rows, then the ledger's row: the ticker ran between each
    # two of them (the chunks themselves wait for nothing).
    assert len(ticks_at_each_chunk) == ROWS // 5 + 1
    assert all(a < b for a, b in itertools.pairwise(ticks_at_each_chunk)), ticks_at_each_chunk
    assert _rows_in_file(tmp_path / "sink.db") == [(7, i) for i in range(ROWS)]


async def test_closing_the_sink_waits_for_the_write_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = await open_sink(parse_blockdb_url(f"sqlite:///{tmp_path}/sink.db"), chunk_rows=5)
    first_chunk = asyncio.Event()
    rows_in = sqlite_sink.SqliteSink._rows_in

    async def noticed(
        self: sqlite_sink.SqliteSink, work: Callable[[sqlite3.Connection], object]
    ) -> object:
        done = await rows_in(self, work)
        first_chunk.set()
        return done

    monkeypatch.setattr(sqlite_sink.SqliteSink, "_rows_in", noticed)
    rows = [{"v": i} for i in range(ROWS)]
    write = asyncio.create_task(sink.replace_blocks("many", 1, [(7, "0x07", rows)], task_id="t"))
    await first_chunk.wait()
    assert not write.done()
    await sink.close()
    assert write.done()
    assert await write == {"blocks": 1, "rows": ROWS}
    assert _rows_in_file(tmp_path / "sink.db") == [(7, i) for i in range(ROWS)]
