"""The block database on both engines: schema, migrations, writes, reads, limits."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import msgspec
import pytest
from chain_rows import GENESIS, OTHER_TOPIC, TOKEN, address, block_hash, make_block

from blockx_chain.schema import (
    BLOCKS,
    MIGRATIONS,
    SCHEMA_VERSION,
    TABLES,
    TRANSFER_TOPIC,
    BlockRows,
    ColumnType,
    Engine,
    RowError,
)
from blockx_chain.store import (
    BlockStore,
    ChainMismatch,
    SchemaRefused,
    StoreError,
    StoreUnavailable,
    TooManyRows,
    WriterBusy,
    open_store,
)
from blockx_chain.url import parse_blockdb_url


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[BlockStore]:
    opened = await open_store(parse_blockdb_url(db_url), max_rows=50)
    yield opened
    await opened.close()


async def seed(store: BlockStore, numbers: range, *, txs: int = 2) -> None:
    async with store.writer() as w:
        await w.init_chain(31337, GENESIS)
        await w.insert_blocks([make_block(n, txs=txs) for n in numbers])
        last = numbers[-1]
        await w.set_chain(
            head_number=last, head_hash=block_hash(last), finalized_number=max(last - 2, 0), epoch=0
        )


def as_row(struct: msgspec.Struct) -> dict[str, object]:
    row = msgspec.structs.asdict(struct)
    if "value" in row:
        row["value"] = str(row["value"])
    return row


# -- schema -------------------------------------------------------------------

SQLITE_TYPES = {ColumnType.INTEGER: "INTEGER", ColumnType.UINT256: "TEXT"}
POSTGRES_TYPES = {ColumnType.INTEGER: "bigint", ColumnType.UINT256: "numeric"}


async def _catalog(db_url: str) -> tuple[dict[str, list[tuple[str, str, bool]]], set[str]]:
    """Per table, (column, type, NOT NULL) in order, and the index names."""
    url = parse_blockdb_url(db_url)
    tables: dict[str, list[tuple[str, str, bool]]] = {}
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(str(url.path))  # type: ignore[union-attr]
        for table in TABLES:
            info = conn.execute(f"PRAGMA table_info({table.name})").fetchall()
            tables[table.name] = [(c[1], c[2], bool(c[3]) or bool(c[5])) for c in info]
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        conn.close()
        return tables, indexes
    pg = await asyncpg.connect(db_url)
    try:
        for table in TABLES:
            rows = await pg.fetch(
                "SELECT column_name, data_type, is_nullable, numeric_precision, numeric_scale "
                "FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
                table.name,
            )
            tables[table.name] = [
                (
                    r["column_name"],
                    r["data_type"]
                    + (
                        f"({r['numeric_precision']},{r['numeric_scale']})"
                        if r["data_type"] == "numeric"
                        else ""
                    ),
                    r["is_nullable"] == "NO",
                )
                for r in rows
            ]
        indexes = {r["indexname"] for r in await pg.fetch("SELECT indexname FROM pg_indexes")}
    finally:
        await pg.close()
    return tables, indexes


async def test_the_tables_columns_types_and_indexes_are_the_pinned_ones(
    store: BlockStore, db_url: str
) -> None:
    tables, indexes = await _catalog(db_url)
    sqlite = db_url.startswith("sqlite")
    for table in TABLES:
        expected = []
        for c in table.columns:
            if c.type is ColumnType.INTEGER:
                type_ = "INTEGER" if sqlite else "bigint"
            elif c.type is ColumnType.UINT256:
                type_ = "TEXT" if sqlite else "numeric(78,0)"
            else:
                type_ = "TEXT" if sqlite else "text"
            expected.append((c.name, type_, not c.nullable))
        if table.name == "blocks":
            # Not a chain column: when ingest stored the block (version 2), so
            # between the first version's columns and those added after it.
            expected.insert(9, ("seen_at_ms", "INTEGER" if sqlite else "bigint", False))
        if table.name == "chain":
            # Whether the database holds traces (added by TRACES_SINCE).
            expected.append(("traces", "INTEGER" if sqlite else "bigint", True))
        assert tables[table.name] == expected, table.name
    assert [c[0] for c in tables["blocks"]] == [
        "block_number",
        "block_hash",
        "parent_hash",
        "timestamp",
        "miner",
        "gas_used",
        "gas_limit",
        "base_fee_per_gas",
        "transaction_count",
        "seen_at_ms",
        "nonce",
        "mix_hash",
        "sha3_uncles",
        "logs_bloom",
        "transactions_root",
        "state_root",
        "receipts_root",
        "difficulty",
        "total_difficulty",
        "size",
        "extra_data",
        "withdrawals_root",
        "blob_gas_used",
        "excess_blob_gas",
        "parent_beacon_block_root",
        "requests_hash",
        "uncle_count",
    ]
    assert [c[0] for c in tables["withdrawals"]] == [
        "block_number",
        "block_hash",
        "position",
        "withdrawal_index",
        "validator_index",
        "address",
        "amount",
    ]
    assert [c[0] for c in tables["chain"]] == [
        "chain_id",
        "genesis_hash",
        "head_number",
        "head_hash",
        "finalized_number",
        "epoch",
        "traces",
    ]
    assert {
        "blocks_by_hash",
        "transactions_by_hash",
        "logs_by_topic0",
        "logs_by_address",
        "erc20_transfers_by_token",
        "nft_transfers_by_token",
        "traces_by_to",
        "contracts_by_address",
        "withdrawals_by_address",
        "withdrawals_by_validator",
    } <= indexes


async def test_the_schema_version_is_recorded_and_a_second_open_changes_nothing(
    store: BlockStore, db_url: str
) -> None:
    await seed(store, range(0, 3))
    again = await open_store(parse_blockdb_url(db_url))
    try:
        assert await again.head() == {"number": 2, "hash": block_hash(2), "finalized": 0}
    finally:
        await again.close()
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(str(parse_blockdb_url(db_url).path))  # type: ignore[union-attr]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()
    else:
        pg = await asyncpg.connect(db_url)
        versions = [r["version"] for r in await pg.fetch("SELECT version FROM blockx_schema")]
        assert versions == [SCHEMA_VERSION]
        await pg.close()


async def _made_by_schema_v1(db_url: str) -> None:
    """A database as BlockX made it before version 2: its schema, one block."""
    engine = Engine.SQLITE if db_url.startswith("sqlite") else Engine.POSTGRES
    block = make_block(7).block
    # The first version's nine columns.
    values = msgspec.structs.astuple(block)[:9]
    insert = f"INSERT INTO blocks ({', '.join(BLOCKS.names[:9])}) VALUES "
    if engine is Engine.SQLITE:
        conn = sqlite3.connect(str(parse_blockdb_url(db_url).path))  # type: ignore[union-attr]
        for statement in MIGRATIONS[0](engine):
            conn.execute(statement)
        conn.execute(insert + f"({', '.join('?' * len(values))})", values)
        conn.execute("PRAGMA user_version = 1")
        conn.commit()
        conn.close()
        return
    pg = await asyncpg.connect(db_url)
    try:
        await pg.execute("CREATE TABLE blockx_schema (version INTEGER NOT NULL)")
        await pg.execute("INSERT INTO blockx_schema (version) VALUES (1)")
        for statement in MIGRATIONS[0](engine):
            await pg.execute(statement)
        marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
        await pg.execute(insert + f"({marks})", *values)
    finally:
        await pg.close()


async def test_a_version_1_database_gains_seen_at_and_ingest_sets_it(db_url: str) -> None:
    await _made_by_schema_v1(db_url)
    store = await open_store(parse_blockdb_url(db_url))
    try:
        # The block stored before the column existed: no time, its row unchanged.
        assert await store.seen_at(0, 10) == {7: None}
        assert await store.block(7) == as_row(make_block(7).block)
        async with store.writer() as w:
            await w.insert_blocks([make_block(8)], seen_at_ms=1_700_000_000_123)
        assert await store.seen_at(7, 8) == {7: None, 8: 1_700_000_000_123}
        # Bookkeeping, not chain data: no function read returns it.
        assert "seen_at_ms" not in (await store.blocks(7, 8))[1]
        assert "seen_at_ms" not in (await store.rows("blocks", 8))[0]
    finally:
        await store.close()
    tables, _ = await _catalog(db_url)
    assert tables["blocks"][9][0] == "seen_at_ms"


async def _set_version(db_url: str, version: int) -> None:
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(str(parse_blockdb_url(db_url).path))  # type: ignore[union-attr]
        conn.execute(f"PRAGMA user_version = {version}")
        conn.close()
    else:
        pg = await asyncpg.connect(db_url)
        await pg.execute("UPDATE blockx_schema SET version = $1", version)
        await pg.close()


async def test_a_newer_schema_is_refused_in_one_line(store: BlockStore, db_url: str) -> None:
    await _set_version(db_url, SCHEMA_VERSION + 1)
    with pytest.raises(SchemaRefused) as refused:
        await open_store(parse_blockdb_url(db_url))
    message = str(refused.value)
    assert f"schema version {SCHEMA_VERSION + 1}, newer than this BlockX's" in message
    assert "\n" not in message


async def test_a_database_of_other_tables_is_refused_and_left_alone(
    db_url: str, tmp_path: Path
) -> None:
    if db_url.startswith("sqlite"):
        path = parse_blockdb_url(db_url).path  # type: ignore[union-attr]
        conn = sqlite3.connect(str(path))
        conn.execute("CREATE TABLE blocks (x INTEGER)")
        conn.commit()
        conn.close()
    else:
        pg = await asyncpg.connect(db_url)
        await pg.execute("CREATE TABLE blocks (x INTEGER)")
        await pg.close()
    with pytest.raises(SchemaRefused, match="no BlockX block database"):
        await open_store(parse_blockdb_url(db_url))
    tables, _ = await _catalog(db_url)
    int_type = "INTEGER" if db_url.startswith("sqlite") else "integer"
    assert tables["blocks"] == [("x", int_type, False)]
    assert tables["logs"] == []


async def test_a_file_that_is_no_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("not a database, just text long enough to be read as a header" * 10)
    with pytest.raises(SchemaRefused, match="not a usable SQLite database"):
        await open_store(parse_blockdb_url(f"sqlite:///{path}"))


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_a_reader_never_creates_a_sqlite_file(tmp_path: Path) -> None:
    """Opened read-only, a missing or empty file is "no block database at PATH" and
    nothing is written: no file, no -wal, no -shm."""
    missing = tmp_path / "typo.db"
    with pytest.raises(StoreUnavailable) as refused:
        await open_store(parse_blockdb_url(f"sqlite:///{missing}"), read_only=True)
    assert str(refused.value) == f"no block database at {missing}"
    assert _names(tmp_path) == []
    missing.touch()
    with pytest.raises(StoreUnavailable, match="no block database at"):
        await open_store(parse_blockdb_url(f"sqlite:///{missing}"), read_only=True)
    assert _names(tmp_path) == ["typo.db"]


async def test_a_reader_reads_and_neither_writes_nor_migrates(db_url: str) -> None:
    writer = await open_store(parse_blockdb_url(db_url))
    await seed(writer, range(0, 3))
    await writer.close()
    reader = await open_store(parse_blockdb_url(db_url), read_only=True)
    try:
        assert (await reader.head() or {})["number"] == 2
        if db_url.startswith("sqlite"):
            with pytest.raises(StoreError, match="read-only"):
                async with reader.writer():
                    pass
    finally:
        await reader.close()


async def test_a_reader_of_a_version_1_file_reads_and_leaves_it_to_ingest(
    tmp_path: Path,
) -> None:
    """Until the next ingest migrates it, a reader reads the file as it is: every
    read but ``seen_at``, which knows no times yet."""
    db_url = f"sqlite:///{tmp_path}/v1.db"
    await _made_by_schema_v1(db_url)
    reader = await open_store(parse_blockdb_url(db_url), read_only=True)
    try:
        assert await reader.block(7) == as_row(make_block(7).block)
        assert await reader.seen_at(0, 10) == {7: None}
    finally:
        await reader.close()
    conn = sqlite3.connect(tmp_path / "v1.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()


async def test_another_chain_is_refused(store: BlockStore) -> None:
    await seed(store, range(0, 2))
    async with store.writer() as w:
        assert (await w.init_chain(31337, GENESIS)).head_number == 1
    with pytest.raises(ChainMismatch, match="holds chain 31337") as refused:
        async with store.writer() as w:
            await w.init_chain(31337, "0x" + "ff" * 32)
    assert "\n" not in str(refused.value)
    with pytest.raises(ChainMismatch):
        async with store.writer() as w:
            await w.init_chain(1, GENESIS)


# -- writes and reads ---------------------------------------------------------


async def test_every_column_round_trips(store: BlockStore) -> None:
    await seed(store, range(0, 3))
    rows = make_block(1)
    assert await store.block(1) == as_row(rows.block)
    assert await store.block(0) == as_row(make_block(0).block)  # base_fee_per_gas NULL
    assert await store.transactions(1) == [as_row(t) for t in rows.transactions]
    assert await store.logs(1) == [as_row(log) for log in rows.logs]
    chain = await store.chain()
    assert chain is not None
    assert (chain.chain_id, chain.genesis_hash, chain.head_number, chain.epoch) == (
        31337,
        GENESIS,
        2,
        0,
    )
    assert (chain.head_hash, chain.finalized_number) == (block_hash(2), 0)


async def test_erc20_transfers_are_derived_from_transfer_logs(store: BlockStore) -> None:
    block = make_block(5, txs=1)
    transfer = block.logs[0]
    erc721 = msgspec.structs.replace(
        transfer, log_index=7, topic3="0x" + "00" * 31 + "09", data="0x"
    )
    short = msgspec.structs.replace(transfer, log_index=8, data="0x" + "00" * 31)
    upper = msgspec.structs.replace(transfer, log_index=9, address=TOKEN.upper().replace("X", "x"))
    rows = BlockRows(
        block=block.block, transactions=block.transactions, logs=[*block.logs, erc721, short, upper]
    )
    async with store.writer() as w:
        written = await w.insert_blocks([rows])
    # The ERC-721-shaped log is an NFT transfer, not an ERC-20 one.
    assert written == {
        "blocks": 1,
        "transactions": 1,
        "logs": 5,
        "erc20_transfers": 2,
        "nft_transfers": 1,
        "traces": 0,
        "contracts": 0,
        "withdrawals": 0,
    }
    transfers = await store.erc20_transfers(5)
    assert [t["log_index"] for t in transfers] == [0, 9]
    assert transfers[0] == {
        "block_number": 5,
        "log_index": 0,
        "transaction_index": 0,
        "transaction_hash": transfer.transaction_hash,
        "block_hash": block_hash(5),
        "token": TOKEN,
        "from_address": address(1),
        "to_address": address(100),
        "value": str(2**200 + 5),
    }
    assert transfers[1]["token"] == TOKEN  # stored lowercase


async def test_reads_are_ordered_and_filtered(store: BlockStore) -> None:
    async with store.writer() as w:
        await w.init_chain(31337, GENESIS)
        # Written out of order: reads still come back by block, then index.
        await w.insert_blocks([make_block(n, txs=3) for n in (4, 2, 3)])
    assert [b["block_number"] for b in await store.blocks(2, 4)] == [2, 3, 4]
    assert await store.blocks(5, 9) == []
    assert await store.block(9) is None
    logs = await store.logs(2, 3)
    assert [(log["block_number"], log["log_index"]) for log in logs] == [
        (n, i) for n in (2, 3) for i in range(6)
    ]
    by_topic = await store.logs(2, 4, topic0=OTHER_TOPIC)
    assert {log["topic0"] for log in by_topic} == {OTHER_TOPIC}
    assert len(by_topic) == 9
    by_address = await store.logs(2, 4, address=TOKEN.upper().replace("X", "x"))
    assert {log["topic0"] for log in by_address} == {TRANSFER_TOPIC}
    assert await store.logs(2, 4, address=TOKEN, topic0=OTHER_TOPIC) == []
    assert len(await store.erc20_transfers(2, 4, token=TOKEN)) == 9
    assert await store.erc20_transfers(2, 4, token=address(5)) == []
    assert [t["transaction_index"] for t in await store.transactions(3)] == [0, 1, 2]


async def test_an_empty_database_has_no_head(store: BlockStore) -> None:
    assert await store.head() is None
    assert await store.chain() is None
    async with store.writer() as w:
        await w.init_chain(31337, GENESIS)
    assert await store.head() is None


async def test_a_range_over_the_row_limit_is_refused(store: BlockStore) -> None:
    await seed(store, range(0, 30), txs=1)  # 60 logs, 30 transfers; the limit is 50
    assert len(await store.blocks(0, 29)) == 30
    assert len(await store.logs(0, 24)) == 50
    with pytest.raises(TooManyRows, match=r"logs\(0, 25\) would return more than 50 rows"):
        await store.logs(0, 25)
    with pytest.raises(TooManyRows, match="narrow the range"):
        await store.blocks(0, 50)  # refused before any query
    assert len(await store.erc20_transfers(0, 29)) == 30


async def test_hashes_are_the_blocks_number_and_hash_alone(store: BlockStore) -> None:
    await seed(store, range(3, 40), txs=1)
    blocks = await store.blocks(0, 45)  # a gap below 3 and above 39
    assert await store.hashes(0, 45) == [
        {"block_number": b["block_number"], "block_hash": b["block_hash"]} for b in blocks
    ]
    assert await store.hashes(7, 7) == [{"block_number": 7, "block_hash": block_hash(7)}]
    with pytest.raises(TooManyRows, match=r"hashes\(0, 50\).*narrow the range"):
        await store.hashes(0, 50)  # the same bound as blocks, refused before any query
    with pytest.raises(ValueError, match="below from_block"):
        await store.hashes(5, 4)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.block("7"), TypeError),
        (lambda s: s.block(True), TypeError),
        (lambda s: s.block(-1), ValueError),
        (lambda s: s.blocks(5, 4), ValueError),
        (lambda s: s.logs(0, 1, address="0x12"), ValueError),
        (lambda s: s.logs(0, 1, topic0=5), TypeError),
        (lambda s: s.erc20_transfers(2**63), ValueError),
    ],
)
async def test_bad_read_arguments_are_refused(store: BlockStore, call: object, error: type) -> None:
    with pytest.raises(error):
        await call(store)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gas_used": 2**63}, "blocks.gas_used of block 1 does not fit 63 bits"),
        ({"timestamp": -1}, "does not fit 63 bits"),
        ({"block_hash": "0x12"}, "blocks.block_hash of block 1 must be 32 bytes"),
        ({"miner": "0xzz" + "00" * 19}, "must be 0x hex"),
        ({"transaction_count": None}, "is NULL"),
    ],
)
async def test_a_bad_row_is_refused_loudly_and_nothing_is_written(
    store: BlockStore, change: dict[str, object], message: str
) -> None:
    good = make_block(0)
    bad = make_block(1)
    bad = BlockRows(block=msgspec.structs.replace(bad.block, **change))

    async def write_both() -> None:
        async with store.writer() as w:
            await w.init_chain(31337, GENESIS)
            await w.insert_blocks([good])
            await w.insert_blocks([bad])

    with pytest.raises(RowError, match=message):
        await write_both()
    assert await store.chain() is None
    assert await store.block(0) is None


async def test_a_value_over_uint256_and_a_bad_success_are_refused(store: BlockStore) -> None:
    block = make_block(1)
    for tx, message in [
        (msgspec.structs.replace(block.transactions[0], value=2**256), "is no uint256"),
        (msgspec.structs.replace(block.transactions[0], value="1e5"), "must be a uint256"),
        (msgspec.structs.replace(block.transactions[0], success=2), "must be 0 or 1"),
    ]:
        with pytest.raises(RowError, match=message):
            async with store.writer() as w:
                await w.insert_blocks([BlockRows(block=block.block, transactions=[tx])])


async def test_reinserting_a_block_replaces_its_rows(store: BlockStore) -> None:
    await seed(store, range(0, 4), txs=3)
    async with store.writer() as w:
        await w.insert_blocks([make_block(2, txs=1, branch=1)])
    assert len(await store.transactions(2)) == 1
    assert len(await store.logs(2)) == 2
    assert (await store.block(2) or {})["block_hash"] == block_hash(2, 1)
    assert len(await store.logs(0, 3)) == 2 * 3 * 3 + 2


async def test_a_second_writer_is_refused_while_the_first_holds(
    store: BlockStore, db_url: str
) -> None:
    other = await open_store(parse_blockdb_url(db_url))
    try:
        async with store.writer() as w:
            await w.init_chain(31337, GENESIS)
            with pytest.raises(WriterBusy, match="another ingest"):
                async with other.writer():
                    pass
            with pytest.raises(WriterBusy):
                async with store.writer():
                    pass
        async with other.writer() as w2:  # free again after the first commits
            assert (await w2.chain()) is not None
    finally:
        await other.close()


async def test_delete_above_and_the_reorg_record(store: BlockStore) -> None:
    await seed(store, range(0, 10))
    async with store.writer() as w:
        assert await w.delete_above(6) == 3
        first = await w.record_reorg(
            detected_at_ms=1_000,
            fork_block_number=6,
            depth=3,
            old_head_hash=block_hash(9),
            new_head_hash=block_hash(8, 1),
        )
        await w.insert_blocks([make_block(n, branch=1) for n in (7, 8)])
        await w.set_chain(head_number=8, head_hash=block_hash(8, 1), finalized_number=6, epoch=1)
        hashes = await w.block_hashes(6, 9)
        assert hashes == {6: block_hash(6), 7: block_hash(7, 1), 8: block_hash(8, 1)}
    async with store.writer() as w:
        second = await w.record_reorg(
            detected_at_ms=2_000,
            fork_block_number=7,
            depth=1,
            old_head_hash=block_hash(8, 1),
            new_head_hash=block_hash(8, 2),
        )
    assert second > first
    assert await store.block(9) is None
    assert await store.logs(9) == []
    assert await store.erc20_transfers(9) == []
    assert await store.transactions(9) == []
    assert await store.head() == {"number": 8, "hash": block_hash(8, 1), "finalized": 6}
    reorgs = await store.reorgs()
    assert [r["id"] for r in reorgs] == [first, second]
    assert reorgs[0] == {
        "id": first,
        "detected_at_ms": 1_000,
        "fork_block_number": 6,
        "depth": 3,
        "old_head_hash": block_hash(9),
        "new_head_hash": block_hash(8, 1),
    }
    assert await store.reorgs(after_id=first) == [reorgs[1]]


async def test_an_exception_inside_a_writer_rolls_everything_back(store: BlockStore) -> None:
    async def die_while_writing() -> None:
        async with store.writer() as w:
            await w.init_chain(31337, GENESIS)
            await w.insert_blocks([make_block(0)])
            raise RuntimeError("ingest died")

    with pytest.raises(RuntimeError):
        await die_while_writing()
    assert await store.chain() is None
    assert await store.block(0) is None


async def test_set_chain_needs_a_chain_row(store: BlockStore) -> None:
    with pytest.raises(Exception, match="init_chain"):
        async with store.writer() as w:
            await w.set_chain(head_number=1, head_hash=block_hash(1), finalized_number=0, epoch=0)
