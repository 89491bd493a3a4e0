"""The grpclib server every long-running BlockX service runs behind."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from grpclib.config import Configuration
from grpclib.encoding.proto import ProtoStatusDetailsCodec, _googleapis_available
from grpclib.health.check import ServiceStatus
from grpclib.health.service import Health
from grpclib.server import Server
from prometheus_client import CollectorRegistry

from blockx_server.runtime.connection_limits import BoundedServer, GrpcLimits
from blockx_server.runtime.metrics_http import start_metrics_server
from blockx_server.runtime.process import StartupError
from blockx_server.runtime.request_codec import REQUEST_CODEC
from blockx_server.runtime.tracing import trace_requests

if TYPE_CHECKING:
    from grpclib._typing import IServable


def bounded_server(
    handlers: Collection[IServable], *, limits: GrpcLimits, config: Configuration | None = None
) -> BoundedServer:
    """A grpclib server for ``handlers`` bounded by ``limits``, answering malformed
    requests INVALID_ARGUMENT (``request_codec``)."""
    server = BoundedServer(
        handlers,
        limits=limits,
        codec=REQUEST_CODEC,
        # What grpclib installs by default alongside its protobuf codec.
        status_details_codec=ProtoStatusDetailsCodec() if _googleapis_available() else None,
        config=config,
    )
    trace_requests(server)  # each handler sees the trace context its request carried
    return server


def serving_server(
    service: Any,
    *,
    keepalive_time_ms: int,
    keepalive_timeout_ms: int,
    limits: GrpcLimits,
) -> tuple[Server, ServiceStatus]:
    """A server for ``service`` with grpc.health.v1, HTTP/2 keepalive (which bounds
    how long a silent disconnect, e.g. of a Watch stream, goes unnoticed) and the
    connection ``limits``.

    The returned status starts NOT_SERVING; set it once the service is ready.
    """
    serving = ServiceStatus()
    serving.set(False)
    server = bounded_server(
        [service, Health({service: [serving]})],
        limits=limits,
        config=Configuration(
            _keepalive_time=keepalive_time_ms / 1000,
            _keepalive_timeout=keepalive_timeout_ms / 1000,
            _keepalive_permit_without_calls=True,
        ),
    )
    return server, serving


class ListenError(StartupError):
    """The process cannot listen where it is configured to; ``str()`` says where and why."""


class Endpoints(Protocol):
    """Where a process listens: the fields every BlockX server config has."""

    @property
    def listen_host(self) -> str: ...  # empty = every interface
    @property
    def listen_port(self) -> int: ...
    @property
    def prometheus_listen(self) -> tuple[str, int] | None: ...  # None = metrics off
    @property
    def prometheus_path(self) -> str: ...


@asynccontextmanager
async def listening(
    server: Server,
    endpoints: Endpoints,
    metrics: CollectorRegistry,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[None]:
    """``server`` (over TLS with ``tls``, see runtime/tls.py) and, when configured,
    the endpoint serving ``metrics``, for the body of the block. Leaving it closes
    both and waits for running handlers (grpclib cancels them)."""
    where = f"{endpoints.listen_host or '0.0.0.0'}:{endpoints.listen_port}"
    try:
        await server.start(endpoints.listen_host or None, endpoints.listen_port, ssl=tls)
    except OSError as exc:
        raise ListenError(f"cannot serve on {where}: {exc}") from None
    async with server:  # grpclib's exit: close(), then wait_closed()
        try:
            metrics_server = await start_metrics_server(
                metrics, endpoints.prometheus_listen, endpoints.prometheus_path
            )
        except OSError as exc:
            host, port = endpoints.prometheus_listen or ("", 0)
            raise ListenError(
                f"cannot serve metrics on {host or '0.0.0.0'}:{port}: {exc}"
            ) from None
        try:
            yield
        finally:
            if metrics_server is not None:
                metrics_server.close()
                await metrics_server.wait_closed()
