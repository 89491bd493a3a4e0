"""grpclib connections whose writes of one event-loop iteration leave in one send.

grpclib writes every HTTP/2 frame batch to the socket as soon as it is made: a
unary answer is three sends (HEADERS, DATA, trailing HEADERS), a request two,
and on loopback each send also wakes the peer, which then reads each part in an
iteration of its own. ``CoalescingTransport`` gathers what is written during one
iteration of the loop and sends it once, at the start of the next (``call_soon``),
so a unary answer is one send and one wake-up of the peer, and the frames of
many streams answered in the same iteration share it. The bytes, their order and
the flow control are grpclib's and h2's, unchanged: only when they are handed to
the kernel moves, by at most the rest of the current iteration.

What is gathered is handed on at once when it reaches ``FLUSH_AT_BYTES``: the
transport then pauses the protocol as soon as its own buffer is full, as it would
without coalescing, so a peer that does not read still holds a sender to its
high-water mark (plus at most ``FLUSH_AT_BYTES`` and a frame), never to all a
handler can produce before it yields.

``CoalescingProtocol`` is grpclib's ``H2Protocol`` over such a transport;
``CoalescingChannel`` is a client ``Channel`` whose connections use it, and a
server installs it from its ``_protocol_factory`` (``blockx_server.runtime``).
"""

from __future__ import annotations

import asyncio
from asyncio import BaseTransport, Transport
from typing import Any, Final, cast

from grpclib.client import Channel, Handler
from grpclib.protocol import H2Protocol

# Gathered writes reaching this size are handed to the transport at once.
FLUSH_AT_BYTES: Final = 64 * 1024


class CoalescingTransport:
    """A stream transport whose ``write`` calls of one loop iteration are sent as one.

    Everything but ``write``, ``writelines``, ``close``, ``abort`` and
    ``get_write_buffer_size`` is the wrapped transport's. ``close`` sends what is
    gathered first, as a transport's own ``close`` sends its buffer; ``abort``
    drops it, as ``abort`` drops the buffer."""

    __slots__ = ("_chunks", "_loop", "_scheduled", "_size", "_transport")

    def __init__(self, transport: Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._chunks: list[bytes] = []
        self._size = 0
        self._scheduled = False

    @property
    def wrapped(self) -> Transport:
        return self._transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._chunks.append(bytes(data))
        self._size += len(data)
        if self._size >= FLUSH_AT_BYTES:
            self.flush()  # the transport may pause the protocol now, as without us
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_soon)

    def writelines(self, chunks: Any) -> None:
        for data in chunks:
            self.write(data)

    def _flush_soon(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        """Send what was gathered (nothing once the transport is closing: its peer
        is gone or it was aborted, and a send would only be refused)."""
        if not self._chunks:
            return
        chunks, self._chunks = self._chunks, []
        self._size = 0
        if self._transport.is_closing():
            return
        self._transport.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._chunks.clear()
        self._size = 0
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingProtocol(H2Protocol):
    """grpclib's HTTP/2 protocol over a ``CoalescingTransport``."""

    def connection_made(self, transport: BaseTransport) -> None:
        loop = asyncio.get_running_loop()
        coalescing = CoalescingTransport(cast(Transport, transport), loop)
        super().connection_made(cast(Transport, coalescing))


class CoalescingChannel(Channel):
    """A grpclib client ``Channel`` whose connections coalesce their writes."""

    def _protocol_factory(self) -> H2Protocol:
        return CoalescingProtocol(Handler(), self._config, self._h2_config)
