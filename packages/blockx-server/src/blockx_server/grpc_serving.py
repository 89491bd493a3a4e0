"""The grpclib server every long-running BlockX service runs behind."""

from __future__ import annotations

from typing import Any

from grpclib.config import Configuration
from grpclib.health.check import ServiceStatus
from grpclib.health.service import Health
from grpclib.server import Server


def serving_server(
    service: Any, *, keepalive_time_ms: int, keepalive_timeout_ms: int
) -> tuple[Server, ServiceStatus]:
    """A server for ``service`` with grpc.health.v1 and HTTP/2 keepalive (which bounds
    how long a silent disconnect, e.g. of a Watch stream, goes unnoticed).

    The returned status starts NOT_SERVING; set it once the service is ready.
    """
    serving = ServiceStatus()
    serving.set(False)
    server = Server(
        [service, Health({service: [serving]})],
        config=Configuration(
            _keepalive_time=keepalive_time_ms / 1000,
            _keepalive_timeout=keepalive_timeout_ms / 1000,
            _keepalive_permit_without_calls=True,
        ),
    )
    return server, serving
