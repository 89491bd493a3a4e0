"""The fork walk's reads against a node whose chain got shorter meanwhile: a
scripted JSON-RPC node that has blocks 0..2 and answers null for any higher one,
as a node does right after a reorg to a shorter branch."""

from __future__ import annotations

from typing import Any

import pytest
from rpc_scripted import ScriptedRpcServer, answer, each, error

from blockx_chain.ingest.errors import NodeUnusable
from blockx_chain.ingest.fetch import BatchFetcher
from blockx_chain.rpc import EthRpc, JsonRpcClient, quantity

HEAD = 2


def _header(number: int) -> dict[str, Any]:
    parent = f"0x{number - 1:064X}" if number else "0x" + "00" * 32
    return {
        "number": quantity(number),
        "hash": f"0x{number:064X}",
        "parentHash": parent,
        "transactions": [],
    }


def _block(request: dict[str, Any]) -> dict[str, Any]:
    assert request["method"] == "eth_getBlockByNumber"
    number = int(request["params"][0], 16)
    return answer(request, _header(number) if number <= HEAD else None)


async def _short_node(request: Any) -> tuple[int, bytes]:
    return 200, each(request, _block)


async def test_blocks_the_node_no_longer_has_are_left_out_of_the_walk() -> None:
    async with ScriptedRpcServer(_short_node) as node, JsonRpcClient(node.url) as rpc:
        hashes = await BatchFetcher(EthRpc(rpc), attempts=1).hashes([0, 1, 2, 3, 4])
    assert hashes == {n: f"0x{n:064x}" for n in range(HEAD + 1)}


async def test_a_node_that_fails_the_walk_is_still_unusable() -> None:
    async def broken(request: Any) -> tuple[int, bytes]:
        return 200, each(request, lambda r: error(r, -32602, "invalid params"))

    async with ScriptedRpcServer(broken) as node, JsonRpcClient(node.url) as rpc:
        with pytest.raises(NodeUnusable, match="fork walk"):
            await BatchFetcher(EthRpc(rpc), attempts=1).hashes([0, 1])
