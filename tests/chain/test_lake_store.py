"""The lake on real pyiceberg SQL catalogs (SQLite in tmp_path, and the tests'
PostgreSQL) with a local warehouse: block rows replaced per block, refusals, the
ledger rebuilt from snapshot summaries, concurrent writers, snapshot expiry,
bounded scans at a snapshot."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from blockx_chain.lake import (
    LAKE_TABLE,
    LakeConfig,
    LakeConfigError,
    LakeStore,
    TooManyRows,
    lake_of,
)
from blockx_chain.lake.store import KEEP_SNAPSHOTS
from blockx_chain.sink import SinkMismatch, SinkRejected, SinkUnavailable, open_sink
from blockx_chain.url import parse_blockdb_url


def _config(tmp_path: Path, uri: str, **fields: Any) -> LakeConfig:
    return LakeConfig(uri=uri, warehouse=str(tmp_path / "warehouse"), **fields)


@pytest.fixture(params=["sqlite", "postgres"])
def catalog_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/catalog.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest_asyncio.fixture
async def lake(tmp_path: Path) -> AsyncIterator[LakeStore]:
    store = await LakeStore.open(_config(tmp_path, f"sqlite:///{tmp_path}/catalog.db"))
    yield store
    await store.close()


def _user(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["chain_id"], r["block_number"], r["block_hash"], r["v"]) for r in rows]


async def _all(lake: LakeStore, table: str = "t") -> list[tuple[Any, ...]]:
    answer = await lake.scan(table)
    return sorted(_user(answer["rows"]))


async def test_blocks_are_replaced_per_block_and_a_rerun_leaves_the_same_rows(
    tmp_path: Path, catalog_uri: str
) -> None:
    lake = await LakeStore.open(_config(tmp_path, catalog_uri))
    try:
        blocks: list[tuple[int, str, list[dict[str, Any]]]] = [
            (1, "0xa", [{"v": 1}, {"v": 2}]),
            (2, "0xb", []),
            (3, "0xc", [{"v": 3, "j": {"k": [1]}}]),
        ]
        done = await lake.replace_blocks("t", 1, blocks, task_id="a", code_epoch=4, now_ms=9)
        assert done["blocks"] == 3
        assert done["rows"] == 3
        assert done["snapshot_id"] != 0
        await lake.replace_blocks("t", 2, [(1, "0xz", [{"v": 100}])])
        first = await _all(lake)
        again = await lake.replace_blocks("t", 1, blocks, task_id="a", code_epoch=4, now_ms=9)
        assert again["snapshot_id"] != done["snapshot_id"]
        assert await _all(lake) == first
        # Block 3 rewritten on another branch: its rows only are replaced.
        await lake.replace_blocks("t", 1, [(3, "0xd", [{"v": 30}])], task_id="b")
        assert await _all(lake) == [
            (1, 1, "0xa", Decimal(1)),
            (1, 1, "0xa", Decimal(2)),
            (1, 3, "0xd", Decimal(30)),
            (2, 1, "0xz", Decimal(100)),
        ]
        ledger = await lake.written("t", 1)
        assert [(r["block_number"], r["block_hash"], r["task_id"]) for r in ledger] == [
            (1, "0xa", "a"),
            (2, "0xb", "a"),
            (3, "0xd", "b"),
        ]
        # JSON columns come back decoded; NUMERIC columns as decimals.
        rows = (await lake.scan("t", "block_number = 1 and chain_id = 1"))["rows"]
        assert sorted(r["row_index"] for r in rows) == [0, 1]
        assert await lake.delete_blocks("t", 1, [2, 3, 7]) == 2
        assert [r["block_number"] for r in await lake.written("t", 1)] == [1]
        assert await _all(lake) == [
            (1, 1, "0xa", Decimal(1)),
            (1, 1, "0xa", Decimal(2)),
            (2, 1, "0xz", Decimal(100)),
        ]
        # The drivers read the same ledger and identity from the plain sink store.
        sink = await open_sink(lake.config.ledger())
        try:
            assert await sink.identity() == await lake.identity()
            assert [r["block_number"] for r in await sink.written("t", 2)] == [1]
        finally:
            await sink.close()
    finally:
        await lake.close()


async def test_json_values_and_declared_columns(lake: LakeStore) -> None:
    await lake.replace_blocks(
        "t", 1, [(1, "0xa", [{"v": 5, "meta": {"a": [1, 2]}, "who": "x"}])], columns={"v": "REAL"}
    )
    (row,) = (await lake.scan("t"))["rows"]
    assert (row["meta"], row["v"], row["who"]) == ({"a": [1, 2]}, 5.0, "x")
    types = await lake.column_types("t")
    assert (types["meta"], types["who"], types["v"]) == ("JSON", "TEXT", "REAL")


async def test_a_key_replaces_row_index_and_needs_its_columns(lake: LakeStore) -> None:
    key = ["block_number", "token"]
    rows = [{"token": "a", "n": 1}, {"token": "b", "n": 2}]
    await lake.replace_blocks("t", 1, [(1, "0xa", rows)], key=key)
    found = (await lake.scan("t"))["rows"]
    assert sorted((r["token"], r["n"]) for r in found) == [("a", 1), ("b", 2)]
    assert "row_index" not in found[0]
    with pytest.raises(SinkRejected, match="no key column 'token'"):
        await lake.replace_blocks("t", 1, [(2, "0xb", [{"n": 3}])], key=key)
    with pytest.raises(SinkRejected, match="key column 'nope'"):
        await lake.replace_blocks("t", 1, [(2, "0xb", [{"n": 3}])], key=["nope"])


async def test_a_value_beyond_38_digits_is_refused_naming_the_column(lake: LakeStore) -> None:
    with pytest.raises(SinkRejected, match=r"column 'amount'.*38.*TEXT") as refused:
        await lake.replace_blocks("t", 1, [(1, "0xa", [{"amount": 10**40}])])
    assert not refused.value.retryable
    assert await lake.written("t", 1) == []
    # Within 38 digits: a decimal(38, scale) column; a later wider value is refused too.
    await lake.replace_blocks("t", 1, [(1, "0xa", [{"amount": 2**100}])])
    assert (await lake.scan("t"))["rows"][0]["amount"] == Decimal(2**100)
    with pytest.raises(SinkRejected, match="amount"):
        await lake.replace_blocks("t", 1, [(2, "0xb", [{"amount": -(10**39)}])])
    assert [r["block_number"] for r in await lake.written("t", 1)] == [1]


async def test_a_sink_of_another_identity_is_refused(lake: LakeStore) -> None:
    with pytest.raises(SinkMismatch):
        await lake.replace_blocks("t", 1, [(1, "0xa", [{"v": 1}])], sink_identity="other")
    assert await lake.written("t", 1) == []
    own = await lake.identity()
    await lake.replace_blocks("t", 1, [(1, "0xa", [{"v": 1}])], sink_identity=own)
    assert len(await lake.written("t", 1)) == 1


def _lose_ledger(db: Path, table: str, sequence: int) -> None:
    """The ledger database as a crash right after a commit at ``sequence`` + 1
    leaves it: that commit's entries missing, the table's marker before it."""
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM _blockx_written WHERE table_name = ?", (table,))
        conn.execute(
            f"UPDATE {LAKE_TABLE} SET applied_sequence = ? WHERE table_name = ?", (sequence, table)
        )


async def test_the_ledger_is_rebuilt_from_snapshots_after_a_crash(tmp_path: Path) -> None:
    config = _config(tmp_path, f"sqlite:///{tmp_path}/catalog.db")
    lake = await LakeStore.open(config)
    await lake.replace_blocks("t", 1, [(1, "0xa", [{"v": 1}]), (2, "0xb", [])], task_id="one")
    await lake.replace_blocks("t", 1, [(3, "0xc", [{"v": 3}])], task_id="two")
    expected = await lake.written("t", 1)
    await lake.close()

    # A crash between the first commit and its ledger: a store opening rebuilds it.
    _lose_ledger(tmp_path / "catalog.db", "t", 0)
    sink = await open_sink(config.ledger())
    assert await sink.written("t", 1) == []
    await sink.close()
    lake = await LakeStore.open(config)
    assert await lake.ledger.written("t", 1) == expected

    # A crash after a commit, then another writer's write: it applies both.
    _lose_ledger(tmp_path / "catalog.db", "t", 0)
    await lake.replace_blocks("t", 1, [(4, "0xd", [{"v": 4}])], task_id="three")
    assert [r["task_id"] for r in await lake.ledger.written("t", 1)] == [
        "one",
        "one",
        "two",
        "three",
    ]
    await lake.close()


async def test_two_writers_commit_at_once_and_both_land(tmp_path: Path) -> None:
    config = _config(tmp_path, f"sqlite:///{tmp_path}/catalog.db")
    first = await LakeStore.open(config)
    second = await LakeStore.open(config)
    try:
        await first.replace_blocks("t", 1, [(0, "0x0", [{"v": 0}])])
        writes = [
            store.replace_blocks("t", 1, [(n, f"0x{n}", [{"v": n}])], task_id=f"w{n}")
            for n in range(1, 9)
            for store in [first if n % 2 else second]
        ]
        await asyncio.gather(*writes)
        assert [r["block_number"] for r in await second.written("t", 1)] == list(range(9))
        assert [row[1] for row in await _all(first)] == list(range(9))
    finally:
        await first.close()
        await second.close()


async def test_snapshots_are_expired_as_it_writes(lake: LakeStore) -> None:
    for n in range(3 * KEEP_SNAPSHOTS):
        await lake.replace_blocks("t", 1, [(n, "0xa", [{"v": n}])])
    history = lake.catalog.load_table(("blockx", "t")).metadata.snapshots
    # An overwrite makes two snapshots in its one commit.
    assert len(history) <= 2 * KEEP_SNAPSHOTS + 2
    assert len(await lake.written("t", 1)) == 3 * KEEP_SNAPSHOTS
    assert len((await lake.scan("t"))["rows"]) == 3 * KEEP_SNAPSHOTS


async def test_scans_are_bounded_and_a_snapshot_is_pinned(tmp_path: Path) -> None:
    lake = await LakeStore.open(_config(tmp_path, f"sqlite:///{tmp_path}/catalog.db", max_rows=5))
    try:
        first = await lake.replace_blocks(
            "t", 1, [(n, "0xa", [{"v": n}, {"v": -n}]) for n in range(5)]
        )
        with pytest.raises(TooManyRows, match="narrow"):
            await lake.scan("t")
        narrow = await lake.scan("t", "block_number < 2", columns=["block_number", "v"])
        assert sorted(r["v"] for r in narrow["rows"]) == [-1, 0, 0, 1]
        assert set(narrow["rows"][0]) == {"block_number", "v"}
        assert len((await lake.scan("t", limit=3))["rows"]) == 3
        with pytest.raises(TooManyRows):
            await lake.scan("t", limit=6)
        await lake.replace_blocks("t", 1, [(0, "0xb", [{"v": 99}])])
        pinned = await lake.scan("t", "block_number = 0", snapshot_id=first["snapshot_id"])
        assert pinned["snapshot_id"] == first["snapshot_id"]
        assert sorted(r["v"] for r in pinned["rows"]) == [0, 0]
        newest = await lake.scan("t", "block_number = 0")
        assert [r["v"] for r in newest["rows"]] == [99]
        with pytest.raises(SinkRejected, match="no snapshot"):
            await lake.scan("t", snapshot_id=12345)
        with pytest.raises(SinkRejected, match="no column"):
            await lake.scan("t", columns=["nope"])
        with pytest.raises(SinkRejected, match="no table"):
            await lake.scan("missing")
        with pytest.raises(SinkRejected, match="row_filter"):
            await lake.scan("t", "block_number >>> 2")
    finally:
        await lake.close()


def test_a_configuration_that_cannot_work_names_its_field(tmp_path: Path) -> None:
    with pytest.raises(LakeConfigError, match=r"^ledger_url:"):
        LakeConfig(uri="http://127.0.0.1:1/rest", catalog_type="rest").catalog_properties()
    with pytest.raises(LakeConfigError, match=r"^catalog_type:"):
        LakeConfig(uri="x", catalog_type="nope").catalog_properties()
    with pytest.raises(LakeConfigError, match=r"^uri:"):
        LakeConfig(uri="mysql://h/db").catalog_properties()
    properties = LakeConfig(uri="postgresql://u@h:5/db", warehouse="w").catalog_properties()
    assert properties["uri"] == "postgresql+psycopg2://u@h:5/db"
    assert properties["warehouse"].startswith("file:///")


async def test_a_driver_finds_the_lake_of_its_sink_database(tmp_path: Path) -> None:
    ledger_db = f"sqlite:///{tmp_path}/catalog.db"
    lake = await LakeStore.open(_config(tmp_path, ledger_db))
    await lake.replace_blocks("t", 1, [(1, "0xa", [{"v": 1}])])
    await lake.close()
    url = parse_blockdb_url(ledger_db)
    assert await lake_of(url, "other") is None
    found = await lake_of(url, "t")
    assert found is not None
    try:
        assert await found.delete_blocks("t", 1, [1]) == 1
        assert (await found.scan("t"))["rows"] == []
    finally:
        await found.close()
    # A SQL catalog elsewhere than the ledger's database: a driver cannot reach it.
    apart = _config(tmp_path, f"sqlite:///{tmp_path}/apart.db", ledger_url=ledger_db)
    elsewhere = await LakeStore.open(apart)
    await elsewhere.replace_blocks("u", 1, [(1, "0xa", [{"v": 1}])])
    await elsewhere.close()
    with pytest.raises(SinkRejected, match="does not reach"):
        await lake_of(url, "u")


async def test_the_code_of_a_written_block_is_kept_while_the_ledger_names_its_task(
    lake: LakeStore,
) -> None:
    first = {"f": "def f(row):\n    return row\n"}
    second = {"f": "def f(row):\n    return {**row, 'x': 1}\n"}
    await lake.replace_blocks(
        "t", 1, [(1, "0xa", [{"v": 1}])], task_id="t1", code_digest="a" * 64, code_sources=first
    )
    [entry] = await lake.ledger.code_of("t", 1, 1)
    assert entry.code is not None
    assert (entry.task_id, entry.code.sources) == ("t1", first)
    # The block rewritten by another task with other code: the first set goes.
    await lake.replace_blocks(
        "t", 1, [(1, "0xa", [{"v": 2}])], task_id="t2", code_digest="b" * 64, code_sources=second
    )
    [entry] = await lake.ledger.code_of("t", 1, 1)
    assert entry.code is not None
    assert (entry.task_id, entry.code.sources) == ("t2", second)
    assert await lake.ledger.code_by_digest("a" * 64) is None


async def test_a_read_only_store_scans_and_makes_nothing(tmp_path: Path) -> None:
    """The Sync Invoker's lake: before any writer there is nothing to open (no
    ledger file is made); after one, it scans what was written, and its opening
    adds no table, namespace or ledger row."""
    config = _config(tmp_path, f"sqlite:///{tmp_path}/catalog.db")
    with pytest.raises(SinkUnavailable):
        await LakeStore.open(config, read_only=True)
    assert not (tmp_path / "catalog.db").exists()

    writer = await LakeStore.open(config)
    try:
        await writer.replace_blocks("t", 1, [(5, "0xa", [{"v": 1}])])
    finally:
        await writer.close()

    def contents() -> list[tuple[Any, ...]]:
        with sqlite3.connect(tmp_path / "catalog.db") as db:
            query = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            tables = db.execute(query).fetchall()
            rows = [db.execute(f'SELECT * FROM "{name}"').fetchall() for (name,) in tables]
        return [*tables, *rows]

    # A ledger behind its table, as after a crash: a writer's opening would
    # rebuild it from the snapshots; a reader's leaves it.
    with sqlite3.connect(tmp_path / "catalog.db") as db:
        db.execute(f"UPDATE {LAKE_TABLE} SET applied_sequence = 0")
    before = contents()
    reader = await LakeStore.open(
        _config(tmp_path, f"sqlite:///{tmp_path}/catalog.db"), read_only=True
    )
    try:
        assert await _all(reader) == [(1, 5, "0xa", 1)]
    finally:
        await reader.close()
    assert contents() == before
