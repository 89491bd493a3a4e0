"""HttpPool: POST requests to one HTTP/1.1 server over a few kept-alive connections.

What ``JsonRpcClient`` needs of HTTP and no more: each connection is an
``HttpConnection`` (``blockx_chain.rpc.connection``), asyncio's transport with h11
(the sans-IO HTTP/1.1 parser httpx itself uses) for the protocol. It loads in a few
milliseconds, with the first connection, where httpx's stack took about 40 at every
start of the CLI, and an exchange costs a quarter of httpx's CPU.

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
from typing import TYPE_CHECKING, Final
from urllib.parse import unquote, urlsplit

import msgspec

from blockx_chain.rpc.errors import AnswerTooLarge, ExchangeFailed

if TYPE_CHECKING:
    import ssl

    from blockx_chain.rpc.connection import HttpConnection


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
        default_port = 443 if self._tls else 80
        self._port = parts.port or default_port
        host = f"[{self._host}]" if ":" in self._host else self._host
        if parts.port is not None and parts.port != default_port:
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
        self._idle: list[HttpConnection] = []
        self._open: set[HttpConnection] = set()
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
        except AnswerTooLarge:
            return TooLarge()
        except TimeoutError:
            return TimedOut()
        except ExchangeFailed as exc:
            return Unreachable(str(exc))
        except OSError as exc:
            return Unreachable(repr(exc))
        return Answered(status, answer, retry_after)

    async def aclose(self) -> None:
        """Close every connection (an exchange still under way fails)."""
        self._closed = True
        connections, self._idle = list(self._open), []
        for connection in connections:
            connection.close()
        await asyncio.gather(*(c.lost for c in connections))

    async def _connection(self) -> HttpConnection:
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable():
                return connection
            connection.close()
        if self._closed:
            raise ExchangeFailed("the HTTP client is closed")
        loop = asyncio.get_running_loop()
        context = self._ssl_context() if self._tls else None
        _transport, connection = await loop.create_connection(
            _connected,
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

    def _release(self, connection: HttpConnection) -> None:
        if not self._closed and connection.reusable():
            self._idle.append(connection)
        else:
            connection.close()


def _connected() -> HttpConnection:
    """The protocol of a connection just made: h11 is loaded with the first one (a
    few milliseconds a command that never reaches its node does without)."""
    from blockx_chain.rpc.connection import HttpConnection

    return HttpConnection(asyncio.get_running_loop())
