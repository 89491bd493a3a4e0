"""JsonRpcLine: batches one after another on one kept-alive connection, answered as
JsonRpcClient.batch answers, against a scripted node that misbehaves on purpose."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rpc_scripted import ScriptedRpcServer, answer, each, error

from blockx_chain.rpc import JsonRpcClient, RpcError, RpcErrorKind
from blockx_chain.rpc.line import JsonRpcLine


async def test_batches_go_one_after_another_on_one_connection() -> None:
    async def echo(request: Any) -> tuple[int, bytes]:
        return 200, each(request, lambda r: answer(r, [r["method"], *r["params"]]))

    async with ScriptedRpcServer(echo) as server, JsonRpcClient(server.url) as client:
        async with JsonRpcLine(client) as line:
            first = await line.batch([("a", [1]), ("b", [2])])
            second = await line.batch([("c", [])])
        assert first == [["a", 1], ["b", 2]]
        assert second == [["c"]]
        assert [len(r) for r in server.requests] == [2, 1]
        assert client.stats.http_requests == 2
        assert client.stats.rpc_requests == 3


async def test_answers_out_of_order_are_matched_by_id() -> None:
    async def reversed_answers(request: Any) -> tuple[int, bytes]:
        return 200, json.dumps([answer(r, r["method"]) for r in reversed(request)]).encode()

    async with (
        ScriptedRpcServer(reversed_answers) as server,
        JsonRpcClient(server.url) as client,
        JsonRpcLine(client) as line,
    ):
        assert await line.batch([("a", []), ("b", []), ("c", [])]) == ["a", "b", "c"]


async def test_a_node_error_names_its_request_and_the_line_goes_on() -> None:
    async def refuse_b(request: Any) -> tuple[int, bytes]:
        return 200, each(
            request,
            lambda r: error(r, -32000, "nonce too low") if r["method"] == "b" else answer(r, 1),
        )

    async with (
        ScriptedRpcServer(refuse_b) as server,
        JsonRpcClient(server.url) as client,
        JsonRpcLine(client) as line,
    ):
        with pytest.raises(RpcError) as failed:
            await line.batch([("a", []), ("b", [])])
        assert failed.value.kind is RpcErrorKind.BAD_REQUEST
        assert failed.value.message.startswith("b: ")
        assert "nonce too low" in failed.value.message
        assert await line.batch([("a", [])]) == [1]


@pytest.mark.parametrize(
    ("status", "body", "kind", "words"),
    [
        (200, b"[]", RpcErrorKind.UNAVAILABLE, "no single answer"),
        (200, b"not json", RpcErrorKind.UNAVAILABLE, "not a JSON-RPC batch answer"),
        (503, b"busy", RpcErrorKind.UNAVAILABLE, "HTTP 503"),
        (200, b"x" * 2048, RpcErrorKind.BAD_REQUEST, "larger than 1024 bytes"),
    ],
)
async def test_a_bad_answer_fails_the_batch_in_one_line(
    status: int, body: bytes, kind: RpcErrorKind, words: str
) -> None:
    async def bad(request: Any) -> tuple[int, bytes]:
        return status, body

    async with (
        ScriptedRpcServer(bad) as server,
        JsonRpcClient(server.url, max_response_bytes=1024) as client,
        JsonRpcLine(client) as line,
    ):
        with pytest.raises(RpcError) as failed:
            await line.batch([("a", []), ("b", [])])
        assert failed.value.kind is kind
        assert words in failed.value.message
        assert "\n" not in failed.value.message


async def test_a_broken_line_is_not_used_again() -> None:
    """A request is never sent twice: after a failed exchange the line refuses."""

    async def busy(request: Any) -> tuple[int, bytes]:
        return 503, b"busy"

    async with ScriptedRpcServer(busy) as server, JsonRpcClient(server.url) as client:
        async with JsonRpcLine(client) as line:
            with pytest.raises(RpcError):
                await line.batch([("a", [])])
            with pytest.raises(RpcError, match="the JSON-RPC line failed"):
                await line.batch([("a", [])])
        assert len(server.requests) == 1


async def test_a_closed_node_is_unavailable() -> None:
    async def never(request: Any) -> tuple[int, bytes]:
        raise AssertionError("not reached")

    async with ScriptedRpcServer(never) as server:
        url = server.url
    async with JsonRpcClient(url) as client, JsonRpcLine(client) as line:
        with pytest.raises(RpcError) as failed:
            await line.batch([("a", [])])
        assert failed.value.kind is RpcErrorKind.UNAVAILABLE
        assert "cannot reach the node" in failed.value.message


async def test_only_a_plain_http_node() -> None:
    async with JsonRpcClient("https://node.example/") as client:
        with pytest.raises(ValueError, match="plain http://"):
            JsonRpcLine(client)
