"""A block database of the schema before every node column existed: opened, migrated,
read, then filled by a re-ingest; and the migration's refusal of a table already
named like one it creates. Both engines, against anvil's own answers.

The database is made with the migrations before the one that added the columns
(``MIGRATIONS[:EVERY_COLUMN_SINCE - 1]``) and holds the rows that schema could
hold; later migrations leave this test as it is.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any, Final

import asyncpg
import pytest
import pytest_asyncio

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.ingest.rows import block_rows
from blockx_chain.rpc import JsonRpcClient, quantity
from blockx_chain.schema import (
    BLOCK_TABLES,
    EVERY_COLUMN_SINCE,
    MIGRATIONS,
    SCHEMA_VERSION,
    ColumnType,
    Engine,
    block_row_sets,
)
from blockx_chain.store import SchemaRefused, StoreUnavailable, open_store
from blockx_chain.url import parse_blockdb_url

PREVIOUS: Final = EVERY_COLUMN_SINCE - 1
GENESIS_PLACEHOLDER: Final = "genesis"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chain(anvil: Anvil) -> AsyncIterator[dict[str, Any]]:
    """anvil's blocks and receipts, after a few blocks of token and ETH transfers."""
    async with JsonRpcClient(anvil.url) as client:
        net = Devnet(client)
        await net.setup(tokens=1)
        await net.mine(3, token_transfers=2, eth_transfers=1)
        head = int(await client.request("eth_blockNumber"), 16)
        numbers = [quantity(n) for n in range(head + 1)]
        blocks = await client.batch([("eth_getBlockByNumber", [n, True]) for n in numbers])
        receipts = await client.batch([("eth_getBlockReceipts", [n]) for n in numbers])
        yield {"head": head, "blocks": blocks, "receipts": receipts}


def _engine(db_url: str) -> Engine:
    return Engine.SQLITE if db_url.startswith("sqlite") else Engine.POSTGRES


async def _sql(db_url: str, statements: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
    """Run statements in order on the database; the rows of the last."""
    if _engine(db_url) is Engine.SQLITE:
        conn = sqlite3.connect(str(parse_blockdb_url(db_url).path))  # type: ignore[union-attr]
        try:
            rows: list[Any] = []
            for sql, params in statements:
                rows = conn.execute(sql, params).fetchall()
            conn.commit()
            return rows
        finally:
            conn.close()
    pg = await asyncpg.connect(db_url)
    try:
        result: list[Any] = []
        for sql, params in statements:
            counter = iter(range(1, 1000))
            numbered = "".join(f"${next(counter)}" if c == "?" else c for c in sql)
            result = [tuple(r) for r in await pg.fetch(numbered, *params)]
        return result
    finally:
        await pg.close()


async def _columns(db_url: str, table: str) -> list[str]:
    if _engine(db_url) is Engine.SQLITE:
        return [r[1] for r in await _sql(db_url, [(f"PRAGMA table_info({table})", ())])]
    rows = await _sql(
        db_url,
        [
            (
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = ? ORDER BY ordinal_position",
                (table,),
            )
        ],
    )
    return [r[0] for r in rows]


async def made_by_previous_schema(db_url: str, chain: dict[str, Any]) -> None:
    """The database the previous schema made, holding anvil's chain in the columns
    that schema had."""
    engine = _engine(db_url)
    statements: list[tuple[str, tuple[Any, ...]]] = []
    if engine is Engine.POSTGRES:
        statements.append(("CREATE TABLE blockx_schema (version INTEGER NOT NULL)", ()))
        statements.append(("INSERT INTO blockx_schema (version) VALUES (?)", (PREVIOUS,)))
    statements += [(s, ()) for m in MIGRATIONS[:PREVIOUS] for s in m(engine)]
    if engine is Engine.SQLITE:
        statements.append((f"PRAGMA user_version = {PREVIOUS}", ()))
    await _sql(db_url, statements)
    bundles = [block_rows(b, r) for b, r in zip(chain["blocks"], chain["receipts"], strict=True)]
    rows = block_row_sets(bundles)
    inserts: list[tuple[str, tuple[Any, ...]]] = []
    for table in BLOCK_TABLES:
        had = await _columns(db_url, table.name)
        names = [c for c in table.columns if c.name in had]
        if not names:
            continue  # a table the previous schema lacked
        marks = ", ".join("?" * len(names))
        sql = f"INSERT INTO {table.name} ({', '.join(c.name for c in names)}) VALUES ({marks})"
        for row in rows[table.name]:
            values = dict(zip(table.names, row, strict=True))
            inserts.append(
                (
                    sql,
                    tuple(
                        Decimal(values[c.name])
                        if c.type is ColumnType.UINT256 and engine is Engine.POSTGRES
                        else values[c.name]
                        for c in names
                    ),
                )
            )
    head = chain["blocks"][-1]
    inserts.append(
        (
            "INSERT INTO chain (chain_id, genesis_hash, head_number, head_hash, "
            "finalized_number, epoch) VALUES (?, ?, ?, ?, ?, 0)",
            (31337, chain["blocks"][0]["hash"], chain["head"], head["hash"], chain["head"]),
        )
    )
    await _sql(db_url, inserts)


async def _version(db_url: str) -> int:
    if _engine(db_url) is Engine.SQLITE:
        return int((await _sql(db_url, [("PRAGMA user_version", ())]))[0][0])
    return int((await _sql(db_url, [("SELECT version FROM blockx_schema", ())]))[0][0])


async def test_a_previous_schema_database_is_migrated_read_and_filled_by_a_re_ingest(
    anvil: Anvil, chain: dict[str, Any], db_url: str
) -> None:
    await made_by_previous_schema(db_url, chain)
    head = chain["head"]
    url = parse_blockdb_url(db_url)
    sqlite = _engine(db_url) is Engine.SQLITE
    reader = await open_store(url, read_only=True) if sqlite else None
    try:
        if reader is not None:
            # Before ingest migrates the file, a reader reads it: new columns are NULL
            # and the new table is not there yet.
            before = await reader.blocks(0, head)
            assert [b["block_hash"] for b in before] == [b["hash"] for b in chain["blocks"]]
            assert {b["state_root"] for b in before} == {None}
            with pytest.raises(StoreUnavailable, match="no table withdrawals yet"):
                await reader.rows("withdrawals", 0, head)
            assert await _version(db_url) == PREVIOUS
        writer = await open_store(url)
        try:
            assert await _version(db_url) == SCHEMA_VERSION
            migrated = await writer.blocks(0, head)
            # Old rows: their columns as they were, NULL in every new one.
            assert [b["gas_used"] for b in migrated] == [
                int(b["gasUsed"], 16) for b in chain["blocks"]
            ]
            assert {b["mix_hash"] for b in migrated} == {None}
            txs = [t for n in range(head + 1) for t in await writer.transactions(n)]
            assert txs
            assert {t["gas_price"] for t in txs} == {None}
            assert {t["cumulative_gas_used"] for t in txs} == {None}
            assert await writer.rows("withdrawals", 0, head) == []
            if reader is not None:
                # The reader that opened the older file follows the migration.
                assert await reader.rows("withdrawals", 0, head) == []
        finally:
            await writer.close()
        await ingest(anvil.url, url, IngestOptions(from_block=0, to_block=head))
        filled = await open_store(url, read_only=True)
        try:
            blocks = await filled.blocks(0, head)
            assert [b["state_root"] for b in blocks] == [b["stateRoot"] for b in chain["blocks"]]
            assert [b["size"] for b in blocks] == [int(b["size"], 16) for b in chain["blocks"]]
            txs = [t for n in range(head + 1) for t in await filled.transactions(n)]
            node_txs = [t for b in chain["blocks"] for t in b["transactions"]]
            assert [t["gas_price"] for t in txs] == [str(int(t["gasPrice"], 16)) for t in node_txs]
            cumulative = [int(r["cumulativeGasUsed"], 16) for rs in chain["receipts"] for r in rs]
            assert [t["cumulative_gas_used"] for t in txs] == cumulative
        finally:
            await filled.close()
        if reader is not None:
            assert [b["state_root"] for b in await reader.blocks(0, head)] == [
                b["stateRoot"] for b in chain["blocks"]
            ]
    finally:
        if reader is not None:
            await reader.close()


async def test_a_table_named_like_a_new_one_is_refused_in_one_line(
    chain: dict[str, Any], db_url: str
) -> None:
    await made_by_previous_schema(db_url, chain)
    await _sql(db_url, [("CREATE TABLE withdrawals (note TEXT)", ())])
    with pytest.raises(SchemaRefused) as refused:
        await open_store(parse_blockdb_url(db_url))
    message = str(refused.value)
    assert "\n" not in message
    assert "already holds a table named 'withdrawals'" in message
    assert f"schema version {EVERY_COLUMN_SINCE} creates" in message
    # Nothing was changed: the version and the user's table are as they were.
    assert await _version(db_url) == PREVIOUS
    assert await _columns(db_url, "withdrawals") == ["note"]
    assert "state_root" not in await _columns(db_url, "blocks")
