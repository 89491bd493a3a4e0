"""The sink database on both engines: tables made and widened from rows, block
replacement with its ledger, upserts, refusals, rollback, two writers of one block."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import asyncpg
import pytest

from blockx_chain.sink import (
    JobEntry,
    SinkMismatch,
    SinkRejected,
    SinkStore,
    SinkUnavailable,
    open_sink,
)
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url

BIG = 2**70 + 1


def _user_columns(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in r.items() if k not in ("code_epoch",)} for r in rows]


async def test_a_table_is_inferred_stamped_and_replaced_per_block(sink: SinkStore) -> None:
    first = [
        (1, "0xa1", [{"token": "t", "amount": BIG, "n": 2, "price": 1.5, "meta": {"x": [1]}}]),
        (2, "0xa2", [{"token": "u", "amount": 3, "n": 1}, {"token": "v", "amount": 4, "n": 1}]),
    ]
    result = await sink.replace_blocks("volume", 1, first, code_epoch=7, task_id="t1", now_ms=99)
    assert result == {"blocks": 2, "rows": 3}
    rows = await sink.rows("volume")
    assert [(r["block_number"], r["row_index"], r["token"]) for r in rows] == [
        (1, 0, "t"),
        (2, 0, "u"),
        (2, 1, "v"),
    ]
    # An int beyond 63 bits is NUMERIC: exact, read back as decimal text.
    assert rows[0]["amount"] == str(BIG)
    assert rows[1]["amount"] == "3"
    assert rows[0]["block_hash"] == "0xa1"
    assert rows[0]["code_epoch"] == 7
    assert rows[0]["price"] == 1.5
    assert rows[1]["price"] is None

    # Again, the same: idempotent. Then block 2 on a new hash with one row.
    await sink.replace_blocks("volume", 1, first, code_epoch=7, task_id="t1", now_ms=99)
    assert await sink.rows("volume") == rows
    await sink.replace_blocks(
        "volume", 1, [(2, "0xb2", [{"token": "w", "amount": 5, "n": 1, "extra": "new"}])]
    )
    rows = await sink.rows("volume")
    assert [(r["block_number"], r["block_hash"], r["token"]) for r in rows] == [
        (1, "0xa1", "t"),
        (2, "0xb2", "w"),
    ]
    # A new column is added, nullable.
    assert rows[0]["extra"] is None
    assert rows[1]["extra"] == "new"
    ledger = await sink.written("volume", 1)
    assert [(r["block_number"], r["block_hash"], r["task_id"]) for r in ledger] == [
        (1, "0xa1", "t1"),
        (2, "0xb2", ""),
    ]


async def test_a_block_without_rows_is_in_the_ledger(sink: SinkStore) -> None:
    await sink.replace_blocks("empty", 1, [(5, "0x05", [{"a": 1}]), (6, "0x06", [])], task_id="t")
    await sink.replace_blocks("empty", 1, [(5, "0x05", [])], task_id="t2")
    assert await sink.rows("empty") == []
    assert [(r["block_number"], r["task_id"]) for r in await sink.written("empty", 1)] == [
        (5, "t2"),
        (6, "t"),
    ]


async def test_replacing_blocks_with_a_gap_leaves_the_gap_alone(sink: SinkStore) -> None:
    await sink.replace_blocks("gap", 1, [(n, f"0x{n}", [{"v": n}]) for n in (1, 2, 3, 5)])
    await sink.replace_blocks("gap", 1, [(3, "0x3b", [{"v": 30}]), (1, "0x1b", []), (5, "0x5", [])])
    assert [(r["block_number"], r["v"]) for r in await sink.rows("gap")] == [(2, 2), (3, 30)]
    assert [(r["block_number"], r["block_hash"]) for r in await sink.written("gap", 1)] == [
        (1, "0x1b"),
        (2, "0x2"),
        (3, "0x3b"),
        (5, "0x5"),
    ]


async def test_declared_columns_and_a_changed_type(sink: SinkStore) -> None:
    await sink.replace_blocks(
        "typed", 1, [(1, "0x1", [{"v": "1"}])], columns={"v": "text", "j": "JSON"}
    )
    with pytest.raises(SinkRejected, match="column 'v' of table 'typed' is TEXT"):
        await sink.replace_blocks("typed", 1, [(1, "0x1", [{"v": 1}])])
    with pytest.raises(SinkRejected, match="is TEXT, the writer declares INTEGER"):
        await sink.replace_blocks("typed", 1, [(1, "0x1", [])], columns={"v": "INTEGER"})
    with pytest.raises(SinkRejected, match="not one of"):
        await sink.replace_blocks("typed", 1, [(1, "0x1", [])], columns={"v": "BLOB"})


async def test_a_bad_row_rolls_the_whole_write_back(sink: SinkStore) -> None:
    await sink.replace_blocks("t", 1, [(1, "0x1", [{"v": 1}]), (2, "0x2", [{"v": 2}])], task_id="a")
    before, ledger = await sink.rows("t"), await sink.written("t", 1)
    # Block 1 would be replaced fine, block 2's row does not fit: neither changes,
    # and the new column of block 1's row is not added either.
    bad: list[tuple[int, str, list[dict[str, object]]]] = [
        (1, "0x1b", [{"v": 10, "w": "x"}]),
        (2, "0x2b", [{"v": "nope"}]),
    ]
    with pytest.raises(SinkRejected, match="column 'v'"):
        await sink.replace_blocks("t", 1, bad, task_id="b")
    assert await sink.rows("t") == before
    assert await sink.written("t", 1) == ledger
    with pytest.raises(SinkRejected, match="carries block_number 9"):
        await sink.replace_blocks("t", 1, [(1, "0x1", [{"v": 1, "block_number": 9}])])
    with pytest.raises(SinkRejected, match="no key column 'id'"):
        await sink.replace_blocks("k", 1, [(1, "0x1", [{"id": 1}, {"v": 2}])], key=["id"])
    with pytest.raises(SinkRejected, match="do not fit"):
        await sink.replace_blocks("k", 1, [(1, "0x1", [{"id": 1}, {"id": 1}])], key=["id"])
    assert await sink.rows("k") == []


@pytest.mark.parametrize(
    "table",
    [
        "blocks",
        "logs",
        "erc20_transfers",
        "nft_transfers",
        "traces",
        "contracts",
        "Reorgs",
        "_blockx_written",
        "bad name",
        "1x",
    ],
)
async def test_chain_and_reserved_tables_and_bad_names_are_refused(
    sink: SinkStore, table: str
) -> None:
    with pytest.raises(SinkRejected):
        await sink.replace_blocks(table, 1, [(1, "0x1", [{"v": 1}])])
    with pytest.raises(SinkRejected):
        await sink.upsert(table, [{"v": 1}], key=["v"])


async def test_a_bad_column_name_is_refused(sink: SinkStore) -> None:
    with pytest.raises(SinkRejected, match="column 'a\"b'"):
        await sink.replace_blocks("t", 1, [(1, "0x1", [{'a"b': 1}])])


async def test_the_sink_can_share_the_block_database(db_url: str) -> None:
    store = await open_store(parse_blockdb_url(db_url))
    sink = await open_sink(parse_blockdb_url(db_url))
    try:
        with pytest.raises(SinkRejected, match="block database table"):
            await sink.replace_blocks("transactions", 1, [(1, "0x1", [{"v": 1}])])
        await sink.replace_blocks("mine", 1, [(1, "0x1", [{"v": 1}])])
        assert await store.head() is None
    finally:
        await sink.close()
        await store.close()
    # The block database still opens (the sink's tables do not confuse it).
    reopened = await open_store(parse_blockdb_url(db_url))
    await reopened.close()


async def test_upsert_by_key(sink: SinkStore) -> None:
    await sink.upsert("balances", [{"who": "a", "n": 1}, {"who": "b", "n": 2}], key=["who"])
    await sink.upsert("balances", [{"who": "a", "n": 5, "note": "x"}], key=["who"])
    rows = sorted(await sink.rows("balances"), key=lambda r: str(r["who"]))
    assert rows == [{"who": "a", "n": 5, "note": "x"}, {"who": "b", "n": 2, "note": None}]
    with pytest.raises(SinkRejected, match="no key column 'who'"):
        await sink.upsert("balances", [{"n": 1}], key=["who"])


async def test_two_writers_of_one_block_never_both_commit(db_url: str) -> None:
    url = parse_blockdb_url(db_url)
    one, two = await open_sink(url), await open_sink(url)
    try:
        await one.replace_blocks("race", 1, [(1, "0x1", [{"v": 0}])])
        for _ in range(3):
            await asyncio.gather(
                one.replace_blocks("race", 1, [(1, "0x1", [{"v": 1, "w": i} for i in range(20)])]),
                two.replace_blocks("race", 1, [(1, "0x1", [{"v": 2, "w": i} for i in range(30)])]),
            )
            rows = await one.rows("race")
            assert {r["v"] for r in rows} in ({1}, {2})
            assert len(rows) == (20 if rows[0]["v"] == 1 else 30)
    finally:
        await one.close()
        await two.close()


async def test_a_sink_has_one_identity_and_a_write_meant_for_another_writes_nothing(
    db_url: str, tmp_path: Path
) -> None:
    url = parse_blockdb_url(db_url)
    one, two = await open_sink(url), await open_sink(url)
    other = await open_sink(parse_blockdb_url(f"sqlite:///{tmp_path}/other.db"))
    try:
        identity = await one.identity()
        assert await two.identity() == identity
        elsewhere = await other.identity()
        assert elsewhere != identity
        with pytest.raises(SinkMismatch, match=f"identity {identity}.*identity {elsewhere}"):
            await one.replace_blocks("t", 1, [(1, "0x1", [{"v": 1}])], sink_identity=elsewhere)
        with pytest.raises(SinkMismatch):
            await one.upsert("u", [{"k": 1}], key=["k"], sink_identity=elsewhere)
        with pytest.raises(SinkMismatch):  # with nothing to write, still checked
            await one.upsert("u", [], key=["k"], sink_identity=elsewhere)
        assert (await one.rows("t"), await one.written("t", 1), await one.rows("u")) == ([], [], [])
        written = await two.replace_blocks("t", 1, [(1, "0x1", [{"v": 1}])], sink_identity=identity)
        assert written == {"blocks": 1, "rows": 1}
    finally:
        for sink in (one, two, other):
            await sink.close()


async def test_a_write_goes_in_chunks_inside_its_one_transaction(db_url: str) -> None:
    sink = await open_sink(parse_blockdb_url(db_url), chunk_rows=3)
    try:
        blocks = [(1, "0x1", [{"v": i} for i in range(4)]), (2, "0x2", []), (3, "0x3", [])]
        blocks.append((4, "0x4", [{"v": 10 + i} for i in range(5)]))
        assert await sink.replace_blocks("c", 1, blocks) == {"blocks": 4, "rows": 9}
        rows = await sink.rows("c")
        assert [(r["block_number"], r["row_index"], r["v"]) for r in rows] == [
            *((1, i, i) for i in range(4)),
            *((4, i, 10 + i) for i in range(5)),
        ]
        # A row that does not fit in the last chunk: the chunks before it are undone.
        bad = [(5, "0x5", [{"v": 1}] * 7 + [{"v": "x"}])]
        with pytest.raises(SinkRejected, match="column 'v' of table 'c' is INTEGER"):
            await sink.replace_blocks("c", 1, bad)
        assert await sink.rows("c") == rows
        await sink.upsert("cu", [{"k": i % 4, "n": i} for i in range(10)], key=["k"])
        assert sorted((r["k"], r["n"]) for r in await sink.rows("cu")) == [
            (0, 8),
            (1, 9),
            (2, 6),
            (3, 7),
        ]
    finally:
        await sink.close()


def _job(job_id: str, *, updated_ms: int, ended_ms: int | None = None) -> JobEntry:
    return JobEntry(
        job_id=job_id,
        kind="backfill",
        state="running" if ended_ms is None else "finished",
        function="f",
        sink_table="t",
        started_ms=updated_ms,
        updated_ms=updated_ms,
        ended_ms=ended_ms,
        record=f'{{"job_id": "{job_id}"}}',
    )


async def test_job_records_are_upserted_listed_newest_first_and_pruned(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = parse_blockdb_url(db_url)
    sink = await open_sink(url)
    try:
        await sink.put_job(_job("a", updated_ms=1))
        await sink.put_job(_job("b", updated_ms=2))
        await sink.put_job(_job("a", updated_ms=3, ended_ms=3))
        rows = await sink.jobs(10)
        assert [(r["job_id"], r["state"], r["ended_ms"]) for r in rows] == [
            ("a", "finished", 3),
            ("b", "running", None),
        ]
        assert [r["job_id"] for r in await sink.jobs(1)] == ["a"]
        assert [r["record"] for r in await sink.jobs(10, "b")] == ['{"job_id": "b"}']
        # A new record trims the ended ones beyond the newest kept; running ones stay.
        monkeypatch.setattr("blockx_chain.sink.base.JOBS_KEPT", 1)
        await sink.put_job(_job("c", updated_ms=4, ended_ms=4), prune=True)
        assert sorted(r["job_id"] for r in await sink.jobs(10)) == ["b", "c"]
    finally:
        await sink.close()
    # Durable: another store on the database reads them, read-only.
    reader = await open_sink(url, read_only=True)
    try:
        assert [r["job_id"] for r in await reader.jobs(10)] == ["c", "b"]
        with pytest.raises(SinkRejected, match="read-only"):
            await reader.put_job(_job("d", updated_ms=5))
    finally:
        await reader.close()


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def test_a_reader_makes_nothing(tmp_path: Path, postgres_url: str) -> None:
    missing = tmp_path / "typo.db"
    with pytest.raises(SinkUnavailable, match=f"no sink database at {missing}"):
        await open_sink(parse_blockdb_url(f"sqlite:///{missing}"), read_only=True)
    assert _names(tmp_path) == []
    # A database no writer has opened yet: no job records, and no tables made.
    (tmp_path / "empty.db").touch()
    for url in (f"sqlite:///{tmp_path}/empty.db", postgres_url):
        reader = await open_sink(parse_blockdb_url(url), read_only=True)
        try:
            assert await reader.jobs(10) == []
        finally:
            await reader.close()
    assert _names(tmp_path) == ["empty.db"]
    assert (
        sqlite3.connect(tmp_path / "empty.db").execute("SELECT * FROM sqlite_master").fetchall()
        == []
    )
    pg = await asyncpg.connect(postgres_url)
    try:
        assert await pg.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
    finally:
        await pg.close()
