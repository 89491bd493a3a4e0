"""How BlockX processes dial etcd: endpoint parsing, gRPC channel options, closing.

Shared by the Coordinator's registry watcher and the Worker's heartbeat
publisher, which both open a fresh ``aetcd.Client`` per connection attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

import aetcd

from blockx_core.addr import InvalidAddress, etcd_host_port, split_host_port
from blockx_core.errors import InvalidConfig

log = logging.getLogger(__name__)


_GRPC_OPTIONS: Final[Mapping[str, int]] = {
    "grpc.keepalive_permit_without_calls": 1,
    # By default grpc stops pinging after two pings without data: a quiet watch
    # would then never notice a dead peer.
    "grpc.http2.max_pings_without_data": 0,
    # Channels with the same target share subchannels (and their reconnect backoff)
    # through a global pool; each attempt wants a fresh connection of its own.
    "grpc.use_local_subchannel_pool": 1,
}


def grpc_options(keepalive_time_ms: int, keepalive_timeout_ms: int) -> dict[str, int]:
    """Channel options for ``aetcd.Client(options=...)``: ping every
    ``keepalive_time_ms`` and drop the connection when a ping is not answered within
    ``keepalive_timeout_ms``, so that a silent network loss fails the calls."""
    return {
        **_GRPC_OPTIONS,
        "grpc.keepalive_time_ms": keepalive_time_ms,
        "grpc.keepalive_timeout_ms": keepalive_timeout_ms,
        # grpc core waits for a keepalive ack up to this ping timeout (1 minute by
        # default once keepalive is on), not just keepalive_timeout_ms.
        "grpc.http2.ping_timeout_ms": keepalive_timeout_ms,
    }


def parse_endpoint(given: str) -> tuple[str, int]:
    """``(host, port)`` of an etcd endpoint: ``host:port``, ``[v6]:port`` or a bare
    host (port 2379); an ``http://`` or ``https://`` scheme is stripped (TLS is
    set by ``EtcdSecurity``, not by the scheme). Raises
    ``InvalidConfig("endpoints", ...)``. IPv6 hosts keep their brackets, as grpc
    wants them."""
    try:
        host, port = split_host_port(etcd_host_port(given))
    except InvalidAddress as exc:
        raise InvalidConfig("endpoints", f"{given!r} is not host:port ({exc})") from None
    if port == 0:
        raise InvalidConfig("endpoints", f"{given!r} has port 0")
    # grpc wants an IPv6 host in brackets.
    return (f"[{host}]" if ":" in host else host), port


async def close_quietly(client: aetcd.Client) -> None:
    """Close an aetcd client; a failure (the connection is already broken) is only logged."""
    try:
        await client.close()
    except Exception as exc:
        log.debug("closing an etcd client failed: %r", exc)
