"""A scripted JSON-RPC server for tests about the client's side: a real HTTP/1.1
socket on 127.0.0.1 whose answers a test decides (status, body), keep-alive included.

``handler(request_json) -> (status, body_bytes)`` (or ``(status, body_bytes,
headers)``) sees each HTTP request's decoded JSON (an object or a batch list);
``requests`` records them. Any other request than a POST (a WebSocket upgrade, a
``GET``) is answered 400 and counted in ``refused``: this node has no WebSocket.

``ScriptedChain`` is such a handler serving a made-up chain (blocks with one ERC-20
transfer each, their receipts and logs) that lies where a test tells it to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from blockx_chain.contracts import TRANSFER_TOPIC

Handler = Callable[[Any], Awaitable[tuple[int, bytes] | tuple[int, bytes, dict[str, str]]]]


def answer(request: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def error(request: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request["id"], "error": {"code": code, "message": message}}


def each(request: Any, one: Callable[[dict[str, Any]], dict[str, Any]]) -> bytes:
    """The JSON answer to an object or a batch, ``one`` answering each request."""
    if isinstance(request, list):
        return json.dumps([one(r) for r in request]).encode()
    return json.dumps(one(request)).encode()


class ScriptedRpcServer:
    def __init__(self, handler: Handler, *, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        # A server context: the node then answers on https://.
        self.tls = tls
        self.requests: list[Any] = []
        self.refused = 0
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/"

    async def __aenter__(self) -> ScriptedRpcServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        # Keep-alive connections end here, not when the test's loop is torn down.
        for writer in self._connections.values():
            writer.close()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"POST "):
                    self.refused += 1
                    writer.write(
                        b"HTTP/1.1 400 X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    )
                    await writer.drain()
                    return
                length = 0
                for line in head.decode().split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                request = json.loads(await reader.readexactly(length))
                self.requests.append(request)
                status, body, *more = await self.handler(request)
                headers = "".join(f"{k}: {v}\r\n" for k, v in (more[0] if more else {}).items())
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\n{headers}\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            self._connections.pop(task, None)
            writer.close()


@contextlib.contextmanager
def served_in_thread(handler: Handler) -> Iterator[str]:
    """A ScriptedRpcServer on an event loop of its own thread, for a synchronous test
    (a CLI command run in-process); yields its URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = ScriptedRpcServer(handler)
    try:
        asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(30)
        try:
            yield server.url
        finally:
            asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


# -- a made-up chain ------------------------------------------------------------------


def block_hash(number: int) -> str:
    return f"0xb1{number:062x}"


def tx_hash(number: int) -> str:
    """The hash of block ``number``'s one transaction."""
    return f"0x7a{number:062x}"


TOKEN = "0x" + "70" * 20
SENDER = "0x" + "5e" * 20
RECEIVER = "0x" + "4e" * 20


def chain_block(number: int, *, full: bool) -> dict[str, Any]:
    tx = {
        "hash": tx_hash(number),
        "blockHash": block_hash(number),
        "blockNumber": hex(number),
        "transactionIndex": "0x0",
        "from": SENDER,
        "to": TOKEN,
        "value": "0x0",
        "input": "0x",
        "nonce": hex(number),
        "gas": "0x5208",
        "type": "0x2",
    }
    return {
        "number": hex(number),
        "hash": block_hash(number),
        "parentHash": block_hash(number - 1) if number else "0x" + "00" * 32,
        "timestamp": hex(1_700_000_000 + 12 * number),
        "miner": "0x" + "00" * 20,
        "gasUsed": "0x5208",
        "gasLimit": "0x1c9c380",
        "baseFeePerGas": "0x7",
        "transactions": [tx if full else tx["hash"]],
    }


def chain_receipts(number: int) -> list[dict[str, Any]]:
    log = {
        "logIndex": "0x0",
        "blockNumber": hex(number),
        "blockHash": block_hash(number),
        "transactionHash": tx_hash(number),
        "transactionIndex": "0x0",
        "address": TOKEN,
        "topics": [TRANSFER_TOPIC, "0x" + "00" * 12 + SENDER[2:], "0x" + "00" * 12 + RECEIVER[2:]],
        "data": "0x" + f"{number + 1:064x}",
    }
    receipt = {
        "transactionHash": tx_hash(number),
        "transactionIndex": "0x0",
        "blockHash": block_hash(number),
        "blockNumber": hex(number),
        "gasUsed": "0x5208",
        "effectiveGasPrice": "0x7",
        "status": "0x1",
        "contractAddress": None,
        "logs": [log],
    }
    return [receipt]


Lie = Callable[[dict[str, Any], Any], Any]


class ScriptedChain:
    """A node holding blocks 0..``head`` of a made-up chain (``head - 64`` finalized).
    ``lie(request, result)`` returns what the node answers instead of ``result``;
    ``answer`` is what it would answer honestly."""

    def __init__(self, head: int, lie: Lie | None = None) -> None:
        self.head = head
        self.lie = lie

    async def __call__(self, request: Any) -> tuple[int, bytes]:
        return 200, each(request, self._one)

    def _one(self, request: dict[str, Any]) -> dict[str, Any]:
        result = self.answer(request["method"], request["params"])
        if self.lie is not None:
            result = self.lie(request, result)
        return answer(request, result)

    def answer(self, method: str, params: list[Any]) -> Any:
        match method:
            case "eth_chainId":
                return "0x7a69"
            case "eth_blockNumber":
                return hex(self.head)
            case "eth_getBlockByNumber":
                number = self._number(params[0])
                return None if number is None else chain_block(number, full=params[1])
            case "eth_getBlockByHash":
                number = self._by_hash(params[0])
                return None if number is None else chain_block(number, full=params[1])
            case "eth_getBlockReceipts":
                number = self._number(params[0])
                return None if number is None else chain_receipts(number)
            case "eth_getTransactionReceipt":
                number = int(params[0][4:], 16)
                return chain_receipts(number)[0] if params[0] == tx_hash(number) else None
            case "eth_getLogs":
                start = self._height(params[0]["fromBlock"])
                end = min(self._height(params[0]["toBlock"]), self.head)
                return [log for n in range(start, end + 1) for log in chain_receipts(n)[0]["logs"]]
            case "eth_getBalance":
                return "0x3039"
        raise AssertionError(f"the scripted chain does not serve {method}")

    def _height(self, param: str) -> int:
        tags = {"latest": self.head, "finalized": max(self.head - 64, 0), "earliest": 0}
        return tags[param] if param in tags else int(param, 16)

    def _number(self, param: str) -> int | None:
        number = self._height(param)
        return number if number <= self.head else None

    def _by_hash(self, param: str) -> int | None:
        number = int(param[4:], 16)
        return number if param == block_hash(number) and number <= self.head else None


def shifted_blocks(chain: ScriptedChain, first: int, last: int) -> Lie:
    """A lie: blocks ``first + 100`` .. ``last + 100`` (and their receipts) for blocks
    ``first`` .. ``last``. They form a chain of their own, so only their numbers give
    them away."""

    def lie(request: dict[str, Any], result: Any) -> Any:
        params = request["params"]
        asked = params[0] if params else None
        if (
            request["method"] in ("eth_getBlockByNumber", "eth_getBlockReceipts")
            and isinstance(asked, str)
            and asked.startswith("0x")
            and first <= int(asked, 16) <= last
        ):
            return chain.answer(request["method"], [hex(int(asked, 16) + 100), *params[1:]])
        return result

    return lie


def lying_head(value: str) -> Lie:
    """A lie: ``value`` for the node's head (``eth_blockNumber``)."""

    def lie(request: dict[str, Any], result: Any) -> Any:
        return value if request["method"] == "eth_blockNumber" else result

    return lie
