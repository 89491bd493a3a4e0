"""What one client connection can make a grpclib server hold, and how it is bounded.

grpclib (0.4.x) has no server-side limit on a request message (grpclib issue #195),
no handshake timeout and no idle timeout. ``BoundedServer`` adds them on the
server's own classes, at the points where grpclib builds a connection:

* **Request message size.** A gRPC message starts with a 5-byte prefix carrying
  its length. Each stream's receive buffer is replaced by ``_MessageBuffer``,
  which reads that prefix and refuses a message longer than
  ``max_receive_bytes`` with RESOURCE_EXHAUSTED before its body is acknowledged.
  Until a byte is read it is not acknowledged either (grpclib acknowledges data
  as it is read), so HTTP/2 flow control holds what a client can push ahead to
  the stream and connection windows (4 MiB each, grpclib's defaults).
* **Concurrent streams.** SETTINGS_MAX_CONCURRENT_STREAMS is advertised as
  ``max_concurrent_streams``; h2 refuses a client that opens more.
* **Handshake timeout.** A connection that has not sent the HTTP/2 preface and
  its SETTINGS within ``handshake_timeout_ms`` is closed.
* **Idle timeout.** A connection with no open stream for ``idle_timeout_ms`` is
  sent GOAWAY and closed; grpclib clients reconnect on their next call.

Responses need nothing here: grpclib writes a message only as far as the
client's flow-control window allows and waits for the transport to drain, so a
client that never reads holds at most one message per stream in the server.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Collection
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import msgspec
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.encoding.base import CodecBase, StatusDetailsCodecBase
from grpclib.events import _DispatchServerEvents
from grpclib.exceptions import GRPCError
from grpclib.protocol import AbstractHandler, Buffer, EventsProcessor, H2Protocol
from grpclib.protocol import Stream as H2Stream
from grpclib.server import Handler, Server
from h2.config import H2Configuration
from h2.errors import ErrorCodes
from h2.events import RemoteSettingsChanged
from h2.settings import SettingCodes

from blockx_server.runtime.env import ConfigReader
from blockx_server.runtime.request_headers import (
    bad_binary_metadata,
    missing_pseudo_header,
    refuse,
    reset,
)
from blockx_server.runtime.settings import (
    GRPC_HANDSHAKE_TIMEOUT_MS,
    GRPC_IDLE_TIMEOUT_MS,
    GRPC_MAX_RECEIVE_BYTES,
    Setting,
)

if TYPE_CHECKING:
    from asyncio import BaseTransport

    from grpclib._typing import IServable
    from grpclib.const import Handler as MethodHandler

log = logging.getLogger(__name__)

MIB: Final = 1024 * 1024
_PREFIX_BYTES: Final = 5  # compressed flag (1 byte) + message length (4 bytes, big-endian)


class GrpcLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds every BlockX gRPC server applies to each client connection."""

    max_receive_bytes: int = 16 * MIB
    max_concurrent_streams: int = 1000
    idle_timeout_ms: int = 300_000
    handshake_timeout_ms: int = 10_000


# What every server program reads (and lists in --help) for its gRPC server.
GRPC_LIMIT_SETTINGS: Final[tuple[Setting[int], ...]] = (
    GRPC_MAX_RECEIVE_BYTES,
    GRPC_IDLE_TIMEOUT_MS,
    GRPC_HANDSHAKE_TIMEOUT_MS,
)


def read_grpc_limits(reader: ConfigReader) -> GrpcLimits:
    return GrpcLimits(
        max_receive_bytes=reader.get(GRPC_MAX_RECEIVE_BYTES),
        idle_timeout_ms=reader.get(GRPC_IDLE_TIMEOUT_MS),
        handshake_timeout_ms=reader.get(GRPC_HANDSHAKE_TIMEOUT_MS),
    )


def message_too_large(length: int, limit: int) -> GRPCError:
    return GRPCError(
        Status.RESOURCE_EXHAUSTED,
        f"the request message is {length} bytes; this server accepts at most {limit} "
        f"(GRPC_MAX_RECEIVE_BYTES)",
    )


class _MessageBuffer(Buffer):
    """A stream's receive buffer that refuses a gRPC message above ``limit`` bytes.

    grpclib reads each message as the 5-byte prefix, then the body; the prefix is
    checked before the body is read, so an oversized body is never buffered (nor
    acknowledged beyond the flow-control window).
    """

    def __init__(self, ack_callback: Callable[[int], None], limit: int) -> None:
        super().__init__(ack_callback)
        self._limit = limit
        self._at_prefix = True

    async def read(self, size: int) -> bytes:
        if size > self._limit:  # a read the prefix check did not see coming
            raise message_too_large(size, self._limit)
        data = await super().read(size)
        if self._at_prefix and len(data) == _PREFIX_BYTES:
            compressed, length = struct.unpack(">BI", data)
            if compressed:
                raise GRPCError(
                    Status.UNIMPLEMENTED,
                    "compressed messages are not supported: send the request uncompressed",
                )
            if length > self._limit:
                raise message_too_large(length, self._limit)
            self._at_prefix = False
        else:
            self._at_prefix = True
        return data


class _BoundedHandler(Handler):
    """grpclib's per-connection handler, giving each stream a ``_MessageBuffer`` and
    refusing headers grpclib would fail on (``request_headers``)."""

    def __init__(
        self,
        mapping: dict[str, MethodHandler],
        codec: CodecBase,
        status_details_codec: StatusDetailsCodecBase | None,
        dispatch: _DispatchServerEvents,
        limits: GrpcLimits,
    ) -> None:
        super().__init__(mapping, codec, status_details_codec, dispatch)
        self._limits = limits

    def accept(
        self, stream: H2Stream, headers: list[tuple[str, str]], release_stream: Callable[[], Any]
    ) -> None:
        # Called as the request's HEADERS arrive: no DATA has reached the buffer yet.
        assert stream.id is not None
        stream.buffer = _MessageBuffer(
            partial(stream.connection.ack, stream.id), self._limits.max_receive_bytes
        )
        if missing_pseudo_header(headers) is not None:
            reset(stream, release_stream)
            return
        problem = bad_binary_metadata(headers)
        if problem is not None:
            # Tracked as grpclib tracks its handlers, so that close() cancels it.
            self._tasks[stream] = self.loop.create_task(refuse(stream, release_stream, problem))
            return
        super().accept(stream, headers, release_stream)


class _TimedEventsProcessor(EventsProcessor):
    """grpclib's event processor, telling its connection when the handshake is done
    and when the last stream closes or a first one opens."""

    def __init__(self, handler: AbstractHandler, protocol: _BoundedProtocol) -> None:
        super().__init__(handler, protocol.connection)
        self._protocol = protocol

    def register(self, stream: H2Stream) -> Callable[[], None]:
        release = super().register(stream)
        self._protocol.stream_opened()

        def release_and_notify() -> None:
            release()
            if not self.streams:
                self._protocol.became_idle()

        return release_and_notify

    def process_remote_settings_changed(self, event: RemoteSettingsChanged) -> None:
        # The client's first SETTINGS frame follows its preface: the handshake is done.
        self._protocol.handshake_done()
        super().process_remote_settings_changed(event)


class _BoundedProtocol(H2Protocol):
    """One server connection with the handshake and idle timers of ``GrpcLimits``."""

    def __init__(
        self,
        handler: Handler,
        config: Configuration,
        h2_config: H2Configuration,
        limits: GrpcLimits,
    ) -> None:
        super().__init__(handler, config, h2_config)
        self._limits = limits
        self._handshaken = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: BaseTransport) -> None:
        super().connection_made(transport)
        h2_connection = self.connection._connection
        h2_connection.update_settings(
            {SettingCodes.MAX_CONCURRENT_STREAMS: self._limits.max_concurrent_streams}
        )
        self.connection.flush()
        self.processor = _TimedEventsProcessor(self.handler, self)
        self._arm(self._limits.handshake_timeout_ms, self._handshake_expired)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handshake_done(self) -> None:
        if not self._handshaken:
            self._handshaken = True
            self.became_idle()

    def stream_opened(self) -> None:
        self._disarm()

    def became_idle(self) -> None:
        if self._handshaken and not self.connection.is_closing():
            self._arm(self._limits.idle_timeout_ms, self._idle_expired)

    def _arm(self, delay_ms: int, callback: Callable[[], None]) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(delay_ms / 1000, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _handshake_expired(self) -> None:
        self._timer = None
        log.debug("closing a connection that sent no HTTP/2 preface in time")
        self.processor.close("HTTP/2 handshake timeout")

    def _idle_expired(self) -> None:
        self._timer = None
        if self.processor.streams or self.connection.is_closing():
            return
        log.debug("closing a connection idle for %d ms", self._limits.idle_timeout_ms)
        self.connection._connection.close_connection(error_code=ErrorCodes.NO_ERROR)
        self.connection.flush()
        self.processor.close("idle timeout")


class BoundedServer(Server):
    """A grpclib ``Server`` whose connections obey ``limits`` (see the module docstring)."""

    def __init__(
        self,
        handlers: Collection[IServable],
        *,
        limits: GrpcLimits,
        codec: CodecBase | None = None,
        status_details_codec: StatusDetailsCodecBase | None = None,
        config: Configuration | None = None,
    ) -> None:
        super().__init__(
            handlers, codec=codec, status_details_codec=status_details_codec, config=config
        )
        self.limits = limits

    def _protocol_factory(self) -> H2Protocol:
        # grpclib's own factory, with the bounded handler and protocol.
        self.__gc_step__()
        handler = _BoundedHandler(
            self._mapping,
            self._codec,
            self._status_details_codec,
            self.__dispatch__,
            self.limits,
        )
        self._handlers.add(handler)
        return _BoundedProtocol(handler, self._config, self._h2_config, self.limits)
