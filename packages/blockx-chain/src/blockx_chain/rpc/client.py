"""JsonRpcClient: an Ethereum JSON-RPC client over HTTP that batches by itself.

Requests made concurrently are gathered for a short window and sent as one
JSON-RPC batch of at most ``max_batch`` requests. The window is one event-loop turn
by default (everything ``asyncio.gather`` starts together, at no added latency for
a lone request); ``batch_window_s`` > 0 waits that long for stragglers instead.
Answers are matched to their requests by id. One ``HttpPool``
(``blockx_chain.rpc.http``) keeps connections alive between batches.

Every failure is an ``RpcError`` of a kind the caller can act on (see
``blockx_chain.rpc.errors``), and every request is answered or failed: an answer
the client cannot match to its request (an ``id`` that is not an integer, or no
request's, or given twice; a batch answer missing some) fails the requests left
without one UNAVAILABLE, and the client stays usable. One HTTP exchange lasts at
most ``timeout_s`` in all. An answer is streamed and cut off once it passes
``max_response_bytes``: a batch whose answer is too large is re-sent as two halves,
and so on down to single requests, so only the requests whose own answer is too
large fail (BAD_REQUEST), and a batch that was merely too large as a whole costs
two more exchanges, not one per request.
A ``null`` result is returned as ``None``; whether that is an error is the caller's
call (the typed helpers of ``blockx_chain.rpc.eth`` decide it).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any, Final, assert_never

import msgspec

from blockx_chain.rpc.answers import shown
from blockx_chain.rpc.errors import (
    RpcError,
    RpcErrorKind,
    classify_http_status,
    classify_node_error,
)
from blockx_chain.rpc.http import Answered, HttpPool, TimedOut, TooLarge, Unreachable

DEFAULT_MAX_RESPONSE_BYTES: Final = 32 * 1024 * 1024

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


class _TooLarge(Exception):
    pass


@dataclass
class _Pending:
    id: int
    method: str
    params: list[Any]
    answer: asyncio.Future[Any] = field(repr=False)


@dataclass
class RpcStats:
    """What the client sent: HTTP requests (one per batch) and JSON-RPC requests."""

    http_requests: int = 0
    rpc_requests: int = 0
    largest_batch: int = 0


class JsonRpcClient:
    def __init__(
        self,
        url: str,
        *,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_batch: int = 100,
        batch_window_s: float = 0.0,
        timeout_s: float = 30.0,
        max_connections: int = 16,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.url = url
        self.max_response_bytes = max_response_bytes
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.timeout_s = timeout_s
        self.stats = RpcStats()
        self._http = HttpPool(
            url,
            max_connections=max_connections,
            timeout_s=timeout_s,
            max_response_bytes=max_response_bytes,
        )
        self._ids = itertools.count(1)
        self._pending: list[_Pending] = []
        self._flush_handle: asyncio.Handle | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._closed = False

    async def __aenter__(self) -> JsonRpcClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        self._flush()
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        await self._http.aclose()

    async def request(self, method: str, params: list[Any] | None = None) -> Any:
        """The node's ``result`` for one request (``None`` for a JSON null)."""
        if self._closed:
            raise RpcError(RpcErrorKind.UNAVAILABLE, "the JSON-RPC client is closed")
        loop = asyncio.get_running_loop()
        pending = _Pending(next(self._ids), method, list(params or []), loop.create_future())
        self._pending.append(pending)
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._flush_handle is None:
            # The first request of a window arms its flush; later ones ride along.
            if self.batch_window_s > 0:
                self._flush_handle = loop.call_later(self.batch_window_s, self._flush)
            else:
                self._flush_handle = loop.call_soon(self._flush)
        return await pending.answer

    async def batch(self, calls: list[tuple[str, list[Any]]]) -> list[Any]:
        """Several requests at once, in as many JSON-RPC batches as ``max_batch``
        needs (with any request already waiting); the first failure is raised."""
        if self._closed:
            raise RpcError(RpcErrorKind.UNAVAILABLE, "the JSON-RPC client is closed")
        if not calls:
            return []
        loop = asyncio.get_running_loop()
        # The requests' futures directly: no task per request for thousands of them.
        pending = [_Pending(next(self._ids), m, list(p), loop.create_future()) for m, p in calls]
        for p in pending:
            # The first failure is raised below; the others count as seen, as
            # asyncio.gather's would (no "exception was never retrieved" later).
            p.answer.add_done_callback(_seen)
        self._pending.extend(pending)
        self._flush()
        return [await p.answer for p in pending]

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        while self._pending:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        try:
            await self._exchange(batch)
        finally:
            # Whatever happened (a cancellation, a bug), no caller is left waiting.
            _fail(
                batch,
                RpcError(RpcErrorKind.UNAVAILABLE, f"{batch[0].method}: the request was dropped"),
            )

    async def _exchange(self, batch: list[_Pending]) -> None:
        try:
            answers = await self._post(batch)
        except _TooLarge:
            if len(batch) > 1:
                # Find which answers are too large by halving.
                middle = len(batch) // 2
                await asyncio.gather(self._send(batch[:middle]), self._send(batch[middle:]))
                return
            _fail(
                batch,
                RpcError(
                    RpcErrorKind.BAD_REQUEST,
                    f"{batch[0].method}: the answer is larger than {self.max_response_bytes} "
                    "bytes (RPC_MAX_RESPONSE_BYTES); ask for less",
                    too_large=True,
                ),
            )
            return
        except RpcError as exc:
            _fail(batch, exc)
            return
        except Exception as exc:  # a bug here must not leave callers waiting forever
            _fail(batch, RpcError(RpcErrorKind.UNAVAILABLE, f"JSON-RPC request failed: {exc!r}"))
            return
        _resolve(batch, answers)

    async def _post(self, batch: list[_Pending]) -> list[Any]:
        bodies = [
            {"jsonrpc": "2.0", "id": p.id, "method": p.method, "params": p.params} for p in batch
        ]
        # A lone request goes as a plain object: every node accepts that.
        content = _encoder.encode(bodies if len(bodies) > 1 else bodies[0])
        self.stats.http_requests += 1
        self.stats.rpc_requests += len(batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        match await self._http.post(content):
            case Answered(status=status, body=body, retry_after=retry_after):
                pass
            case TooLarge():
                raise _TooLarge
            case Unreachable(detail=detail):
                raise RpcError(
                    RpcErrorKind.UNAVAILABLE, f"cannot reach the node at {self.url}: {detail}"
                )
            case TimedOut():
                raise RpcError(
                    RpcErrorKind.UNAVAILABLE,
                    f"the node at {self.url} did not answer within {self.timeout_s:g} s",
                )
            case unreachable:
                assert_never(unreachable)
        try:
            decoded = _decoder.decode(body)
        except msgspec.DecodeError:
            decoded = None
        except RecursionError:
            # A call tree hundreds of calls deep, or a hostile node's nesting: the
            # same answer comes again, so it is not retried.
            raise RpcError(
                RpcErrorKind.BAD_ANSWER,
                f"{batch[0].method}: the node at {self.url} answered JSON nested deeper "
                "than this client decodes",
            ) from None
        if status == 429 or status >= 500 or (status != 200 and not _is_rpc_answer(decoded)):
            raise RpcError(
                classify_http_status(status),
                f"the node at {self.url} answered HTTP {status}: {body[:200]!r}",
                http_status=status,
                retry_after_s=_seconds(retry_after),
            )
        if isinstance(decoded, dict):
            if decoded.get("id") is None and decoded.get("error") is not None:
                # An error for the whole batch (e.g. the node refuses batches).
                raise _node_error(batch[0].method, decoded["error"])
            return [decoded]
        if isinstance(decoded, list):
            return decoded
        raise RpcError(
            RpcErrorKind.UNAVAILABLE,
            f"the node at {self.url} answered something that is not JSON-RPC: {body[:200]!r}",
        )


def _seen(answer: asyncio.Future[Any]) -> None:
    if not answer.cancelled():
        answer.exception()


def _seconds(retry_after: str | None) -> float | None:
    """A Retry-After header's delay in seconds (the HTTP-date form is not read)."""
    if retry_after is None:
        return None
    try:
        seconds = float(retry_after.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86_400 else None


def _is_rpc_answer(decoded: Any) -> bool:
    if isinstance(decoded, list):
        return bool(decoded) and all(_is_rpc_answer(item) for item in decoded)
    return (
        isinstance(decoded, dict)
        and decoded.get("jsonrpc") == "2.0"
        and ("result" in decoded or isinstance(decoded.get("error"), dict))
    )


def _resolve(batch: list[_Pending], answers: list[Any]) -> None:
    """Give each request of ``batch`` the answer with its id. A request left without
    one fails UNAVAILABLE, saying what the node sent instead."""
    by_id: dict[int, Any] = {}
    twice: set[int] = set()
    asked = {p.id for p in batch}
    strays = 0
    for answer in answers:
        id_ = answer.get("id") if isinstance(answer, dict) else None
        # Only the integers this client sent: not a list, an object, a float, a bool.
        if type(id_) is not int or id_ not in asked:
            strays += 1
        elif id_ in by_id:
            twice.add(id_)
        else:
            by_id[id_] = answer
    for pending in batch:
        if pending.answer.done():
            continue
        answer = by_id.get(pending.id)
        if answer is None or pending.id in twice:
            how = "answers this request twice" if pending.id in twice else "has no answer to it"
            pending.answer.set_exception(
                RpcError(
                    RpcErrorKind.UNAVAILABLE,
                    f"{pending.method}: the node's reply {how} ({len(answers)} answers to "
                    f"{len(batch)} requests, {strays} with an id that is no request's)",
                )
            )
            continue
        error = answer.get("error")
        if error is not None:
            pending.answer.set_exception(_node_error(pending.method, error))
        else:
            pending.answer.set_result(answer.get("result"))


def _node_error(method: str, error: Any) -> RpcError:
    if not isinstance(error, dict):
        return RpcError(RpcErrorKind.UNAVAILABLE, f"{method}: malformed error {shown(error)}")
    code = error.get("code")
    code = code if type(code) is int else 0
    message = _one_line(str(error.get("message", "")))
    data = error.get("data")
    detail = "" if data in (None, "") else f" ({_one_line(shown(data))})"
    text = f"{method}: {message}{detail}"
    return RpcError(classify_node_error(code, message), text, code)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _fail(batch: list[_Pending], error: RpcError) -> None:
    for pending in batch:
        if not pending.answer.done():
            pending.answer.set_exception(error)
