"""Where RPCs go: straight to each address, or all through the UDS proxy.

With ``PROXY_SOCKET_PATH`` (or ``proxy_socket=``) every RPC goes over that Unix
socket, and worker.v1 calls carry the ``x-blockx-worker-addr`` header naming the
worker. Without it the client dials coordinators, workers and the Sync Invoker
directly, one pooled channel per address.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from grpclib.client import Channel

from blockx_client.errors import InvalidRequestError

WORKER_ADDR_HEADER: Final = "x-blockx-worker-addr"
_POOL_SIZE: Final = 256


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidRequestError(f"{addr!r} is not host:port")
    return host.strip("[]"), int(port)


class Transport:
    def __init__(self, proxy_socket: str | None = None) -> None:
        self._proxy_socket = proxy_socket
        self._proxy: Channel | None = None
        self._channels: OrderedDict[str, Channel] = OrderedDict()

    @property
    def proxied(self) -> bool:
        return self._proxy_socket is not None

    def channel(self, addr: str) -> Channel:
        """The channel for a coordinator or sync invoker address (the proxy's, if any)."""
        if self._proxy_socket is not None:
            if self._proxy is None:
                self._proxy = Channel(path=self._proxy_socket)
            return self._proxy
        channel = self._channels.get(addr)
        if channel is None:
            host, port = split_addr(addr)
            channel = Channel(host, port)
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

    def close(self) -> None:
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
