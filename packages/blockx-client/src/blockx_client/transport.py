"""Where RPCs go: straight to each address, or all through the UDS proxy.

With ``PROXY_SOCKET_PATH`` (or ``proxy_socket=``) every RPC goes over that Unix
socket, and worker.v1 calls carry the ``x-blockx-worker-addr`` header naming the
worker. Without it the client dials coordinators, workers and the Sync Invoker
directly, one pooled channel per address. Every unary call goes through
``Transport.unary``, which turns gRPC statuses and transport failures into the
client's errors: a gRPC status by its code, a transport failure as ConnectError,
which says whether the request can have reached the server (``connect_error``).
"""

from __future__ import annotations

import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from typing import Final, TypeVar

from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from blockx_client.errors import ConnectError, InvalidRequestError, UnavailableError, error_for
from blockx_client.setting import Setting, with_origin
from blockx_core.addr import WORKER_ADDR_HEADER, InvalidAddress, split_host_port
from blockx_proto.channel import Channel, lost_connection

_POOL_SIZE: Final = 256
# How long a silent peer may hold an open call or stream: ping interval and timeout.
DEFAULT_KEEPALIVE_S: Final = 5.0

T = TypeVar("T")


# Failures that can come after the request was sent: the connection broke mid-call
# (or went silent: a timeout cannot tell).
_LOST_MIDWAY: Final = (
    StreamTerminatedError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    TimeoutError,
)


def connect_error(where: str, exc: BaseException, setting: Setting | None = None) -> ConnectError:
    """A transport failure as the client's error. A refused connection, an unknown
    host or any other failure to connect means nothing reached ``where``; a reset or
    a stream cut midway means the server may have received (and acted on) the call.
    The message says where ``setting`` (the address dialled) came from."""
    midway = isinstance(exc, _LOST_MIDWAY)
    how = "lost the connection to" if midway else "cannot reach"
    detail = str(exc) or type(exc).__name__
    return ConnectError(
        with_origin(f"{how} {where}: {detail}", setting),
        may_have_reached=midway,
        setting=setting,
    )


def split_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) as the server parses it; InvalidRequestError if not."""
    try:
        return split_host_port(addr)
    except InvalidAddress as exc:
        raise InvalidRequestError(str(exc)) from None


def cut_off(exc: AttributeError) -> StreamTerminatedError:
    """grpclib's AttributeError for a call on a connection it had closed
    (``blockx_proto.channel``) as the error it stands for; any other AttributeError
    is a bug and is raised as it is."""
    if not lost_connection(exc):
        raise exc
    return StreamTerminatedError("Connection lost")


def keepalive_config(keepalive_s: float) -> Configuration:
    """HTTP/2 keepalive for a client channel: while a call or stream is open, ping
    every ``keepalive_s`` and close the connection when a ping goes unanswered for
    ``keepalive_s``. A peer cut off without a reset (a link down, a host gone) then
    fails its calls and streams instead of leaving them silent forever."""
    return Configuration(
        _keepalive_time=keepalive_s,
        _keepalive_timeout=keepalive_s,
        _keepalive_permit_without_calls=False,
        # A Watch stream sends nothing after its request: keep pinging regardless.
        _http2_max_pings_without_data=0,
        _http2_min_sent_ping_interval_without_data=keepalive_s,
    )


class Transport:
    def __init__(
        self,
        proxy_socket: str | None = None,
        tls: ssl.SSLContext | None = None,
        *,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        settings: Sequence[Setting] = (),
    ) -> None:
        """``settings``: where the addresses (and the proxy's socket) came from, for
        the errors about reaching them."""
        if not keepalive_s > 0:
            raise InvalidRequestError(f"keepalive_s must be positive, not {keepalive_s!r}")
        self._config = keepalive_config(keepalive_s)
        self._proxy_socket = proxy_socket
        # GRPC_TLS_*: every direct channel; the proxy's Unix socket stays plaintext.
        self._tls = tls
        self._proxy: Channel | None = None
        self._channels: OrderedDict[str, Channel] = OrderedDict()
        self._settings = {s.value: s for s in settings if s.value is not None}

    @property
    def proxied(self) -> bool:
        return self._proxy_socket is not None

    @property
    def proxy_socket(self) -> str | None:
        return self._proxy_socket

    def channel(self, addr: str) -> Channel:
        """The channel for a coordinator or sync invoker address (the proxy's, if any)."""
        if self._proxy_socket is not None:
            if self._proxy is None:
                self._proxy = Channel(path=self._proxy_socket, config=self._config)
            return self._proxy
        channel = self._channels.get(addr)
        if channel is None:
            host, port = split_addr(addr)
            channel = Channel(host, port, ssl=self._tls, config=self._config)
            self._channels[addr] = channel
            if len(self._channels) > _POOL_SIZE:
                _, evicted = self._channels.popitem(last=False)
                evicted.close()
        else:
            self._channels.move_to_end(addr)
        return channel

    def worker(self, addr: str) -> tuple[Channel, dict[str, str] | None]:
        """The channel and the per-call metadata for a worker.v1 call to ``addr``."""
        if self._proxy_socket is not None:
            split_addr(addr)  # refuse a malformed address before it reaches the proxy
            return self.channel(addr), {WORKER_ADDR_HEADER: addr}
        return self.channel(addr), None

    async def unary(self, addr: str, call: Awaitable[T]) -> T:
        """Await a unary call; gRPC statuses become BlockxErrors, transport failures
        ConnectError (``connect_error``)."""
        try:
            return await call
        except GRPCError as exc:
            raise error_for(exc.status, exc.message or "") from None
        except TimeoutError:
            raise UnavailableError(
                f"{addr} did not answer in time", Status.DEADLINE_EXCEEDED
            ) from None
        except (OSError, StreamTerminatedError) as exc:
            raise connect_error(self.describe(addr), exc, self.setting_of(addr)) from None
        except AttributeError as exc:
            lost = cut_off(exc)
            raise connect_error(self.describe(addr), lost, self.setting_of(addr)) from None

    def setting_of(self, addr: str) -> Setting | None:
        """The setting that named what a call to ``addr`` dials: the proxy's socket
        when proxied, else the address itself (None for a Worker's)."""
        return self._settings.get(self._proxy_socket or addr)

    def describe(self, addr: str) -> str:
        """How an error names where a call went."""
        if self._proxy_socket is None:
            return addr
        return f"the proxy at unix:{self._proxy_socket} (for {addr})"

    def close(self) -> None:
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
