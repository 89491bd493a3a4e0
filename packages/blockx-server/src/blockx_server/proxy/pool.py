"""ChannelPool: the proxy's upstream connections, shared by every caller."""

from __future__ import annotations

import contextlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Iterator
from ssl import SSLContext

from blockx_core.addr import split_host_port
from blockx_proto.channel import PASS_THROUGH_DETAILS, Channel
from blockx_server.proxy.codec import PASS_THROUGH

log = logging.getLogger(__name__)


class ChannelPool:
    """Pooled grpclib Channels (HTTP/2 connections) per upstream address.

    * Workers come and go: at most ``max_upstreams`` addresses are kept, the
      least recently used dropped first; a channel still carrying calls is
      closed when its last call ends.
    * Every caller shares these connections, and a grpclib server accepts
      ``max_streams`` (h2's default: 100) concurrent calls per connection; a
      call beyond that would wait for one to end (long WatchTasks streams may
      not end soon), so a busy address gets another connection instead.
    """

    def __init__(
        self, max_upstreams: int, max_streams: int = 100, ssl: SSLContext | None = None
    ) -> None:
        self._max_upstreams = max_upstreams
        # GRPC_TLS_*: verify each upstream against the CA, present our certificate.
        self._ssl = ssl
        self._max_streams = max_streams
        self._channels: OrderedDict[str, list[Channel]] = OrderedDict()
        self._calls: Counter[Channel] = Counter()
        self._evicted: set[Channel] = set()

    def __len__(self) -> int:
        """How many upstream addresses are pooled."""
        return len(self._channels)

    def __contains__(self, addr: object) -> bool:
        return addr in self._channels

    def connections(self, addr: str) -> int:
        return len(self._channels.get(addr, ()))

    @contextlib.contextmanager
    def lease(self, addr: str) -> Iterator[Channel]:
        """The least busy channel to ``addr`` for one call."""
        channels = self._channels.get(addr)
        if channels is None:
            channels = self._channels[addr] = []
            self._evict(keep=addr)
        else:
            self._channels.move_to_end(addr)
        channel = min(channels, key=self._calls.__getitem__, default=None)
        if channel is None or self._calls[channel] >= self._max_streams:
            host, port = split_host_port(addr)
            channel = Channel(
                host,
                port,
                codec=PASS_THROUGH,
                status_details_codec=PASS_THROUGH_DETAILS,
                ssl=self._ssl,
            )
            channels.append(channel)
        self._calls[channel] += 1
        try:
            yield channel
        finally:
            self._calls[channel] -= 1
            if self._calls[channel] <= 0:
                del self._calls[channel]
                if channel in self._evicted:
                    self._evicted.discard(channel)
                    channel.close()

    def _evict(self, keep: str) -> None:
        while len(self._channels) > self._max_upstreams:
            addr = next(iter(self._channels))
            if addr == keep:  # only with max_upstreams < 1, which config refuses
                return
            log.debug("dropping the pooled channels to %s (pool full)", addr)
            for channel in self._channels.pop(addr):
                if self._calls[channel] > 0:
                    self._evicted.add(channel)
                else:
                    channel.close()

    def close(self) -> None:
        for channels in self._channels.values():
            for channel in channels:
                channel.close()
        for channel in self._evicted:
            channel.close()
        self._channels.clear()
        self._evicted.clear()
