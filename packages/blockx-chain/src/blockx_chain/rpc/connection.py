"""HttpConnection: one kept-alive HTTP/1.1 connection of ``HttpPool``
(``blockx_chain.rpc.http``), asyncio's transport for the bytes and h11 for the
protocol.

An exchange is one POST and its answer, bounded as the pool says (``AnswerTooLarge``
past ``max_bytes``, ``ExchangeFailed`` for anything the server gets wrong). A
connection that fails in an exchange is closed by the pool, never reused; one is
``reusable()`` only when both sides of h11 are idle and nothing came from the server
since its last answer (not even its closing).
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from typing import Final

import h11

from blockx_chain.rpc.errors import AnswerTooLarge, ExchangeFailed

# Bytes received and not yet parsed past which a connection stops reading (h11 bounds
# the answer's head itself, to 16 KiB by default).
_READ_PAUSE: Final = 256 * 1024


class HttpConnection(asyncio.Protocol):
    """One kept-alive connection: asyncio's transport for the bytes, h11 for the
    protocol. Received bytes are kept until an exchange reads them, so an idle
    connection knows whether the server sent anything or closed it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._h11 = h11.Connection(h11.CLIENT)
        self._transport: asyncio.Transport | None = None
        self._received: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._eof = False
        self._lost_by: Exception | None = None  # e.g. ConnectionResetError
        self._waiter: asyncio.Future[None] | None = None
        self.lost: asyncio.Future[None] = loop.create_future()

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._received.append(data)
        self._buffered += len(data)
        if self._buffered > _READ_PAUSE and self._transport is not None and not self._paused:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._lost_by = exc
        self._transport = None
        self._wake()
        if not self.lost.done():
            self.lost.set_result(None)

    # -- the exchange -----------------------------------------------------------------

    def reusable(self) -> bool:
        return (
            self._transport is not None
            and not self._transport.is_closing()
            and not self._eof
            and not self._received
            and self._h11.our_state is h11.IDLE
            and self._h11.their_state is h11.IDLE
        )

    def close(self) -> None:
        if self._transport is not None:
            # Nothing of an exchange is left to send: drop the connection at once.
            self._transport.abort()

    async def exchange(
        self, target: str, headers: list[tuple[bytes, bytes]], body: bytes, max_bytes: int
    ) -> tuple[int, str | None, bytes]:
        """(status, Retry-After, decoded body) of one POST."""
        h11c = self._h11
        request = h11.Request(
            method="POST",
            target=target,
            headers=[*headers, (b"content-length", b"%d" % len(body))],
        )
        assert self._transport is not None
        self._transport.write(
            b"".join(
                (
                    h11c.send(request) or b"",
                    h11c.send(h11.Data(data=body)) or b"",
                    h11c.send(h11.EndOfMessage()) or b"",
                )
            )
        )
        response = await self._next(h11.Response)
        assert isinstance(response, h11.Response)
        retry_after: str | None = None
        decoder: _Decoder | None = None
        for name, value in response.headers:
            if name == b"content-length" and int(value) > max_bytes:
                raise AnswerTooLarge
            if name == b"retry-after":
                retry_after = value.decode("latin-1")
            elif name == b"content-encoding":
                decoder = _Decoder.of(value)
        chunks: list[bytes] = []
        received = size = 0
        while True:
            event = await self._next(h11.Data, h11.EndOfMessage)
            if isinstance(event, h11.EndOfMessage):
                break
            assert isinstance(event, h11.Data)
            received += len(event.data)
            if received > max_bytes:
                raise AnswerTooLarge  # as received: e.g. endless empty deflate blocks
            data = event.data if decoder is None else decoder.feed(event.data, max_bytes - size)
            size += len(data)
            if size > max_bytes:
                raise AnswerTooLarge
            chunks.append(data)
        if decoder is not None:
            decoder.finish()
        if (
            h11c.our_state is h11.DONE
            and h11c.their_state is h11.DONE
            and not h11c.trailing_data[0]
        ):
            h11c.start_next_cycle()
        return response.status_code, retry_after, b"".join(chunks)

    async def _next(self, *wanted: type[h11.Event]) -> h11.Event:
        """The next event of the answer: one of ``wanted`` (an informational
        response such as 100 Continue is skipped)."""
        h11c = self._h11
        while True:
            try:
                event = h11c.next_event()
                if event is h11.NEED_DATA:
                    h11c.receive_data(await self._read())
                    continue
            except h11.RemoteProtocolError as exc:
                if self._eof:
                    raise self._ended() from None
                raise ExchangeFailed(f"malformed HTTP: {exc}") from None
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, wanted):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise self._ended()
            raise ExchangeFailed(f"unexpected {type(event).__name__} in the answer")

    def _ended(self) -> ExchangeFailed:
        how = "" if self._lost_by is None else f" ({self._lost_by!r})"
        return ExchangeFailed(f"the connection ended before the whole answer{how}")

    async def _read(self) -> bytes:
        """The bytes received since the last read; b"" once the server closed."""
        while not self._received and not self._eof:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = b"".join(self._received)
        self._received.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Decoder:
    """A gzip or deflate body, inflated no further than a bound."""

    def __init__(self, wbits: int) -> None:
        self._inflate = zlib.decompressobj(wbits)
        self._wbits = wbits
        self._started = False

    @classmethod
    def of(cls, encoding: bytes) -> _Decoder | None:
        match encoding.strip().lower():
            case b"gzip" | b"x-gzip":
                return cls(zlib.MAX_WBITS | 16)
            case b"deflate":
                return cls(zlib.MAX_WBITS)
            case b"identity" | b"":
                return None
            case _:
                raise ExchangeFailed(f"the answer is in an encoding not asked for: {encoding!r}")

    def feed(self, data: bytes, room: int) -> bytes:
        """At most ``room + 1`` decoded bytes (more than ``room`` means too large)."""
        try:
            out = self._inflate.decompress(data, room + 1)
        except zlib.error as exc:
            if self._started or self._wbits != zlib.MAX_WBITS:
                raise ExchangeFailed(f"the answer's compressed body is corrupt: {exc}") from None
            # "deflate" sent as a raw deflate stream, without zlib's wrapper.
            self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            self._wbits = -zlib.MAX_WBITS
            return self.feed(data, room)
        self._started = True
        return out

    def finish(self) -> None:
        if self._started and not self._inflate.eof:
            raise ExchangeFailed("the answer's compressed body ends early")
