"""Where a server cannot listen is one line naming the address, for the gRPC port
and the metrics endpoint alike."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from grpclib.health.service import Health
from grpclib.server import Server
from prometheus_client import CollectorRegistry
from support import free_port

from blockx_server.runtime.process import StartupError
from blockx_server.runtime.serving import ListenError, listening


@dataclass(frozen=True)
class _Endpoints:
    listen_host: str
    listen_port: int
    prometheus_listen: tuple[str, int] | None = None
    prometheus_path: str = "/metrics"


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def test_a_taken_grpc_port_is_a_listen_error(taken: int) -> None:
    with pytest.raises(ListenError) as raised:
        async with listening(
            Server([Health()]), _Endpoints("127.0.0.1", taken), CollectorRegistry()
        ):
            pass
    assert isinstance(raised.value, StartupError)
    assert str(raised.value).startswith(f"cannot serve on 127.0.0.1:{taken}: ")
    assert "\n" not in str(raised.value)


async def test_a_taken_metrics_port_is_a_listen_error_and_closes_the_server(taken: int) -> None:
    port = free_port()
    server = Server([Health()])
    endpoints = _Endpoints("127.0.0.1", port, prometheus_listen=("127.0.0.1", taken))
    with pytest.raises(ListenError) as raised:
        async with listening(server, endpoints, CollectorRegistry()):
            pass
    assert str(raised.value).startswith(f"cannot serve metrics on 127.0.0.1:{taken}: ")
    # The gRPC port it had opened is free again.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
