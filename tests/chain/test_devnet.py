"""The devnet against a real anvil: timestamps as asked, token transfers in the logs,
reorgs that change every hash above the fork point, finding anvil, and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support import wait_until

from blockx_chain.contracts import (
    BALANCE_OF_SELECTOR,
    SIGNATURES,
    TRANSFER_TOPIC,
    balance_of_data,
    token_artifact,
)
from blockx_chain.devnet import DENSE, Anvil, AnvilNotFound, AnvilOptions, Devnet, find_anvil
from blockx_chain.devnet import anvil as anvil_module
from blockx_chain.devnet.generator import TOKEN_SUPPLY
from blockx_chain.rpc import JsonRpcClient, quantity


@pytest_asyncio.fixture
async def client(anvil: Anvil) -> AsyncIterator[JsonRpcClient]:
    async with JsonRpcClient(anvil.url) as rpc:
        yield rpc


async def _block(client: JsonRpcClient, number: int) -> dict[str, str]:
    block = await client.request("eth_getBlockByNumber", [quantity(number), False])
    assert isinstance(block, dict)
    return block


def test_anvil_runs_with_cancun_and_a_bounded_history() -> None:
    args = Anvil(binary=Path("/bin/true")).args(8545)
    assert args[args.index("--hardfork") + 1] == "cancun"
    assert args[args.index("--prune-history") + 1] == "512"
    assert "--no-mining" in args
    assert args[args.index("--host") + 1] == "127.0.0.1"


async def test_blocks_carry_the_timestamps_asked_and_transfers_show_in_logs() -> None:
    genesis = 1_600_000_000
    with Anvil(AnvilOptions(timestamp=genesis)) as node:
        async with JsonRpcClient(node.url) as client:
            await _mine_and_check(client, genesis)


async def _mine_and_check(client: JsonRpcClient, genesis: int) -> None:
    devnet = Devnet(client, interval_s=7)
    setup = await devnet.setup(tokens=3)
    mined = await devnet.mine(20, token_transfers=6, eth_transfers=3)
    assert [b.number for b in setup + mined] == list(range(1, 23))
    assert [b.timestamp for b in setup + mined] == [genesis + 7 * n for n in range(1, 23)]
    assert (await _block(client, 0))["timestamp"] == hex(genesis)
    for block in mined:
        assert (await _block(client, block.number))["timestamp"] == hex(block.timestamp)
        assert block.transactions == 9

    first, last = quantity(mined[0].number), quantity(mined[-1].number)
    logs = await client.request(
        "eth_getLogs", [{"fromBlock": first, "toBlock": last, "topics": [TRANSFER_TOPIC]}]
    )
    assert len(logs) == 20 * 6
    assert {log["address"] for log in logs} <= {t.address for t in devnet.tokens}
    # Transfers move tokens; they never make or destroy them.
    token = devnet.tokens[0].address
    calls = [{"to": token, "data": balance_of_data(a)} for a in devnet.accounts]
    balances = await client.batch([("eth_call", [call, "latest"]) for call in calls])
    assert sum(int(b, 16) for b in balances) == TOKEN_SUPPLY


async def test_each_block_is_one_json_rpc_exchange(client: JsonRpcClient) -> None:
    """Its transactions and its evm_mine travel in one batch, and the blocks are read
    back (and checked) a hundred at a time: a chain is generated at the batched
    raw-transaction rate, not three round trips per block."""
    devnet = Devnet(client)
    await devnet.setup(tokens=2)
    before = client.stats.http_requests
    mined = await devnet.mine(150, token_transfers=4, eth_transfers=1)
    assert client.stats.http_requests - before == 150 + 2  # read back: 100 + 50
    assert [b.transactions for b in mined] == [5] * 150
    for block in (mined[0], mined[99], mined[100], mined[-1]):
        on_node = await _block(client, block.number)
        assert (on_node["hash"], len(on_node["transactions"])) == (block.hash, 5)


async def test_a_block_of_more_transactions_than_a_batch_holds_is_mined(
    client: JsonRpcClient,
) -> None:
    """One sender's transactions beyond one batch go in batches one after another:
    sent side by side, they raced for its nonces and the node refused some."""
    devnet = Devnet(client)
    await devnet.setup(tokens=1)
    sender, receiver = devnet.accounts[-2:]
    count = client.max_batch * 2 + 1
    txs = [{"from": sender, "to": receiver, "gas": quantity(21_000), "value": "0x1"}] * count
    block = await devnet.mine_block(txs, False)
    assert block.transactions == count
    assert len((await _block(client, block.number))["transactions"]) == count


async def test_dense_blocks_hold_about_150_transactions_and_400_logs(
    client: JsonRpcClient,
) -> None:
    devnet = Devnet(client)
    await devnet.setup(tokens=3)
    await devnet.setup_pair()
    mined = await devnet.mine(
        2,
        token_transfers=DENSE.token_transfers,
        eth_transfers=DENSE.eth_transfers,
        swaps=DENSE.swaps,
    )
    for block in mined:
        assert block.transactions == 150
        span = {"fromBlock": quantity(block.number), "toBlock": quantity(block.number)}
        logs = await client.request("eth_getLogs", [span])
        assert isinstance(logs, list)
        assert 360 <= len(logs) <= 440, len(logs)


@pytest.mark.parametrize("depth", [1, 5])
async def test_a_reorg_changes_every_hash_above_the_fork(client: JsonRpcClient, depth: int) -> None:
    devnet = Devnet(client, seed=depth)
    await devnet.setup(tokens=1)
    below = await devnet.mine(3)
    await devnet.mine(depth, reorgable=True)
    head = below[-1].number + depth
    before = {n: (await _block(client, n))["hash"] for n in range(1, head + 1)}

    reorg = await devnet.reorg(depth)

    assert reorg.fork_block_number == head - depth
    assert reorg.depth == depth
    assert [b.number for b in reorg.new_blocks] == list(range(head - depth + 1, head + 1))
    after = {n: (await _block(client, n))["hash"] for n in range(1, head + 1)}
    for number in range(1, head + 1):
        if number <= reorg.fork_block_number:
            assert after[number] == before[number]
        else:
            assert after[number] != before[number]
            assert reorg.old_hashes[number] == before[number]
    # The new branch links to the fork point.
    first_new = await _block(client, reorg.fork_block_number + 1)
    assert first_new["parentHash"] == before[reorg.fork_block_number]


async def test_a_reorg_needs_a_snapshot_below_it(client: JsonRpcClient) -> None:
    devnet = Devnet(client)
    await devnet.setup(tokens=1)
    await devnet.mine(2)
    with pytest.raises(ValueError, match="reorgable=True"):
        await devnet.reorg(1)


async def test_selectors_and_topic_are_the_nodes_keccak(client: JsonRpcClient) -> None:
    for digest, signature in SIGNATURES.items():
        hashed = await client.request("web3_sha3", ["0x" + signature.encode().hex()])
        assert hashed.startswith(digest), signature
    assert BALANCE_OF_SELECTOR in SIGNATURES
    assert token_artifact()["evmVersion"] == "cancun"


def test_a_missing_anvil_names_npm_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ANVIL_BIN", raising=False)
    monkeypatch.setattr(anvil_module, "_NPM_BINARY", Path("no/such/anvil"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(AnvilNotFound, match="npm ci"):
        find_anvil()
    monkeypatch.setenv("ANVIL_BIN", str(tmp_path / "anvil"))
    with pytest.raises(AnvilNotFound, match="ANVIL_BIN"):
        find_anvil()


def _devnet_cli(*args: str) -> dict[str, Any]:
    """``python -m blockx_chain.devnet ARGS --exit``: its JSON summary line."""
    done = subprocess.run(
        [sys.executable, "-m", "blockx_chain.devnet", *args, "--exit"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


def test_the_cli_generates_a_devnet_and_exits() -> None:
    summary = _devnet_cli("--blocks", "4", "--reorg-depth", "2", "--tokens", "2", "--swaps", "1")
    # Tokens (2 blocks), the pair (2 blocks), then the blocks of transfers and swaps.
    assert summary["head"] == 2 + 2 + 4
    assert summary["chain_id"] == 31337
    assert len(summary["tokens"]) == 2
    assert summary["pair"].startswith("0x")
    assert len(summary["accounts"]) == 20


async def test_live_mining_keeps_adding_blocks_of_transfers(client: JsonRpcClient) -> None:
    devnet = Devnet(client)
    await devnet.setup(tokens=1)
    start = int((await devnet.head())["number"], 16)
    stop = asyncio.Event()
    live = asyncio.create_task(devnet.run_live(0.01, stop, token_transfers=2, eth_transfers=1))

    async def grew() -> bool:
        return int((await devnet.head())["number"], 16) >= start + 3

    await wait_until(grew, "three live blocks")
    stop.set()
    mined = await live
    head = int((await devnet.head())["number"], 16)
    assert head == start + mined
    for number in range(start + 1, head + 1):
        block = await _block(client, number)
        assert len(block["transactions"]) == 3
        parent = await _block(client, number - 1)
        assert int(block["timestamp"], 16) - int(parent["timestamp"], 16) == devnet.interval_s


def test_the_cli_generates_dense_blocks() -> None:
    summary = _devnet_cli("--blocks", "1", "--dense")
    # Tokens (2 blocks), the pair the swaps trade on (2 blocks), one dense block.
    assert summary["head"] == 2 + 2 + 1
    assert summary["pair"].startswith("0x")
