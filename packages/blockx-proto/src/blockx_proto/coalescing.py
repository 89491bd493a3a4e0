"""One socket write per event-loop iteration for a grpclib connection.

grpclib writes every HTTP/2 frame batch as soon as it is made: a unary answer is
a write for its headers, one for its message, one for its trailers, and reading a
request writes a WINDOW_UPDATE. On loopback each write is a full trip through the
kernel's TCP stack and often wakes the peer, which then reads a partial answer.
``CoalescingTransport`` keeps the bytes written during one iteration and sends
them together at the start of the next, so an answer leaves in one segment. It
holds at most ``MAX_PENDING_BYTES`` (more is sent at once); the real transport's
buffer and flow control are untouched.
"""

from __future__ import annotations

import asyncio
from asyncio import BaseTransport, Transport
from typing import Any, cast

from grpclib.client import Channel, Handler
from grpclib.protocol import H2Protocol

# About four HTTP/2 frames of the default size: large answers gain nothing from waiting.
MAX_PENDING_BYTES = 64 * 1024


class CoalescingTransport(Transport):
    """Wraps ``transport``: ``write`` gathers, the loop's next iteration sends."""

    def __init__(self, transport: Transport) -> None:
        super().__init__()
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))
        self._pending_bytes += len(data)
        if self._pending_bytes >= MAX_PENDING_BYTES:
            # A writer that never yields (a stream of messages) must meet the real
            # transport's buffer, and its pause_writing, as it goes.
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending.clear()
        self._pending_bytes = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()  # a GOAWAY written just before closing still leaves
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._pending_bytes = 0
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._pending_bytes

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()


def coalesced(transport: BaseTransport) -> BaseTransport:
    """``transport`` (the stream transport grpclib is given: TCP, UDS or TLS, from
    asyncio or uvloop, whose transports do not subclass ``asyncio.Transport``) wrapped."""
    return CoalescingTransport(cast(Transport, transport))


class CoalescingProtocol(H2Protocol):
    """grpclib's HTTP/2 protocol writing through a ``CoalescingTransport``."""

    def connection_made(self, transport: BaseTransport) -> None:
        super().connection_made(coalesced(transport))


class CoalescingChannel(Channel):
    """A grpclib ``Channel`` whose connections coalesce their writes."""

    def _protocol_factory(self) -> H2Protocol:
        # grpclib's own factory (grpclib/client.py), with the coalescing protocol.
        return CoalescingProtocol(Handler(), self._config, self._h2_config)
