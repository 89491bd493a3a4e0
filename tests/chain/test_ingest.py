"""Ingest against a real anvil into SQLite and PostgreSQL: every column checked
against the node's own answers, idempotent re-runs, resume after kill -9, reorgs
(depth 1 and 5, deeper than the limit, below the finalized block), gaps refused,
one ingest at a time, follow mode; and a scripted node that answers another block
than the one asked for."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio
from nft_logs import nft_rows
from rpc_scripted import ScriptedChain, ScriptedRpcServer, error, shifted_blocks
from support import wait_until

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.ingest import (
    BadNodeAnswer,
    DeepReorgRefused,
    GapRefused,
    IngestOptions,
    IngestSummary,
    ReorgTooDeep,
    ingest,
)
from blockx_chain.rpc import JsonRpcClient, quantity
from blockx_chain.schema import TRANSFER_TOPIC
from blockx_chain.store import BlockStore, WriterBusy, open_store
from blockx_chain.url import PostgresUrl, SqliteUrl, parse_blockdb_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def node() -> Iterator[Anvil]:
    """An anvil of this test's own: reorgs and kills must not meet other tests' blocks."""
    with Anvil() as anvil:
        yield anvil


@pytest_asyncio.fixture
async def client(node: Anvil) -> AsyncIterator[JsonRpcClient]:
    async with JsonRpcClient(node.url) as rpc:
        yield rpc


@pytest_asyncio.fixture
async def store(db_url: str) -> AsyncIterator[BlockStore]:
    opened = await open_store(parse_blockdb_url(db_url))
    yield opened
    await opened.close()


async def run(node: Anvil, db_url: str, **options: Any) -> IngestSummary:
    return await ingest(node.url, parse_blockdb_url(db_url), IngestOptions(**options))


async def devnet(client: JsonRpcClient, blocks: int, *, reorgable: bool = False) -> Devnet:
    net = Devnet(client)
    await net.setup(tokens=3, reorgable=reorgable)
    await net.mine(blocks, token_transfers=4, eth_transfers=2, reorgable=reorgable)
    return net


# -- what the node says the rows are ---------------------------------------------


def q(value: str) -> int:
    return int(value, 16)


def lower(value: str | None) -> str | None:
    return None if value is None else value.lower()


def opt_uint256(value: str | None) -> str | None:
    return None if value is None else str(q(value))


def opt_json(value: list[Any] | None) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


async def node_rows(client: JsonRpcClient, head: int) -> dict[str, list[dict[str, Any]]]:
    """Every table's rows as the node's answers give them, in the block database's order."""
    numbers = list(range(head + 1))
    blocks = await client.batch([("eth_getBlockByNumber", [quantity(n), True]) for n in numbers])
    receipts = await client.batch([("eth_getBlockReceipts", [quantity(n)]) for n in numbers])
    rows: dict[str, list[dict[str, Any]]] = {
        "blocks": [],
        "transactions": [],
        "logs": [],
        "erc20_transfers": [],
        "nft_transfers": [],
        "withdrawals": [],
    }
    for block, block_receipts in zip(blocks, receipts, strict=True):
        number = q(block["number"])
        by_hash = {r["transactionHash"]: r for r in block_receipts}
        rows["blocks"].append(
            {
                "block_number": number,
                "block_hash": block["hash"],
                "parent_hash": block["parentHash"],
                "timestamp": q(block["timestamp"]),
                "miner": block["miner"].lower(),
                "gas_used": q(block["gasUsed"]),
                "gas_limit": q(block["gasLimit"]),
                "base_fee_per_gas": q(block["baseFeePerGas"]),
                "transaction_count": len(block["transactions"]),
                "nonce": block["nonce"],
                "mix_hash": block["mixHash"],
                "sha3_uncles": block["sha3Uncles"],
                "logs_bloom": block["logsBloom"],
                "transactions_root": block["transactionsRoot"],
                "state_root": block["stateRoot"],
                "receipts_root": block["receiptsRoot"],
                "difficulty": str(q(block["difficulty"])),
                "total_difficulty": str(q(block["totalDifficulty"])),
                "size": q(block["size"]),
                "extra_data": block["extraData"],
                "withdrawals_root": block["withdrawalsRoot"],
                "blob_gas_used": q(block["blobGasUsed"]),
                "excess_blob_gas": q(block["excessBlobGas"]),
                "parent_beacon_block_root": block["parentBeaconBlockRoot"],
                # anvil serves requestsHash only under --hardfork prague.
                "requests_hash": block.get("requestsHash"),
                "uncle_count": len(block["uncles"]),
            }
        )
        for position, withdrawal in enumerate(block["withdrawals"]):
            rows["withdrawals"].append(
                {
                    "block_number": number,
                    "block_hash": block["hash"],
                    "position": position,
                    "withdrawal_index": q(withdrawal["index"]),
                    "validator_index": q(withdrawal["validatorIndex"]),
                    "address": withdrawal["address"].lower(),
                    "amount": q(withdrawal["amount"]),
                }
            )
        for tx in block["transactions"]:
            receipt = by_hash[tx["hash"]]
            rows["transactions"].append(
                {
                    "block_number": number,
                    "transaction_index": q(tx["transactionIndex"]),
                    "transaction_hash": tx["hash"],
                    "block_hash": block["hash"],
                    "from_address": tx["from"].lower(),
                    "to_address": lower(tx.get("to")),
                    "value": str(q(tx["value"])),
                    "input": tx["input"],
                    "nonce": q(tx["nonce"]),
                    "gas_limit": q(tx["gas"]),
                    "gas_used": q(receipt["gasUsed"]),
                    "effective_gas_price": q(receipt["effectiveGasPrice"]),
                    "transaction_type": q(tx["type"]),
                    "success": q(receipt["status"]),
                    "contract_address": lower(receipt.get("contractAddress")),
                    "gas_price": str(q(tx["gasPrice"])),
                    "max_fee_per_gas": opt_uint256(tx.get("maxFeePerGas")),
                    "max_priority_fee_per_gas": opt_uint256(tx.get("maxPriorityFeePerGas")),
                    "max_fee_per_blob_gas": opt_uint256(tx.get("maxFeePerBlobGas")),
                    "blob_versioned_hashes": opt_json(tx.get("blobVersionedHashes")),
                    "chain_id": q(tx["chainId"]),
                    "access_list": opt_json(tx.get("accessList")),
                    "authorization_list": opt_json(tx.get("authorizationList")),
                    "v": q(tx["v"]),
                    "r": f"0x{q(tx['r']):064x}",
                    "s": f"0x{q(tx['s']):064x}",
                    "y_parity": q(tx["yParity"]) if "yParity" in tx else None,
                    "cumulative_gas_used": q(receipt["cumulativeGasUsed"]),
                    "receipt_root": receipt.get("root"),
                    "blob_gas_used": q(receipt["blobGasUsed"])
                    if "blobGasUsed" in receipt
                    else None,
                    "blob_gas_price": opt_uint256(receipt.get("blobGasPrice")),
                    # Every field of anvil's transactions and receipts has a column.
                    "extra": None,
                }
            )
            for log in receipt["logs"]:
                topics = [*log["topics"], None, None, None, None]
                rows["logs"].append(
                    {
                        "block_number": number,
                        "log_index": q(log["logIndex"]),
                        "transaction_index": q(tx["transactionIndex"]),
                        "transaction_hash": tx["hash"],
                        "block_hash": block["hash"],
                        "address": log["address"].lower(),
                        "topic0": topics[0],
                        "topic1": topics[1],
                        "topic2": topics[2],
                        "topic3": topics[3],
                        "data": log["data"],
                    }
                )
                rows["nft_transfers"] += nft_rows(number, block["hash"], tx, log)
                if topics[0] == TRANSFER_TOPIC and len(log["topics"]) == 3:
                    rows["erc20_transfers"].append(
                        {
                            "block_number": number,
                            "log_index": q(log["logIndex"]),
                            "transaction_index": q(tx["transactionIndex"]),
                            "transaction_hash": tx["hash"],
                            "block_hash": block["hash"],
                            "token": log["address"].lower(),
                            "from_address": "0x" + topics[1][-40:],
                            "to_address": "0x" + topics[2][-40:],
                            "value": str(int(log["data"], 16)),
                        }
                    )
    rows["logs"].sort(key=lambda r: (r["block_number"], r["log_index"]))
    rows["nft_transfers"].sort(
        key=lambda r: (r["block_number"], r["log_index"], r["batch_position"])
    )
    return rows


async def stored_rows(store: BlockStore, head: int) -> dict[str, list[dict[str, Any]]]:
    transactions = []
    for number in range(head + 1):
        transactions += await store.transactions(number)
    return {
        "blocks": await store.blocks(0, head),
        "transactions": transactions,
        "logs": await store.logs(0, head),
        "erc20_transfers": await store.erc20_transfers(0, head),
        "nft_transfers": await store.rows("nft_transfers", 0, head),
        "withdrawals": await store.rows("withdrawals", 0, head),
    }


async def assert_matches_node(store: BlockStore, client: JsonRpcClient) -> int:
    """Every stored row equals the node's; the stored head is the node's. The head."""
    head = q(await client.request("eth_blockNumber"))
    stored_head = await store.head()
    assert stored_head is not None
    assert stored_head["number"] == head
    expected = await node_rows(client, head)
    actual = await stored_rows(store, head)
    for table in expected:
        assert actual[table] == expected[table], table
    assert stored_head["hash"] == expected["blocks"][-1]["block_hash"]
    return head


# -- tests ------------------------------------------------------------------------


async def test_every_column_is_the_nodes(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    await devnet(client, 40)
    summary = await run(node, db_url, batch_size=7)
    head = await assert_matches_node(store, client)
    expected = await node_rows(client, head)
    assert summary.as_json() == {
        "from": 0,
        "to": head,
        "blocks": head + 1,
        "transactions": len(expected["transactions"]),
        "logs": len(expected["logs"]),
        "erc20_transfers": len(expected["erc20_transfers"]),
        "nft_transfers": len(expected["nft_transfers"]),
        "traces": 0,
        "contracts": sum(1 for t in expected["transactions"] if t["contract_address"]),
        "trace_method": None,
        "reorgs": 0,
        "seconds": summary.as_json()["seconds"],
    }
    # Without traces, contracts holds those the transactions themselves made.
    deployed = [t for t in expected["transactions"] if t["contract_address"]]
    assert [
        (c["transaction_hash"], c["address"], c["creator"], c["kind"], c["trace_address"])
        for c in await store.rows("contracts", 0, head)
    ] == [
        (t["transaction_hash"], t["contract_address"], t["from_address"], "create", "[]")
        for t in deployed
    ]
    # The devnet's chain has what the columns must carry: token deployments, token
    # transfers and plain ETH transfers, NFT transfers of both standards (a batch
    # among them), and transactions of types 0, 1 and 2.
    assert any(t["contract_address"] for t in expected["transactions"])
    assert any(t["input"] == "0x" for t in expected["transactions"])
    assert len(expected["erc20_transfers"]) >= 40 * 4
    assert {(t["standard"], t["batch_position"]) for t in expected["nft_transfers"]} == {
        ("erc721", 0),
        ("erc1155", 0),
        ("erc1155", 1),
    }
    assert {t["transaction_type"] for t in expected["transactions"]} == {0, 1, 2}
    chain = await store.chain()
    assert chain is not None
    finalized = q((await client.request("eth_getBlockByNumber", ["finalized", False]))["number"])
    expected_finalized = min(head - 12, finalized)
    assert chain.finalized_number == (expected_finalized if expected_finalized >= 0 else None)
    assert chain.epoch == 0


async def test_a_run_resumes_from_the_head(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    net = await devnet(client, 20)
    first = await run(node, db_url)
    await net.mine(10)
    between = time.time_ns() // 1_000_000
    second = await run(node, db_url)
    after = time.time_ns() // 1_000_000
    assert (second.from_block, second.to_block, second.blocks) == (
        first.to_block + 1,
        first.to_block + 10,
        10,
    )
    # Each block records when the run that stored it did.
    seen = await store.seen_at(0, second.to_block)
    assert all(0 < (seen[n] or 0) <= between for n in range(first.to_block + 1))
    assert all(
        between <= (seen[n] or 0) <= after for n in range(second.from_block, second.to_block + 1)
    )
    nothing = await run(node, db_url)
    assert nothing.blocks == 0
    await assert_matches_node(store, client)


async def test_re_running_a_range_leaves_the_same_rows(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    await devnet(client, 30)
    await run(node, db_url)
    head = q(await client.request("eth_blockNumber"))
    before = await stored_rows(store, head)
    chain_before = await store.chain()
    again = await run(node, db_url, from_block=5, to_block=20, batch_size=4)
    assert (again.from_block, again.to_block, again.blocks, again.reorgs) == (5, 20, 16, 0)
    assert await stored_rows(store, head) == before
    assert await store.chain() == chain_before
    assert await store.reorgs() == []


async def test_a_from_above_the_head_is_refused(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    await devnet(client, 20)
    await run(node, db_url, to_block=10)
    with pytest.raises(GapRefused, match="would leave a gap"):
        await run(node, db_url, from_block=12)
    head = await store.head()
    assert head is not None
    assert head["number"] == 10
    assert await store.block(11) is None


@pytest.mark.parametrize(("depth", "new_blocks"), [(1, 1), (5, 7)])
async def test_a_reorg_replaces_the_old_branch(
    node: Anvil,
    client: JsonRpcClient,
    db_url: str,
    store: BlockStore,
    depth: int,
    new_blocks: int,
) -> None:
    net = await devnet(client, 30, reorgable=True)
    await run(node, db_url)
    old_head = await store.head()
    assert old_head is not None
    reorg = await net.reorg(depth, new_blocks=new_blocks)
    summary = await run(node, db_url)
    assert summary.reorgs == 1
    assert summary.from_block == reorg.fork_block_number + 1
    head = await assert_matches_node(store, client)
    # Not one row of the abandoned blocks is left in any table.
    old = set(reorg.old_hashes.values())
    rows = await stored_rows(store, head)
    for table, table_rows in rows.items():
        assert not [r for r in table_rows if r["block_hash"] in old], table
    [recorded] = await store.reorgs()
    assert recorded["fork_block_number"] == reorg.fork_block_number
    assert recorded["depth"] == depth
    assert recorded["old_head_hash"] == old_head["hash"]
    new_hashes = {b.hash for b in reorg.new_blocks}
    assert recorded["new_head_hash"] in new_hashes
    chain = await store.chain()
    assert chain is not None
    assert chain.epoch == 0


async def test_a_reorg_deeper_than_the_limit_is_an_error(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    net = await devnet(client, 20, reorgable=True)
    await run(node, db_url)
    before = await stored_rows(store, 22)
    chain_before = await store.chain()
    await net.reorg(6, new_blocks=7)
    with pytest.raises(ReorgTooDeep, match="--max-reorg-depth 4"):
        await run(node, db_url, max_reorg_depth=4)
    assert await stored_rows(store, 22) == before
    assert await store.chain() == chain_before
    assert await store.reorgs() == []


async def test_a_reorg_below_the_finalized_block_needs_allow_deep_reorg(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    # anvil reports head - 64 as finalized, so a fork below it abandons 65+ blocks.
    net = await devnet(client, 70, reorgable=True)
    await run(node, db_url, confirmations=2)
    chain = await store.chain()
    assert chain is not None
    assert chain.finalized_number is not None
    # Fork two blocks below the finalized one.
    depth = (chain.head_number or 0) - (chain.finalized_number - 2)
    await net.reorg(depth, new_blocks=depth + 1)
    with pytest.raises(DeepReorgRefused, match="--allow-deep-reorg"):
        await run(node, db_url, confirmations=2, max_reorg_depth=100)
    assert await store.chain() == chain
    summary = await run(node, db_url, confirmations=2, max_reorg_depth=100, allow_deep_reorg=True)
    assert summary.reorgs == 1
    after = await store.chain()
    assert after is not None
    assert after.epoch == 1
    await assert_matches_node(store, client)


async def test_follow_tails_the_head_until_stopped(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    net = await devnet(client, 5, reorgable=True)
    stop = asyncio.Event()
    following = asyncio.create_task(
        ingest(
            node.url,
            parse_blockdb_url(db_url),
            IngestOptions(follow=True, poll_interval_s=0.05),
            stop=stop,
        )
    )

    async def at(number: int) -> bool:
        head = await store.head()
        return head is not None and head["number"] == number

    await wait_until(lambda: at(7), "the first blocks")
    await net.mine(4, reorgable=True)
    await wait_until(lambda: at(11), "the mined blocks")
    await net.reorg(2, new_blocks=3)
    await wait_until(lambda: at(12), "the new branch")
    stop.set()
    summary = await asyncio.wait_for(following, 10)
    assert (summary.from_block, summary.to_block, summary.reorgs) == (0, 12, 1)
    await assert_matches_node(store, client)


async def test_a_second_ingest_is_refused(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    await devnet(client, 5)
    stop = asyncio.Event()
    first = asyncio.create_task(
        ingest(
            node.url,
            parse_blockdb_url(db_url),
            IngestOptions(follow=True, poll_interval_s=0.05),
            stop=stop,
        )
    )
    await wait_until(lambda: _has_head(store), "the first ingest")
    with pytest.raises(WriterBusy, match="another ingest"):
        await run(node, db_url)
    stop.set()
    await asyncio.wait_for(first, 10)
    # Once the first is done, the next one may write.
    assert (await run(node, db_url)).blocks == 0


async def _has_head(store: BlockStore) -> bool:
    return await store.head() is not None


async def test_an_ingest_killed_with_sigkill_resumes(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    net = Devnet(client)
    await net.setup(tokens=2)
    await net.mine(300, token_transfers=2, eth_transfers=1)
    proc = await asyncio.create_subprocess_exec(
        _blockx(),
        *("chain", "ingest", "--rpc", node.url, "--db", db_url, "--batch-size", "1"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        await wait_until(lambda: _stored_head_at_least(db_url, 20), "some blocks", timeout=30)
        os.kill(proc.pid, signal.SIGKILL)
        assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    interrupted = await _stored_head_async(db_url)
    assert interrupted < 302  # killed mid-run
    summary = await run(node, db_url)
    assert summary.from_block == interrupted + 1
    await assert_matches_node(store, client)


async def _stored_head_async(db_url: str) -> int:
    url = parse_blockdb_url(db_url)
    match url:
        case SqliteUrl(path):
            if not path.exists():
                return -1
            with sqlite3.connect(path) as lite:
                try:
                    row = lite.execute("SELECT head_number FROM chain").fetchone()
                except sqlite3.OperationalError:
                    return -1
            return -1 if row is None or row[0] is None else int(row[0])
        case PostgresUrl(dsn=dsn):
            conn = await asyncpg.connect(dsn)
            try:
                value = await conn.fetchval("SELECT head_number FROM chain")
            except asyncpg.UndefinedTableError:
                return -1
            finally:
                await conn.close()
            return -1 if value is None else int(value)


async def _stored_head_at_least(db_url: str, number: int) -> bool:
    return await _stored_head_async(db_url) >= number


def _blockx() -> str:
    binary = shutil.which("blockx")
    assert binary is not None
    return binary


class Proxy:
    """A node in front of anvil that lacks eth_getBlockReceipts, that answers its
    next ``busy`` requests for blocks in full with HTTP 503 (a node under load), and
    whose next ``ahead`` eth_blockNumber answers are 3 above anvil's head (blocks it
    then does not have, as a node shows just before it reorgs to a shorter branch)."""

    def __init__(self, upstream: str, busy: int = 0) -> None:
        self.upstream = upstream
        self.busy = busy
        self.ahead = 0
        self.methods: list[str] = []
        self.http = httpx.AsyncClient()

    async def __call__(self, request: Any) -> tuple[int, bytes]:
        requests = request if isinstance(request, list) else [request]
        if self.busy > 0 and any(_full_block(r) for r in requests):
            self.busy -= 1
            return 503, b"busy"
        self.methods += [r["method"] for r in requests]
        missing = [r for r in requests if r["method"] == "eth_getBlockReceipts"]
        forwarded = [r for r in requests if r["method"] != "eth_getBlockReceipts"]
        answers = [error(r, -32601, "Method not found") for r in missing]
        if forwarded:
            upstream = await self.http.post(self.upstream, json=forwarded)
            answers += upstream.json()
        for r, a in zip(forwarded, answers[len(missing) :], strict=True):
            if r["method"] == "eth_blockNumber" and self.ahead > 0:
                self.ahead -= 1
                a["result"] = quantity(int(a["result"], 16) + 3)
        body = answers if isinstance(request, list) else answers[0]
        return 200, json.dumps(body).encode()


def _full_block(request: dict[str, Any]) -> bool:
    return request["method"] == "eth_getBlockByNumber" and request["params"][1] is True


async def test_a_node_without_block_receipts_gets_one_request_per_transaction(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    await devnet(client, 10)
    proxy = Proxy(node.url)
    async with ScriptedRpcServer(proxy) as server:
        summary = await ingest(server.url, parse_blockdb_url(db_url), IngestOptions())
    await proxy.http.aclose()
    assert summary.blocks == 13
    assert "eth_getTransactionReceipt" in proxy.methods
    await assert_matches_node(store, client)


async def test_a_node_without_the_blocks_below_its_head_is_asked_its_head_again(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    await devnet(client, 10)
    proxy = Proxy(node.url)
    proxy.ahead = 1  # the first head read is 16; the node has blocks up to 13
    async with ScriptedRpcServer(proxy) as server:
        summary = await ingest(server.url, parse_blockdb_url(db_url), IngestOptions())
    await proxy.http.aclose()
    assert proxy.ahead == 0
    assert summary.blocks == 13
    assert proxy.methods.count("eth_blockNumber") >= 2  # asked again after the miss
    await assert_matches_node(store, client)


async def test_a_busy_node_is_retried(
    node: Anvil, client: JsonRpcClient, db_url: str, store: BlockStore
) -> None:
    net = await devnet(client, 10)
    proxy = Proxy(node.url)
    async with ScriptedRpcServer(proxy) as server:
        await ingest(server.url, parse_blockdb_url(db_url), IngestOptions())
        await net.mine(5)
        proxy.busy = 3  # the next batches meet HTTP 503 three times
        summary = await ingest(server.url, parse_blockdb_url(db_url), IngestOptions())
    await proxy.http.aclose()
    assert proxy.busy == 0  # every 503 was met, and retried
    assert summary.blocks == 5
    await assert_matches_node(store, client)


async def test_a_node_answering_another_block_is_refused_and_nothing_is_written(
    db_url: str, store: BlockStore
) -> None:
    chain = ScriptedChain(head=200)
    chain.lie = shifted_blocks(chain, 11, 20)
    async with ScriptedRpcServer(chain) as node:
        with pytest.raises(BadNodeAnswer) as refused:
            await ingest(
                node.url,
                parse_blockdb_url(db_url),
                IngestOptions(from_block=11, to_block=20, batch_size=10),
            )
    assert str(refused.value) == (
        "blocks 11..20: eth_getBlockByNumber(0xb, true): the node answered block 111, not block 11"
    )
    assert await store.chain() is None
    assert await store.blocks(0, 200) == []
