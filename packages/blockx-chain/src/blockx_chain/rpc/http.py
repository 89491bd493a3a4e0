"""HttpPool: POST requests to one HTTP/1.1 server over a few kept-alive connections.

What ``JsonRpcClient`` needs of HTTP and no more, on asyncio's transports with h11
(the sans-IO HTTP/1.1 parser httpx itself uses) for the protocol: importing it costs
a few milliseconds where httpx's stack cost about 40 at every start of the CLI, and
an exchange costs a fraction of the CPU.

- **Connections.** At most ``max_connections`` are open at once; a request that
  finds none free waits for one. An idle connection is reused, the most recently
  used first. One the server closed while it was idle, or sent anything on, is
  discarded before use, never sent on. After any failure in an exchange (and after
  an answer the server marks ``Connection: close``) the connection is closed.
- **Sent once.** The transport never re-sends a request whose bytes it wrote: a
  request could be a transaction.
- **Bounded.** The whole exchange (waiting for a connection, connecting, the
  answer's last byte) lasts at most ``timeout_s``. An answer whose declared
  ``content-length`` passes ``max_response_bytes`` is refused unread; one that
  passes it while streamed (as received, or as decoded from gzip or deflate) is
  cut off there: a decompression bomb is never inflated past the bound.
- **The URL.** ``http://`` or ``https://`` with any path and query; user and
  password in it go as Basic authorization; IPv6 literals; ports 80 and 443 by
  default. Proxy environment variables are not read: the node is dialled directly.
  The certificate authorities are loaded (about a fifth of a second) only for an
  ``https://`` node, at its first connection.

Each outcome is a value: ``Answered``, ``TooLarge``, ``Unreachable`` (cannot
connect, reset, malformed HTTP, closed mid-answer) or ``TimedOut``.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from typing import TYPE_CHECKING, Final
from urllib.parse import unquote, urlsplit

import h11
import msgspec

if TYPE_CHECKING:
    import ssl

# Bytes received and not yet parsed past which a connection stops reading (h11 bounds
# the answer's head itself, to 16 KiB by default).
_READ_PAUSE: Final = 256 * 1024


class Answered(msgspec.Struct, frozen=True, tag=True):
    status: int
    body: bytes
    # The Retry-After header as sent (a 429 or 503 may carry one).
    retry_after: str | None = None


class TooLarge(msgspec.Struct, frozen=True, tag=True):
    pass


class Unreachable(msgspec.Struct, frozen=True, tag=True):
    # What failed, e.g. "ConnectionRefusedError(111, 'Connect call failed ...')".
    detail: str


class TimedOut(msgspec.Struct, frozen=True, tag=True):
    pass


HttpOutcome = Answered | TooLarge | Unreachable | TimedOut


class _TooLarge(Exception):
    pass


class _Broken(Exception):
    """The server's side of the exchange failed (closed early, sent nonsense)."""


class HttpPool:
    def __init__(
        self,
        url: str,
        *,
        max_connections: int,
        timeout_s: float,
        max_response_bytes: int,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {url}")
        self.url = url
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        self._tls = scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        if parts.port is not None and parts.port != (443 if self._tls else 80):
            host = f"{host}:{parts.port}"
        headers = [
            (b"host", host.encode() if host.isascii() else host.encode("idna")),
            (b"content-type", b"application/json"),
            (b"accept-encoding", b"gzip, deflate"),
        ]
        if parts.username is not None or parts.password is not None:
            import base64

            user = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
            headers.append((b"authorization", b"Basic " + base64.b64encode(user.encode())))
        self._headers: Final = headers
        self._target: Final = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._ssl: ssl.SSLContext | None = None
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._closed = False

    async def post(self, body: bytes) -> HttpOutcome:
        """POST ``body``; the answer, or why there is none."""
        try:
            async with asyncio.timeout(self.timeout_s), self._slots:
                connection = await self._connection()
                try:
                    status, retry_after, answer = await connection.exchange(
                        self._target, self._headers, body, self.max_response_bytes
                    )
                except BaseException:
                    connection.close()  # mid-exchange: never reused
                    raise
                self._release(connection)
        except _TooLarge:
            return TooLarge()
        except TimeoutError:
            return TimedOut()
        except (OSError, _Broken, h11.RemoteProtocolError) as exc:
            return Unreachable(repr(exc))
        return Answered(status, answer, retry_after)

    async def aclose(self) -> None:
        """Close every connection (an exchange still under way fails)."""
        self._closed = True
        connections, self._idle = list(self._open), []
        for connection in connections:
            connection.close()
        await asyncio.gather(*(c.lost for c in connections))

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable():
                return connection
            connection.close()
        if self._closed:
            raise _Broken("the HTTP client is closed")
        loop = asyncio.get_running_loop()
        context = self._ssl_context() if self._tls else None
        _transport, connection = await loop.create_connection(
            lambda: _Connection(loop),
            self._host,
            self._port,
            ssl=context,
            server_hostname=self._host if context is not None else None,
        )
        self._open.add(connection)
        connection.lost.add_done_callback(lambda _: self._open.discard(connection))
        return connection

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            import ssl

            self._ssl = ssl.create_default_context()
        return self._ssl

    def _release(self, connection: _Connection) -> None:
        if not self._closed and connection.reusable():
            self._idle.append(connection)
        else:
            connection.close()


class _Connection(asyncio.Protocol):
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
                raise _TooLarge
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
                raise _TooLarge  # as received: e.g. endless empty deflate blocks
            data = event.data if decoder is None else decoder.feed(event.data, max_bytes - size)
            size += len(data)
            if size > max_bytes:
                raise _TooLarge
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
            event = h11c.next_event()
            if event is h11.NEED_DATA:
                h11c.receive_data(await self._read())
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, wanted):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise _Broken("the server closed the connection before its whole answer")
            raise _Broken(f"unexpected {type(event).__name__} in the answer")

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
                raise _Broken(f"the answer is in an encoding not asked for: {encoding!r}")

    def feed(self, data: bytes, room: int) -> bytes:
        """At most ``room + 1`` decoded bytes (more than ``room`` means too large)."""
        try:
            out = self._inflate.decompress(data, room + 1)
        except zlib.error as exc:
            if self._started or self._wbits != zlib.MAX_WBITS:
                raise _Broken(f"the answer's compressed body is corrupt: {exc}") from None
            # "deflate" sent as a raw deflate stream, without zlib's wrapper.
            self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            self._wbits = -zlib.MAX_WBITS
            return self.feed(data, room)
        self._started = True
        return out

    def finish(self) -> None:
        if self._started and not self._inflate.eof:
            raise _Broken("the answer's compressed body ends early")
