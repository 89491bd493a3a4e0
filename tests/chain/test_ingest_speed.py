"""What ingest's speed-ups keep, against a real anvil: receipts checked once still
refuse receipts that are not the block's transactions', and the SQLite writer that
checks, deletes and loads in one call on the loop's thread writes the same rows as
the statement-by-statement path, replacing as it did."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.ingest.fetch import BatchFetcher
from blockx_chain.ingest.rows import block_rows
from blockx_chain.rpc import EthRpc, JsonRpcClient, RpcError, RpcErrorKind
from blockx_chain.schema import BLOCK_TABLES, BlockRows
from blockx_chain.store import BlockWriter, open_store
from blockx_chain.url import parse_blockdb_url


@pytest_asyncio.fixture
async def eth(anvil: Anvil) -> AsyncIterator[EthRpc]:
    """The module's anvil (conftest), its chain mined by the first test to ask."""
    async with JsonRpcClient(anvil.url) as client:
        if await client.request("eth_blockNumber") == "0x0":
            net = Devnet(client)
            await net.setup(tokens=2)
            await net.mine(6, token_transfers=3, eth_transfers=2)
        yield EthRpc(client)


async def answers(eth: EthRpc, number: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Block ``number`` in full and its receipts, each checked as ingest checks them."""
    [block], [receipts] = await eth.get_blocks([number]), await eth.get_block_receipts([number])
    assert len(receipts) >= 2
    return block, receipts


async def test_receipts_of_other_transactions_are_refused(eth: EthRpc) -> None:
    head = await eth.block_number()
    block, receipts = await answers(eth, head)
    assert block_rows(block, receipts).transactions  # the node's own answer: accepted
    swapped = [dict(r) for r in receipts]
    first, second = swapped[0]["transactionHash"], swapped[1]["transactionHash"]
    swapped[0]["transactionHash"], swapped[1]["transactionHash"] = second, first
    with pytest.raises(RpcError, match=r"\[0\]: transactionHash") as refused:
        block_rows(block, swapped)
    assert refused.value.kind is RpcErrorKind.BAD_ANSWER
    with pytest.raises(RpcError, match="receipts for a block of"):
        block_rows(block, receipts[:-1])
    # A hash in capitals is the same hash: the full check accepts it.
    shouted = [dict(r) for r in receipts]
    shouted[0]["transactionHash"] = "0x" + shouted[0]["transactionHash"][2:].upper()
    assert block_rows(block, shouted) == block_rows(block, receipts)


def table_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as conn:
        return {
            t.name: conn.execute(f"SELECT * FROM {t.name} ORDER BY 1, 2, 3").fetchall()
            for t in BLOCK_TABLES
        }


async def write(path: Path, batches: list[list[BlockRows]], *, one_turn: bool) -> None:
    """Each batch in a transaction of its own, by the SQLite writer's one-turn path or
    by the statement-by-statement path every engine has."""
    store = await open_store(parse_blockdb_url(f"sqlite:///{path}"))
    try:
        for batch in batches:
            async with store.writer() as writer:
                if not one_turn:
                    # The generic path: BlockWriter's own, as PostgreSQL's writer runs it.
                    writer._replace_blocks = BlockWriter._replace_blocks.__get__(writer)  # type: ignore[method-assign]
                await writer.insert_blocks(batch, seen_at_ms=1_700_000_000_000)
    finally:
        await store.close()


async def test_one_turn_writes_the_rows_of_the_statement_path(eth: EthRpc, tmp_path: Path) -> None:
    head = await eth.block_number()
    rows = await BatchFetcher(eth).blocks(range(head + 1))
    # The chain in two batches, then its top half again (a re-run replaces).
    middle = len(rows) // 2
    batches = [rows[:middle], rows[middle:], rows[middle:]]
    await write(tmp_path / "one.db", batches, one_turn=True)
    await write(tmp_path / "each.db", batches, one_turn=False)
    one, each = table_rows(tmp_path / "one.db"), table_rows(tmp_path / "each.db")
    assert one == each
    assert len(one["blocks"]) == head + 1
    assert sum(len(r.transactions) for r in rows) == len(one["transactions"]) > 0
    assert sum(len(r.logs) for r in rows) == len(one["logs"]) > 0
    assert one["erc20_transfers"]


async def test_reads_go_on_beside_a_write_on_the_loops_thread(eth: EthRpc, tmp_path: Path) -> None:
    """Writes run on the event loop's thread, reads on the store's threads: a read
    made while a writer holds its transaction sees the last commit (WAL), neither
    waits for the other, and the commit is seen by the next read."""
    head = await eth.block_number()
    rows = await BatchFetcher(eth).blocks(range(head + 1))
    store = await open_store(parse_blockdb_url(f"sqlite:///{tmp_path / 'db.db'}"))
    try:
        async with store.writer() as writer:
            await writer.insert_blocks(rows[:2], seen_at_ms=1)
        async with store.writer() as writer:
            await writer.insert_blocks(rows[2:], seen_at_ms=1)
            during = await store.blocks(0, head)
        after = await store.blocks(0, head)
    finally:
        await store.close()
    assert [b["block_number"] for b in during] == [0, 1]
    assert [b["block_hash"] for b in after] == [r.block.block_hash for r in rows]
