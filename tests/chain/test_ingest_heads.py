"""Ingest's new heads by subscription (``blockx_chain.ingest.heads``): newHeads
messages parsed as hostile input, the stall check, and the subscription against
real peers: anvil's WebSocket, a scripted WebSocket node that sends garbage,
oversized frames or nothing, and a JSON-RPC node that refuses the upgrade (ingest
then follows by polling)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from rpc_scripted import ScriptedChain, ScriptedRpcServer
from support import wait_until
from websockets.asyncio.server import ServerConnection, serve

from blockx_chain.devnet import Anvil
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.ingest.heads import (
    MAX_MESSAGE_BYTES,
    Dropped,
    Head,
    Heads,
    StallCheck,
    parse_head,
    subscription_id,
)
from blockx_chain.rpc import JsonRpcClient
from blockx_chain.store import StoreUnavailable, open_store
from blockx_chain.url import SqliteUrl

SUB = "0x9cef478923ff08bf67fde6c64013158d"
HASH = "0x" + "ab" * 32


def note(header: Any, *, sub: str = SUB, method: str = "eth_subscription") -> bytes:
    params = {"subscription": sub, "result": header}
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode()


MESSAGES = [
    # (message, expected)
    (note({"number": "0x1b4", "hash": HASH, "parentHash": HASH}), Head(436, HASH)),
    (note({"number": "0x0", "hash": HASH.upper().replace("0X", "0x")}), Head(0, HASH)),
    (b"not json", Dropped),
    (b"[1, 2]", Dropped),
    (b'"a string"', Dropped),
    (note({"number": "0x1", "hash": HASH}, method="eth_other"), Dropped),
    (note({"number": "0x1", "hash": HASH}, sub="0xother"), Dropped),
    (note(None), Dropped),
    (note({"number": "1", "hash": HASH}), Dropped),
    (note({"number": "0x" + "f" * 65, "hash": HASH}), Dropped),
    (note({"number": 7, "hash": HASH}), Dropped),
    (note({"number": "0x1", "hash": "0x1234"}), Dropped),
    (note({"number": "0x1"}), Dropped),
    (note("0x1"), Dropped),
    (json.dumps({"jsonrpc": "2.0", "id": 1, "result": SUB}).encode(), Dropped),
]


@pytest.mark.parametrize(("message", "expected"), MESSAGES)
def test_a_message_is_a_head_or_dropped(message: bytes, expected: Head | type[Dropped]) -> None:
    parsed = parse_head(message, SUB)
    if isinstance(expected, Head):
        assert parsed == expected
    else:
        assert isinstance(parsed, Dropped), parsed
        assert parsed.reason


ANSWERS = [
    (json.dumps({"jsonrpc": "2.0", "id": 1, "result": SUB}).encode(), SUB),
    (json.dumps({"jsonrpc": "2.0", "id": 2, "result": SUB}).encode(), Dropped),
    (json.dumps({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601}}).encode(), Dropped),
    (json.dumps({"jsonrpc": "2.0", "id": 1, "result": 5}).encode(), Dropped),
    (json.dumps({"jsonrpc": "2.0", "id": 1, "result": "x" * 500}).encode(), Dropped),
    (b"{", Dropped),
]


@pytest.mark.parametrize(("message", "expected"), ANSWERS)
def test_the_subscribe_answer_gives_an_id_or_is_refused(
    message: bytes, expected: str | type[Dropped]
) -> None:
    got = subscription_id(message)
    if isinstance(expected, str):
        assert got == expected
    else:
        assert isinstance(got, Dropped)


def test_a_subscription_behind_the_polls_for_the_stall_bound_stalled() -> None:
    check = StallCheck(stall_ms=1000)
    check.live()
    assert not check.stalled(10, now_ms=0)  # nothing pushed yet: behind from now
    assert not check.stalled(10, now_ms=999)
    assert check.stalled(11, now_ms=1000)
    check.pushed(11)  # it caught up
    assert not check.stalled(11, now_ms=1500)
    assert not check.stalled(12, now_ms=1600)  # behind again, from 1600
    assert not check.stalled(12, now_ms=2599)
    check.pushed(13)
    assert not check.stalled(12, now_ms=5000)  # a poll behind the pushes is no stall
    check.pushed(8)  # a reorg to a shorter branch: pushes go down
    assert not check.stalled(8, now_ms=6000)


async def test_a_block_mined_on_anvil_is_pushed(anvil: Anvil) -> None:
    stop = asyncio.Event()
    async with Heads(anvil.url.replace("http://", "ws://")) as heads:
        await wait_until(lambda: heads.subscriptions == 1, "the subscription", timeout=30)
        await heads.wait(stop, 0)  # the wake-up of the new subscription
        async with JsonRpcClient(anvil.url) as rpc:
            await rpc.request("evm_mine", [])
        await heads.wait(stop, 60)
        assert heads.pushed >= 1
        assert heads.dropped == 0


class ScriptedWsNode:
    """A WebSocket node that answers eth_subscribe with SUB, then sends what
    ``script`` gives for that connection (its number, from 0)."""

    def __init__(self, script: Callable[[int], list[bytes]]) -> None:
        self.script = script
        self.connections = 0
        self.url = ""

    async def _serve(self, ws: ServerConnection) -> None:
        number = self.connections
        self.connections += 1
        request = json.loads(await ws.recv())
        assert request["method"] == "eth_subscribe"
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": SUB}))
        for message in self.script(number):
            await ws.send(message.decode())
        await ws.wait_closed()


@contextlib.asynccontextmanager
async def served(node: ScriptedWsNode) -> AsyncIterator[ScriptedWsNode]:
    async with serve(node._serve, "127.0.0.1", 0, max_size=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        node.url = f"ws://127.0.0.1:{port}"
        yield node


async def test_hostile_messages_are_dropped_and_a_good_head_still_wakes() -> None:
    hostile = [m for m, expected in MESSAGES if expected is Dropped]
    good = note({"number": "0x20", "hash": HASH})
    node = ScriptedWsNode(lambda _: [*hostile, good])
    async with served(node):
        stop = asyncio.Event()
        async with Heads(node.url) as heads:
            await wait_until(lambda: heads.pushed == 1, "the good head", timeout=30)
            await heads.wait(stop, 0)
            assert heads.dropped == len(hostile)
            assert heads.subscriptions == 1


async def test_an_oversized_message_drops_the_connection_and_it_is_made_again() -> None:
    huge = note({"number": "0x1", "hash": HASH, "extra": "x" * MAX_MESSAGE_BYTES})
    good = note({"number": "0x2", "hash": HASH})
    node = ScriptedWsNode(lambda number: [huge] if number == 0 else [good])
    async with served(node), Heads(node.url) as heads:
        await wait_until(lambda: heads.pushed == 1, "a head on a new connection", timeout=30)
        assert heads.subscriptions == 2
        assert node.connections == 2


async def test_a_stalled_subscription_is_made_again() -> None:
    good = note({"number": "0x5", "hash": HASH})
    node = ScriptedWsNode(lambda number: [] if number == 0 else [good])
    async with served(node), Heads(node.url, stall_ms=0) as heads:
        await wait_until(lambda: heads.subscriptions == 1, "the subscription", timeout=30)
        heads.polled(5)  # the poll sees block 5, which nothing pushed: behind
        heads.polled(5)  # still behind after the (zero) stall bound: stalled
        await wait_until(lambda: heads.pushed == 1, "a head on a new connection", timeout=30)
        assert node.connections == 2


async def test_a_node_without_websocket_is_followed_by_polling(tmp_path: Path) -> None:
    chain = ScriptedChain(head=10)
    db = SqliteUrl(tmp_path / "chain.db")
    async with ScriptedRpcServer(chain) as node:
        stop = asyncio.Event()
        options = IngestOptions(follow=True, poll_interval_s=0.05, confirmations=0)
        run = asyncio.create_task(ingest(node.url, db, options, stop=stop))

        async def head() -> int | None:
            try:
                store = await open_store(db, read_only=True)
            except StoreUnavailable:
                return None  # not made yet
            try:
                stored = await store.head()
            finally:
                await store.close()
            return None if stored is None else stored["number"]

        async def reached(number: int) -> bool:
            assert not run.done() or run.result() is None
            return db.path.exists() and await head() == number

        await wait_until(lambda: reached(10), "the first blocks", timeout=60)
        await wait_until(lambda: node.refused >= 1, "the upgrade tried", timeout=30)
        chain.head = 13
        await wait_until(lambda: reached(13), "a new head, polled", timeout=60)
        stop.set()
        summary = await asyncio.wait_for(run, 30)
    assert summary.blocks == 14
