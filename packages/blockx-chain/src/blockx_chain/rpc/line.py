"""JsonRpcLine: one kept-alive HTTP/1.1 connection to a plain ``http://`` node, for
JSON-RPC batches sent strictly one after another.

The devnet mines block after block, each one exchange that must be answered before
the next is sent (the node mines a batch's ``evm_mine`` while it already runs the
batch's later requests, so two blocks never share an exchange). Through
``JsonRpcClient`` a block of five transactions costs about 0.3 ms of the client's
CPU (h11 and the batching futures); written straight to a socket and its answer
parsed by hand, about 0.16 ms, and on a shared machine those are the generation's
time. (The pool's h11 ``HttpConnection`` under this line costs about 0.1 ms more per
exchange than the hand parse, so the line keeps its own.)

It answers as ``JsonRpcClient.batch`` does (the same errors, each answer matched to
its request by id) and counts in that client's ``stats``. The answer is bounded:
its header by the stream's limit, its body by the client's ``max_response_bytes``,
the exchange by its ``timeout_s``. Any failure closes the connection; the line is
not reused after one (a request sent twice could send a transaction twice).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec

from blockx_chain.rpc.client import JsonRpcClient, _node_error
from blockx_chain.rpc.errors import RpcError, RpcErrorKind, classify_http_status

# The status line and headers of one answer.
_HEADER_LIMIT: Final = 64 * 1024

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


class JsonRpcLine:
    """``async with JsonRpcLine(client) as line: await line.batch([...])``."""

    def __init__(self, client: JsonRpcClient) -> None:
        parts = urlsplit(client.url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"a JSON-RPC line needs a plain http:// node, not {client.url}")
        self.client = client
        self._host = parts.hostname
        self._port = parts.port or 80
        target = parts.path or "/"
        self._head = (
            f"POST {target}{'?' + parts.query if parts.query else ''} HTTP/1.1\r\n"
            f"Host: {parts.netloc}\r\ncontent-type: application/json\r\n"
        ).encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._broken: str | None = None

    async def __aenter__(self) -> JsonRpcLine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def batch(self, calls: list[tuple[str, list[Any]]]) -> list[Any]:
        """The results of ``calls``, sent as one JSON-RPC batch; the first failure is
        raised."""
        if self._broken is not None:
            raise RpcError(RpcErrorKind.UNAVAILABLE, f"the JSON-RPC line failed: {self._broken}")
        if not calls:
            return []
        first = self.client.stats.rpc_requests + 1
        body = _encoder.encode(
            [
                {"jsonrpc": "2.0", "id": first + i, "method": method, "params": params}
                for i, (method, params) in enumerate(calls)
            ]
        )
        stats = self.client.stats
        stats.http_requests += 1
        stats.rpc_requests += len(calls)
        stats.largest_batch = max(stats.largest_batch, len(calls))
        try:
            async with asyncio.timeout(self.client.timeout_s):
                status, answer = await self._exchange(body)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise await self._fail(
                RpcErrorKind.UNAVAILABLE, f"cannot reach the node at {self.client.url}: {exc!r}"
            ) from None
        except TimeoutError:
            raise await self._fail(
                RpcErrorKind.UNAVAILABLE,
                f"the node at {self.client.url} did not answer within {self.client.timeout_s:g} s",
            ) from None
        except RpcError as exc:
            raise await self._fail(exc.kind, exc.message) from None
        return await self._results(calls, first, status, answer)

    async def _exchange(self, body: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(
                self._host, self._port, limit=_HEADER_LIMIT
            )
        assert self._reader is not None
        self._writer.write(b"%scontent-length: %d\r\n\r\n%s" % (self._head, len(body), body))
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *headers = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise RpcError(
                RpcErrorKind.UNAVAILABLE,
                f"the node at {self.client.url} answered no HTTP status: {status_line[:200]!r}",
            )
        length: int | None = None
        for header in headers:
            name, _, value = header.partition(":")
            if name.strip().lower() == "content-length" and value.strip().isdigit():
                length = int(value.strip())
        if length is None:
            raise RpcError(
                RpcErrorKind.UNAVAILABLE,
                f"the node at {self.client.url} answered without a content-length",
            )
        if length > self.client.max_response_bytes:
            raise RpcError(
                RpcErrorKind.BAD_REQUEST,
                f"the answer is larger than {self.client.max_response_bytes} bytes "
                "(RPC_MAX_RESPONSE_BYTES); ask for less",
                too_large=True,
            )
        return int(parts[1]), await self._reader.readexactly(length)

    async def _results(
        self, calls: list[tuple[str, list[Any]]], first: int, status: int, body: bytes
    ) -> list[Any]:
        try:
            answers = _decoder.decode(body)
        except (msgspec.DecodeError, RecursionError):
            answers = None
        if status != 200:
            raise await self._fail(
                classify_http_status(status),
                f"the node at {self.client.url} answered HTTP {status}: {body[:200]!r}",
            )
        if isinstance(answers, dict) and answers.get("error") is not None:
            # An error for the whole batch (e.g. the node refuses batches).
            raise _node_error(calls[0][0], answers["error"])
        if not isinstance(answers, list):
            raise await self._fail(
                RpcErrorKind.UNAVAILABLE,
                f"the node at {self.client.url} answered something that is not a JSON-RPC "
                f"batch answer: {body[:200]!r}",
            )
        by_id: dict[int, Any] = {}
        for answer in answers:
            id_ = answer.get("id") if isinstance(answer, dict) else None
            if type(id_) is int and first <= id_ < first + len(calls) and id_ not in by_id:
                by_id[id_] = answer
        results = []
        for i, (method, _params) in enumerate(calls):
            answer = by_id.get(first + i)
            if answer is None or len(answers) != len(calls):
                raise RpcError(
                    RpcErrorKind.UNAVAILABLE,
                    f"{method}: the node's reply has no single answer to it ({len(answers)} "
                    f"answers to {len(calls)} requests)",
                )
            if answer.get("error") is not None:
                raise _node_error(method, answer["error"])
            results.append(answer.get("result"))
        return results

    async def _fail(self, kind: RpcErrorKind, message: str) -> RpcError:
        """The error, with the connection closed and the line marked broken."""
        self._broken = message
        await self.aclose()
        return RpcError(kind, message)
