"""JsonRpcClient and EthRpc: batching and typed reads against a real anvil, and the
classification of every failure against a scripted misbehaving JSON-RPC server."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import itertools
import json
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from certs import Leaf, make_pki
from rpc_scripted import ScriptedRpcServer, answer, each, error
from support import free_port

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.rpc import EthRpc, JsonRpcClient, RpcError, RpcErrorKind, quantity


@pytest_asyncio.fixture
async def chain(anvil: Anvil) -> AsyncIterator[JsonRpcClient]:
    """The module's anvil with tokens and 10 blocks of transfers (mined once)."""
    async with JsonRpcClient(anvil.url) as client:
        if int(await client.request("eth_blockNumber"), 16) == 0:
            devnet = Devnet(client)
            await devnet.setup(tokens=2)
            await devnet.mine(10, token_transfers=5, eth_transfers=2)
        yield client


async def test_concurrent_requests_go_as_one_batch(chain: JsonRpcClient) -> None:
    async with JsonRpcClient(chain.url) as client:
        blocks = await asyncio.gather(
            *(client.request("eth_getBlockByNumber", [quantity(n), False]) for n in range(12))
        )
        assert [int(b["number"], 16) for b in blocks] == list(range(12))
        assert client.stats.http_requests == 1
        assert client.stats.rpc_requests == 12


async def test_a_batch_holds_at_most_max_batch_requests(chain: JsonRpcClient) -> None:
    async with JsonRpcClient(chain.url, max_batch=5) as client:
        await asyncio.gather(*(client.request("eth_chainId") for _ in range(12)))
        assert client.stats.http_requests == 3
        assert client.stats.largest_batch == 5


async def test_a_time_window_gathers_requests_made_apart(chain: JsonRpcClient) -> None:
    async with JsonRpcClient(chain.url, batch_window_s=0.05) as client:

        async def later(turns: int) -> Any:
            for _ in range(turns):
                await asyncio.sleep(0)
            return await client.request("eth_chainId")

        assert await asyncio.gather(*(later(t) for t in range(5))) == ["0x7a69"] * 5
        assert client.stats.http_requests == 1


async def test_typed_reads(chain: JsonRpcClient) -> None:
    eth = EthRpc(chain)
    head = await eth.block_number()
    assert head == 12
    assert await eth.chain_id() == 31337
    blocks = await eth.get_blocks([3, 4], full=True)
    assert [int(b["number"], 16) for b in blocks] == [3, 4]
    assert len(blocks[0]["transactions"]) == 7
    assert isinstance(blocks[0]["transactions"][0], dict)
    receipts = await eth.get_block_receipts([3, 4])
    assert [len(r) for r in receipts] == [7, 7]
    assert [r["transactionHash"] for r in receipts[0]] == [
        t["hash"] for t in blocks[0]["transactions"]
    ]
    finalized = await eth.finalized_block()
    assert finalized is not None
    assert 0 <= finalized <= head


async def test_an_unknown_block_is_not_found(chain: JsonRpcClient) -> None:
    with pytest.raises(RpcError) as caught:
        await EthRpc(chain).get_blocks([5, 10_000])
    assert caught.value.kind is RpcErrorKind.NOT_FOUND
    assert "10000" in caught.value.message


async def test_block_receipts_fall_back_to_per_transaction_receipts(
    chain: JsonRpcClient,
) -> None:
    """A node without eth_getBlockReceipts: the scripted server forwards to anvil
    everything else."""
    forward = httpx.AsyncClient()

    async def handler(request: Any) -> tuple[int, bytes]:
        def refuse(r: dict[str, Any]) -> dict[str, Any]:
            return error(r, -32601, "the method eth_getBlockReceipts does not exist")

        calls = request if isinstance(request, list) else [request]
        if any(r["method"] == "eth_getBlockReceipts" for r in calls):
            return 200, each(request, refuse)
        response = await forward.post(chain.url, json=request)
        return response.status_code, response.content

    try:
        async with ScriptedRpcServer(handler) as server, JsonRpcClient(server.url) as client:
            eth = EthRpc(client)
            fallback = await eth.get_block_receipts([3, 4])
            again = await eth.get_block_receipts([5])
        direct = await EthRpc(chain).get_block_receipts([3, 4])
    finally:
        await forward.aclose()
    assert fallback == direct
    assert len(again[0]) == 7
    # Asked once: the second call went straight to per-transaction receipts.
    asked = [
        r["method"]
        for batch in server.requests
        for r in (batch if isinstance(batch, list) else [batch])
    ]
    assert asked.count("eth_getBlockReceipts") == 2


def _status(status: int) -> Any:
    async def handler(request: Any) -> tuple[int, bytes]:
        return status, b'{"error": "busy"}'

    return handler


def _node_error(code: int, message: str) -> Any:
    async def handler(request: Any) -> tuple[int, bytes]:
        return 200, each(request, lambda r: error(r, code, message))

    return handler


FAILURES = [
    # (the scripted node, the kind the client reports, words of its message)
    (_status(429), RpcErrorKind.UNAVAILABLE, "HTTP 429"),
    (_status(500), RpcErrorKind.UNAVAILABLE, "HTTP 500"),
    (_status(503), RpcErrorKind.UNAVAILABLE, "HTTP 503"),
    (_status(400), RpcErrorKind.BAD_REQUEST, "HTTP 400"),
    (_node_error(-32602, "invalid params: bad address"), RpcErrorKind.BAD_REQUEST, "invalid"),
    (_node_error(-32601, "Method not found"), RpcErrorKind.BAD_REQUEST, "Method not found"),
    (_node_error(-32005, "limit exceeded"), RpcErrorKind.UNAVAILABLE, "limit exceeded"),
    (_node_error(-32000, "header not found"), RpcErrorKind.NOT_FOUND, "header not found"),
    (_node_error(-32001, "Resource not found"), RpcErrorKind.NOT_FOUND, "Resource not found"),
    (_node_error(3, "execution reverted"), RpcErrorKind.BAD_REQUEST, "execution reverted"),
]


@pytest.mark.parametrize(("handler", "kind", "words"), FAILURES)
async def test_failures_are_classified(handler: Any, kind: RpcErrorKind, words: str) -> None:
    async with ScriptedRpcServer(handler) as server, JsonRpcClient(server.url) as client:
        with pytest.raises(RpcError) as caught:
            await client.request("eth_getBalance", ["0x" + "00" * 20, "latest"])
    assert caught.value.kind is kind
    assert words in caught.value.message
    assert caught.value.retryable is (kind is RpcErrorKind.UNAVAILABLE)


async def test_a_refused_connection_is_unavailable() -> None:
    async with JsonRpcClient(f"http://127.0.0.1:{free_port()}") as client:
        with pytest.raises(RpcError) as caught:
            await client.request("eth_chainId")
    assert caught.value.kind is RpcErrorKind.UNAVAILABLE
    assert "cannot reach the node" in caught.value.message


async def test_an_answer_missing_from_a_batch_is_unavailable() -> None:
    async def handler(request: Any) -> tuple[int, bytes]:
        return 200, json.dumps([answer(request[0], "0x1")]).encode()

    async with ScriptedRpcServer(handler) as server, JsonRpcClient(server.url) as client:
        answers: tuple[Any, Any] = await asyncio.gather(
            client.request("eth_chainId"), client.request("eth_blockNumber"), return_exceptions=True
        )
    first, second = answers
    assert first == "0x1"
    assert isinstance(second, RpcError)
    assert second.kind is RpcErrorKind.UNAVAILABLE


async def test_no_finalized_tag_is_none() -> None:
    handler = _node_error(-32602, "invalid block tag finalized")
    async with ScriptedRpcServer(handler) as server, JsonRpcClient(server.url) as client:
        assert await EthRpc(client).finalized_block() is None


# -- answers the client cannot match to its requests ---------------------------------

ASKED = ["eth_chainId", "eth_blockNumber", "eth_gasPrice"]


def _answers(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [answer(r, "0x1") for r in requests]


def _with_id(position: int, id_: Any) -> Callable[[list[dict[str, Any]]], Any]:
    def reply(requests: list[dict[str, Any]]) -> Any:
        answers = _answers(requests)
        answers[position]["id"] = id_(requests[position]["id"]) if callable(id_) else id_
        return answers

    return reply


def _without_id(requests: list[dict[str, Any]]) -> Any:
    answers = _answers(requests)
    del answers[1]["id"]
    return answers


def _first_twice(requests: list[dict[str, Any]]) -> Any:
    answers = _answers(requests)
    answers[1]["id"] = requests[0]["id"]
    return answers


MALFORMED = [
    # (requests, the node's one bad reply to them, which requests fail)
    (1, lambda rs: {**_answers(rs)[0], "id": [rs[0]["id"]]}, [True]),
    (3, _with_id(1, lambda i: [i]), [False, True, False]),
    (3, _with_id(1, lambda i: {"id": i}), [False, True, False]),
    (3, _with_id(1, float), [False, True, False]),
    (3, _with_id(1, lambda i: str(i)), [False, True, False]),
    (3, _with_id(0, True), [True, False, False]),  # the first request's id is 1
    (3, _with_id(1, 999), [False, True, False]),
    (3, _with_id(1, None), [False, True, False]),
    (3, _without_id, [False, True, False]),
    (3, _first_twice, [True, True, False]),
    (3, lambda rs: _answers(rs)[:2], [False, False, True]),
    (3, lambda rs: [*_answers(rs), {"jsonrpc": "2.0", "id": 7, "result": "0x2"}], [False] * 3),
    (3, lambda rs: _answers(rs)[0], [False, True, True]),
    (3, lambda rs: [1, 2, 3], [True] * 3),
    (3, lambda rs: 3, [True] * 3),
]


@pytest.mark.parametrize(("count", "reply", "failing"), MALFORMED)
async def test_an_answer_that_matches_no_request_fails_only_those_and_the_client_goes_on(
    count: int, reply: Callable[[list[dict[str, Any]]], Any], failing: list[bool]
) -> None:
    """The node misbehaves once: the requests it left without an answer fail
    UNAVAILABLE (retryable), the others get theirs, and the next requests succeed."""
    replies = 0

    async def handler(request: Any) -> tuple[int, bytes]:
        nonlocal replies
        replies += 1
        requests = request if isinstance(request, list) else [request]
        if replies == 1:
            return 200, json.dumps(reply(requests)).encode()
        return 200, each(request, lambda r: answer(r, "0x1"))

    async with ScriptedRpcServer(handler) as server, JsonRpcClient(server.url) as client:
        # A guard against the hang this test is about, not a measure of time.
        first = await asyncio.wait_for(
            asyncio.gather(*(client.request(m) for m in ASKED[:count]), return_exceptions=True),
            30,
        )
        second = await client.batch([(m, []) for m in ASKED[:count]])
    for got, fails in zip(first, failing, strict=True):
        if fails:
            assert isinstance(got, RpcError), got
            assert got.kind is RpcErrorKind.UNAVAILABLE
            assert got.retryable
            assert "the node's reply" in got.message or "not JSON-RPC" in got.message
        else:
            assert got == "0x1"
    assert second == ["0x1"] * count
    assert replies == 2


# -- the HTTP/1.1 transport: framing, encodings, connections --------------------------

Reply = Callable[[Any, int], Awaitable[tuple[bytes, bool]]]


class RawNode(ScriptedRpcServer):
    """A node on a real socket (on 127.0.0.1 unless told) that writes the raw bytes a
    test scripts: ``reply(request_json, exchange_number_on_its_connection) ->
    (bytes, close_after)``. It counts connections (open at once, at most, in all) and
    keeps each request's head."""

    def __init__(self, reply: Reply, host: str = "127.0.0.1") -> None:
        super().__init__(_no_handler)
        self.reply = reply
        self.host = host
        self.heads: list[bytes] = []
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self._changed = asyncio.Condition()

    @property
    def url(self) -> str:
        return f"http://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}/"

    async def __aenter__(self) -> RawNode:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def until_closed(self) -> None:
        """Until every connection made so far is closed."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.open == 0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            for exchange in itertools.count():
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = next(
                    int(line.partition(b":")[2])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                request = json.loads(await reader.readexactly(length))
                self.requests.append(request)
                raw, close = await self.reply(request, exchange)
                writer.write(raw)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self._connections.pop(task, None)
            async with self._changed:
                self.open -= 1
                self._changed.notify_all()


async def _no_handler(request: Any) -> tuple[int, bytes]:
    raise AssertionError("a RawNode answers with its reply")


def _body(request: Any) -> bytes:
    return each(request, lambda r: answer(r, f"0x{r['id']:x}"))


def _plain(body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in (f"content-length: {len(body)}", *headers))
    return f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{head}\r\n".encode() + body


def _chunked(body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in ("transfer-encoding: chunked", *headers))
    thirds = [body[: len(body) // 3], body[len(body) // 3 : -1], body[-1:]]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in thirds)
    return f"HTTP/1.1 200 OK\r\n{head}\r\n".encode() + chunks + b"0\r\n\r\n"


def _deflate_raw(body: bytes) -> bytes:
    squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return squeeze.compress(body) + squeeze.flush()


ENCODED = [
    # (the answer's framing, its content-encoding, the body so encoded)
    (_plain, None, lambda b: b),
    (_chunked, None, lambda b: b),
    (_plain, "gzip", gzip.compress),
    (_chunked, "gzip", gzip.compress),
    (_plain, "deflate", zlib.compress),
    (_chunked, "deflate", _deflate_raw),  # the raw deflate some servers send
]


@pytest.mark.parametrize(("framing", "encoding", "encode"), ENCODED)
async def test_chunked_and_compressed_answers_are_read(
    framing: Callable[..., bytes], encoding: str | None, encode: Callable[[bytes], bytes]
) -> None:
    async def reply(request: Any, exchange: int) -> tuple[bytes, bool]:
        headers = [f"content-encoding: {encoding}"] if encoding else []
        return framing(encode(_body(request)), *headers), False

    async with RawNode(reply) as node, JsonRpcClient(node.url) as client:
        first = await client.batch([("eth_chainId", []), ("eth_blockNumber", [])])
        second = await client.request("eth_chainId")
    assert first == ["0x1", "0x2"]
    assert second == "0x3"
    assert node.connections == 1
    assert b"accept-encoding: gzip" in node.heads[0].lower()


OVERSIZED = [
    # (how the node sends its answer, eth_getCode's result size, the client's bound)
    (_plain, 10_000, 4096),  # a content-length over the bound, refused unread
    (_chunked, 10_000, 4096),  # streamed past the bound
    # 50 MB of zeros gzipped to 50 KB: what is bounded is the size decoded.
    (lambda body: _chunked(gzip.compress(body), "content-encoding: gzip"), 50_000_000, 65536),
]


@pytest.mark.parametrize(("send", "size", "bound"), OVERSIZED)
async def test_an_oversized_answer_fails_only_its_own_request(
    send: Callable[[bytes], bytes], size: int, bound: int
) -> None:
    async def reply(request: Any, exchange: int) -> tuple[bytes, bool]:
        def one(r: dict[str, Any]) -> dict[str, Any]:
            return answer(r, "0x" + "0" * size if r["method"] == "eth_getCode" else "0x1")

        return send(each(request, one)), False

    async with RawNode(reply) as node, JsonRpcClient(node.url, max_response_bytes=bound) as c:
        answers: tuple[Any, Any] = await asyncio.gather(
            c.request("eth_chainId"),
            c.request("eth_getCode", ["0x" + "00" * 20, "latest"]),
            return_exceptions=True,
        )
    small, big = answers
    assert small == "0x1"
    assert isinstance(big, RpcError)
    assert big.kind is RpcErrorKind.BAD_REQUEST
    assert f"larger than {bound} bytes" in big.message
    # The batch, then its halves (here single requests) to find the one too large.
    assert [len(r) if isinstance(r, list) else 1 for r in node.requests] == [2, 1, 1]


@pytest.mark.parametrize(
    ("big_one", "exchanges"),
    [
        (None, [8, 4, 4]),  # too large only as a whole: its two halves fit
        (5, [8, 4, 4, 2, 2, 1, 1]),  # one answer too large alone: halved down to it
    ],
)
async def test_a_batch_too_large_is_halved_until_its_answers_fit(
    big_one: int | None, exchanges: list[int]
) -> None:
    async def reply(request: Any, exchange: int) -> tuple[bytes, bool]:
        def one(r: dict[str, Any]) -> dict[str, Any]:
            size = 10_000 if r["params"] == [big_one] else 600
            return answer(r, "0x" + "1" * size)

        return _plain(each(request, one)), False

    async with RawNode(reply) as node, JsonRpcClient(node.url, max_response_bytes=4096) as c:
        answers = await asyncio.gather(
            *(c.request("eth_getCode", [n]) for n in range(8)), return_exceptions=True
        )
    # The halves go out together: the node may see them in either order.
    sizes = [len(r) if isinstance(r, list) else 1 for r in node.requests]
    assert sorted(sizes, reverse=True) == exchanges
    for n, got in enumerate(answers):
        if n == big_one:
            assert isinstance(got, RpcError)
            assert got.kind is RpcErrorKind.BAD_REQUEST
        else:
            assert got == "0x" + "1" * 600


async def test_batches_one_after_another_share_one_connection() -> None:
    async def reply(request: Any, exchange: int) -> tuple[bytes, bool]:
        return _plain(_body(request)), False

    async with RawNode(reply) as node, JsonRpcClient(node.url) as client:
        for _ in range(5):
            await client.batch([("eth_chainId", []), ("eth_blockNumber", [])])
    assert len(node.requests) == 5
    assert node.connections == 1


_TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
IDLE_ENDS = [
    # (what the server sends after its first answer, whether it then closes)
    (b"", True),
    (_TIMEOUT_408, True),
    (_TIMEOUT_408, False),
]


@pytest.mark.parametrize(("parting", "close"), IDLE_ENDS)
async def test_a_connection_the_server_closed_or_spoke_on_while_idle_is_not_sent_on(
    parting: bytes, close: bool
) -> None:
    async def reply(request: Any, exchange: int) -> tuple[bytes, bool]:
        return _plain(_body(request)) + parting, close

    async with RawNode(reply) as node, JsonRpcClient(node.url) as client:
        assert await client.request("eth_chainId") == "0x1"
        if close:
            await node.until_closed()
        assert await client.request("eth_chainId") == "0x2"
    assert len(node.requests) == 2  # each sent once
    assert node.connections == 2


MID_ANSWER = [
    # (what the server sends before it closes the connection)
    b"",
    b"HTTP/1.1 200 OK\r\ncontent-len",
    b"HTTP/1.1 200 OK\r\ncontent-length: 500\r\n\r\n[{",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\n[{",
    b"200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 9\r\n\r\n"
    + gzip.compress(b"[1, 2, 3]", mtime=0)[:9],  # one text on every xdist worker
    b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 10\r\n\r\nnot gzip!!",
]


@pytest.mark.parametrize("sent", MID_ANSWER)
async def test_an_answer_broken_off_is_unavailable_and_not_sent_again(sent: bytes) -> None:
    async def reply(request: Any, exchange: int) -> tuple[bytes, bool]:
        if len(node.requests) == 1:
            return sent, True
        return _plain(_body(request)), False

    async with RawNode(reply) as node, JsonRpcClient(node.url) as client:
        with pytest.raises(RpcError) as caught:
            await client.batch([("eth_sendRawTransaction", ["0x02"]), ("eth_blockNumber", [])])
        assert caught.value.kind is RpcErrorKind.UNAVAILABLE
        assert f"cannot reach the node at {node.url}" in caught.value.message
        assert len(node.requests) == 1
        # The client goes on, on a new connection.
        assert await client.request("eth_chainId") == "0x3"
    assert len(node.requests) == 2
    assert node.connections == 2


async def test_at_most_max_connections_are_open_at_once() -> None:
    """50 batches at once on 4 connections: the node holds its answers until 4
    requests wait at once, so the bound is reached, never passed."""
    waiting = 0
    four = asyncio.Event()

    async def reply(request: Any, exchange: int) -> tuple[bytes, bool]:
        nonlocal waiting
        waiting += 1
        if waiting == 4:
            four.set()
        await four.wait()
        return _plain(_body(request)), False

    async with RawNode(reply) as node, JsonRpcClient(node.url, max_connections=4) as client:
        # A guard against the hang a smaller bound would cause, not a measure of time.
        answers = await asyncio.wait_for(
            asyncio.gather(*(client.batch([("eth_chainId", [])]) for _ in range(50))), 30
        )
    assert answers == [[f"0x{i:x}"] for i in range(1, 51)]
    assert len(node.requests) == 50
    assert node.most_open == 4
    assert node.connections == 4


async def test_closing_the_client_closes_its_connections() -> None:
    async def reply(request: Any, exchange: int) -> tuple[bytes, bool]:
        await asyncio.sleep(0)
        return _plain(_body(request)), False

    async with RawNode(reply) as node:
        async with JsonRpcClient(node.url, max_connections=3) as client:
            await asyncio.gather(*(client.batch([("eth_chainId", [])]) for _ in range(3)))
            assert node.open == 3
        await node.until_closed()
        assert node.connections == 3


async def test_the_url_gives_target_host_and_basic_authorization() -> None:
    async def reply(request: Any, exchange: int) -> tuple[bytes, bool]:
        return _plain(_body(request)), False

    async with RawNode(reply) as node:
        url = node.url.replace("http://", "http://ali%40ce:pa%3Ass@") + "rpc/v1?key=k%20y"
        async with JsonRpcClient(url) as client:
            assert await client.request("eth_chainId") == "0x1"
    head = node.heads[0].decode()
    lines = head.lower().split("\r\n")
    assert lines[0] == "post /rpc/v1?key=k%20y http/1.1"
    assert f"host: {node.url[len('http://') : -1]}" in lines
    assert "content-type: application/json" in lines
    credentials = base64.b64encode(b"ali@ce:pa:ss").decode().lower()
    assert f"authorization: basic {credentials}" in lines


async def test_an_ipv6_literal_host() -> None:
    async def reply(request: Any, exchange: int) -> tuple[bytes, bool]:
        return _plain(_body(request)), False

    async with RawNode(reply, host="::1") as node, JsonRpcClient(node.url) as client:
        assert await client.request("eth_chainId") == "0x1"
    assert node.url.startswith("http://[::1]:")
    assert f"host: {node.url[len('http://') : -1]}" in node.heads[0].decode().lower()


async def test_an_exchange_past_its_timeout_is_unavailable_and_its_connection_closed() -> None:
    """The node answers its first request never: the exchange ends at ``timeout_s``,
    the connection with it (the node sees it close), and the next request goes on a
    new one."""
    never = asyncio.Event()

    async def reply(request: Any, exchange: int) -> tuple[bytes, bool]:
        if len(node.requests) == 1:
            await never.wait()
        return _plain(_body(request)), False

    async with RawNode(reply) as node, JsonRpcClient(node.url, timeout_s=0.2) as client:
        with pytest.raises(RpcError) as caught:
            await client.request("eth_sendRawTransaction", ["0x02"])
        assert caught.value.kind is RpcErrorKind.UNAVAILABLE
        assert f"the node at {node.url} did not answer within 0.2 s" in caught.value.message
        assert await client.request("eth_chainId") == "0x2"
        assert node.connections == 2
        never.set()
    assert len(node.requests) == 2


def _tls_server(leaf: Leaf) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(leaf.cert, leaf.key)
    return context


async def test_an_https_node_is_verified_against_the_trusted_authorities(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hosted node is https: its certificate is checked against the system's
    authorities (here the tests' CA, named by SSL_CERT_FILE as on any machine); one
    signed by another authority is refused before a request is sent."""
    pki = make_pki(tmp_path / "pki")
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))

    async def handler(request: Any) -> tuple[int, bytes]:
        return 200, each(request, lambda r: answer(r, "0x2a"))

    trusted = ScriptedRpcServer(handler, tls=_tls_server(pki.server))
    async with trusted as server, JsonRpcClient(server.url) as client:
        assert server.url.startswith("https://127.0.0.1:")
        assert await client.request("eth_blockNumber") == "0x2a"
        assert await client.request("eth_blockNumber") == "0x2a"
    assert len(trusted.requests) == 2

    stranger = ScriptedRpcServer(handler, tls=_tls_server(pki.stranger))
    async with stranger as server, JsonRpcClient(server.url) as client:
        with pytest.raises(RpcError) as caught:
            await client.request("eth_blockNumber")
    assert caught.value.kind is RpcErrorKind.UNAVAILABLE
    assert "cannot reach the node at https://127.0.0.1:" in caught.value.message
    assert "CERTIFICATE_VERIFY_FAILED" in caught.value.message
    assert stranger.requests == []
