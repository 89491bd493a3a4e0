"""Typed Ethereum reads over a JsonRpcClient, for ingest and tools.

Quantities are ints, block and receipt objects the node's dicts, each checked
against its request (``blockx_chain.rpc.answers``): a block of another number, a
receipt of another transaction or a malformed answer is BAD_ANSWER. A block or
receipt list the node answers ``null`` for is NOT_FOUND: a caller that asked for
block n must not mistake "unknown" for "empty".
"""

from __future__ import annotations

import asyncio
from typing import Any

from blockx_chain.rpc.answers import (
    ByNumber,
    check_answer,
    check_block,
    check_receipts,
)
from blockx_chain.rpc.client import JsonRpcClient
from blockx_chain.rpc.errors import RpcError, RpcErrorKind, is_method_missing


def quantity(value: int) -> str:
    """An int as a JSON-RPC quantity (``0x``-prefixed, no leading zeros)."""
    if value < 0:
        raise ValueError(f"a quantity is not negative (got {value})")
    return hex(value)


class EthRpc:
    def __init__(self, client: JsonRpcClient) -> None:
        self.client = client
        # None until the node has been asked; False once it lacked eth_getBlockReceipts.
        self._block_receipts: bool | None = None

    async def block_number(self) -> int:
        return await self._quantity("eth_blockNumber")

    async def chain_id(self) -> int:
        return await self._quantity("eth_chainId")

    async def _quantity(self, method: str) -> int:
        answer = check_answer(method, [], await self.client.request(method))
        return int(answer, 16)

    async def finalized_block(self) -> int | None:
        """The node's finalized block number; None when it has no ``finalized`` tag."""
        params: list[Any] = ["finalized", False]
        try:
            block = await self.client.request("eth_getBlockByNumber", params)
        except RpcError as exc:
            if exc.kind in (RpcErrorKind.BAD_REQUEST, RpcErrorKind.NOT_FOUND):
                return None
            raise
        if block is None:
            return None
        return int(check_answer("eth_getBlockByNumber", params, block)["number"], 16)

    async def get_block(self, number: int, full: bool = True) -> dict[str, Any]:
        params: list[Any] = [quantity(number), full]
        block = await self.client.request("eth_getBlockByNumber", params)
        if block is None:
            raise RpcError(RpcErrorKind.NOT_FOUND, f"the node has no block {number}")
        checked: dict[str, Any] = check_answer("eth_getBlockByNumber", params, block)
        return checked

    async def get_blocks(self, numbers: list[int], full: bool = True) -> list[dict[str, Any]]:
        """Blocks in the order asked (one JSON-RPC batch when they fit one)."""
        asked = [[quantity(n), full] for n in numbers]
        blocks = await self.client.batch([("eth_getBlockByNumber", params) for params in asked])
        shape = "true" if full else "false"
        for number, params, block in zip(numbers, asked, blocks, strict=True):
            if block is None:
                raise RpcError(RpcErrorKind.NOT_FOUND, f"the node has no block {number}")
            # check_answer's check, named as call_text names it, without building the
            # name of each of thousands of requests that are answered right.
            check_block(
                block, ByNumber(number), f"eth_getBlockByNumber({params[0]}, {shape})", full=full
            )
        return blocks

    async def get_logs(self, query: dict[str, Any]) -> list[dict[str, Any]]:
        """``eth_getLogs(query)``: logs inside the range asked, of the addresses and
        topics asked (``check_logs``)."""
        params = [query]
        logs = await self.client.request("eth_getLogs", params)
        checked: list[dict[str, Any]] = check_answer("eth_getLogs", params, logs)
        return checked

    async def get_block_receipts(self, numbers: list[int]) -> list[list[dict[str, Any]]]:
        """Every receipt of each block, in transaction order, each of the block number
        asked for. Uses eth_getBlockReceipts, or per-transaction receipts on a node
        that lacks it."""
        if self._block_receipts is not False:
            try:
                asked = (self._block_receipts_of(n) for n in numbers)
                receipts = list(await asyncio.gather(*asked))
            except RpcError as exc:
                if not is_method_missing(exc):
                    raise
                self._block_receipts = False
            else:
                self._block_receipts = True
                return receipts
        blocks = await self.get_blocks(numbers, full=False)
        return list(await asyncio.gather(*(self._receipts_one_by_one(b) for b in blocks)))

    async def _block_receipts_of(self, number: int) -> list[dict[str, Any]]:
        params = [quantity(number)]
        receipts = await self.client.request("eth_getBlockReceipts", params)
        if receipts is None:
            raise RpcError(RpcErrorKind.NOT_FOUND, f"the node has no receipts of block {number}")
        checked: list[dict[str, Any]] = check_answer("eth_getBlockReceipts", params, receipts)
        return checked

    async def _receipts_one_by_one(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        hashes: list[str] = block["transactions"]
        receipts = await asyncio.gather(
            *(self.client.request("eth_getTransactionReceipt", [h]) for h in hashes)
        )
        for tx_hash, receipt in zip(hashes, receipts, strict=True):
            if receipt is None:
                raise RpcError(RpcErrorKind.NOT_FOUND, f"the node has no receipt of {tx_hash}")
            check_answer("eth_getTransactionReceipt", [tx_hash], receipt)
        number = int(block["number"], 16)
        return check_receipts(list(receipts), f"receipts of block {number}", number=number)
