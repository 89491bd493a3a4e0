"""JsonRpcClient and EthRpc: batching and typed reads against a real anvil, and the
classification of every failure against a scripted misbehaving JSON-RPC server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio
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


async def test_an_oversized_answer_fails_only_its_own_request() -> None:
    async def handler(request: Any) -> tuple[int, bytes]:
        def one(r: dict[str, Any]) -> dict[str, Any]:
            return answer(r, "0x" + "ab" * 5000 if r["method"] == "eth_getCode" else "0x1")

        return 200, each(request, one)

    async with (
        ScriptedRpcServer(handler) as server,
        JsonRpcClient(server.url, max_response_bytes=4096) as client,
    ):
        answers: tuple[Any, Any] = await asyncio.gather(
            client.request("eth_chainId"),
            client.request("eth_getCode", ["0x" + "00" * 20, "latest"]),
            return_exceptions=True,
        )
    small, big = answers
    assert small == "0x1"
    assert isinstance(big, RpcError)
    assert big.kind is RpcErrorKind.BAD_REQUEST
    assert "larger than 4096 bytes" in big.message
    # The batch, then each request alone to find the one that is too large.
    assert [len(r) if isinstance(r, list) else 1 for r in server.requests] == [2, 1, 1]


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
