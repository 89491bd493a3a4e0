"""The routing handler: calls forwarded by gRPC method path.

* ``/coordinator.v1.CoordinatorService/*`` → the block Coordinator;
* ``/bundlecoordinator.v1.BundleCoordinatorService/*`` → the bundle Coordinator
  (UNAVAILABLE when none is configured);
* ``/syncinvoker.v1.SyncInvokerService/*`` → the Sync Invoker;
* ``/worker.v1.WorkerService/*`` → the worker named by ``x-blockx-worker-addr``,
  when ``AllowedWorkers`` allows it (else PERMISSION_DENIED, without connecting);
* anything else → UNIMPLEMENTED, naming the path.

Messages travel as bytes (``codec.py``): nothing is decoded or re-encoded. The
caller's deadline and metadata go upstream (minus the routing header); the
upstream's status, message, details and response metadata come back unchanged.
A client that goes away cancels its upstream call: grpclib cancels the handler
task and the upstream stream is reset on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

from grpclib.client import Channel
from grpclib.client import Stream as UpstreamStream
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.metadata import encode_metadata
from grpclib.server import Stream as CallerStream

from blockx_core.addr import WORKER_ADDR_HEADER, InvalidAddress
from blockx_proto import bundlecoordinator_v1, coordinator_v1, syncinvoker_v1, worker_v1
from blockx_proto.channel import lost_connection
from blockx_server.proxy.allowed import NOT_A_WORKER, AllowedWorkers
from blockx_server.proxy.config import ProxyConfig, validate_upstream_addr
from blockx_server.proxy.pool import ChannelPool

log = logging.getLogger(__name__)

MISSING_WORKER_ADDR: Final = (
    f"worker.v1 calls need the {WORKER_ADDR_HEADER} header naming the worker (host:port)"
)
NO_BUNDLE_COORDINATOR: Final = (
    "no bundle coordinator is configured on this proxy (set PROXY_BUNDLE_COORDINATOR_ADDR)"
)

# Request headers that describe this hop, not the call. grpclib already leaves
# pseudo-headers, grpc-*, te, content-type and user-agent out of the metadata.
_HOP_HEADERS: Final = frozenset(
    {
        WORKER_ADDR_HEADER,
        "accept-encoding",
        "connection",
        "host",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
    }
)

Metadata = list[tuple[str, str | bytes]]


class Upstream(enum.Enum):
    """Where a method's calls go; the value names it in error messages."""

    COORDINATOR = "block coordinator"
    BUNDLE_COORDINATOR = "bundle coordinator"
    SYNC_INVOKER = "sync invoker"
    WORKER = "worker"


class Route(NamedTuple):
    cardinality: Cardinality
    upstream: Upstream


def generated_routes() -> dict[str, Route]:
    """Every method of the generated services, with its cardinality and upstream."""
    services: list[tuple[Any, Upstream]] = [
        (coordinator_v1.CoordinatorServiceBase(), Upstream.COORDINATOR),
        (bundlecoordinator_v1.BundleCoordinatorServiceBase(), Upstream.BUNDLE_COORDINATOR),
        (syncinvoker_v1.SyncInvokerServiceBase(), Upstream.SYNC_INVOKER),
        (worker_v1.WorkerServiceBase(), Upstream.WORKER),
    ]
    return {
        path: Route(handler.cardinality, upstream)
        for service, upstream in services
        for path, handler in service.__mapping__().items()
    }


class ProxyRouter:
    """The grpclib handler mapping: every routed method forwards raw bytes."""

    def __init__(
        self,
        config: ProxyConfig,
        routes: Mapping[str, Route] | None = None,
        allowed: AllowedWorkers | None = None,
    ) -> None:
        self.allowed = allowed if allowed is not None else AllowedWorkers(config.allowed_workers)
        self._addrs: dict[Upstream, str | None] = {
            Upstream.COORDINATOR: config.coordinator_addr,
            Upstream.BUNDLE_COORDINATOR: config.bundle_coordinator_addr,
            Upstream.SYNC_INVOKER: config.sync_invoker_addr,
        }
        self._connect_timeout = config.connect_timeout_ms / 1000
        self._routes = dict(generated_routes() if routes is None else routes)
        self.pool = ChannelPool(
            config.max_upstreams,
            config.max_streams_per_connection,
            config.grpc_tls.client_context(),
        )

    def __mapping__(self) -> dict[str, Handler]:
        return {
            path: Handler(
                functools.partial(self._forward, path, route), route.cardinality, bytes, bytes
            )
            for path, route in self._routes.items()
        }

    def close(self) -> None:
        self.pool.close()

    def _target(self, upstream: Upstream, stream: CallerStream[bytes, bytes]) -> str:
        if upstream is Upstream.WORKER:
            worker = worker_addr_from(stream)
            if not self.allowed.allows(worker):
                # One answer for every address: nothing about it may show.
                raise GRPCError(Status.PERMISSION_DENIED, NOT_A_WORKER)
            return worker
        addr = self._addrs[upstream]
        if addr is None:
            raise GRPCError(Status.UNAVAILABLE, NO_BUNDLE_COORDINATOR)
        return addr

    async def _forward(self, path: str, route: Route, stream: CallerStream[bytes, bytes]) -> None:
        addr = self._target(route.upstream, stream)
        what = f"{route.upstream.value} {addr}"
        log.debug("%s → %s", path, what)
        trailing: Metadata = []
        with self.pool.lease(addr) as channel:
            try:
                await self._connect(channel, what)
                async with channel.request(
                    path,
                    route.cardinality,
                    bytes,
                    bytes,
                    deadline=stream.deadline,
                    metadata=forwarded_metadata(stream),
                ) as upstream:
                    try:
                        await _relay(stream, upstream, route.cardinality)
                    finally:
                        trailing = response_metadata(upstream.trailing_metadata)
            except GRPCError as exc:
                # The upstream's answer, passed on as it is (trailers included).
                await stream.send_trailing_metadata(
                    status=exc.status,
                    status_message=exc.message,
                    status_details=exc.details,
                    metadata=trailing,
                )
            # TimeoutError is an OSError: test it first. Here it can only be the
            # upstream call's deadline (the caller's), as connecting is done.
            except TimeoutError:
                _honour_other_cancellations()
                raise GRPCError(
                    Status.DEADLINE_EXCEEDED, f"{what} did not answer before the deadline"
                ) from None
            except StreamTerminatedError as exc:
                raise GRPCError(Status.UNAVAILABLE, f"lost the call to {what}: {exc}") from None
            except AttributeError as exc:
                if not lost_connection(exc):
                    raise
                raise GRPCError(Status.UNAVAILABLE, f"lost the call to {what}") from None
            except OSError as exc:
                raise GRPCError(Status.UNAVAILABLE, f"cannot reach {what}: {exc}") from None

    async def _connect(self, channel: Channel, what: str) -> None:
        """Connect first, so "unreachable" (UNAVAILABLE) stays apart from the deadline."""
        try:
            async with asyncio.timeout(self._connect_timeout):
                await channel.__connect__()
        except TimeoutError:
            log.warning("cannot reach %s: no connection within %.3g s", what, self._connect_timeout)
            raise GRPCError(
                Status.UNAVAILABLE,
                f"cannot reach {what}: no connection within {self._connect_timeout:g} s",
            ) from None
        except OSError as exc:
            log.warning("cannot reach %s: %s", what, exc)
            raise GRPCError(Status.UNAVAILABLE, f"cannot reach {what}: {exc}") from None


def _honour_other_cancellations() -> None:
    """Re-raise CancelledError if anyone but the upstream call's timer cancelled us.

    The upstream call's deadline timer turns the cancellation it causes into
    TimeoutError. grpclib's server arms a timer for the same deadline (and
    cancels handlers at shutdown); when that one fired too, the handler must end
    cancelled, so that grpclib answers DEADLINE_EXCEEDED itself instead of
    logging "Failed to handle cancellation".
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 1:
        raise asyncio.CancelledError


async def _relay(
    caller: CallerStream[bytes, bytes],
    upstream: UpstreamStream[bytes, bytes],
    cardinality: Cardinality,
) -> None:
    """Requests caller → upstream, then replies upstream → caller as they arrive."""
    pump: asyncio.Task[None] | None = None
    if cardinality.client_streaming:
        await upstream.send_request()
        pump = asyncio.create_task(_pump_requests(caller, upstream))
    else:
        request = await caller.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "a unary call needs one request message")
        await upstream.send_message(request, end=True)
    try:
        await upstream.recv_initial_metadata()
        await caller.send_initial_metadata(metadata=response_metadata(upstream.initial_metadata))
        async for reply in upstream:
            await caller.send_message(reply)
        if pump is not None:
            # The upstream's trailers can only be read once our side has ended.
            await pump
        await upstream.recv_trailing_metadata()
    finally:
        if pump is not None and not pump.done():
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
    await caller.send_trailing_metadata(metadata=response_metadata(upstream.trailing_metadata))


async def _pump_requests(
    caller: CallerStream[bytes, bytes], upstream: UpstreamStream[bytes, bytes]
) -> None:
    async for request in caller:
        await upstream.send_message(request)
    await upstream.end()


def worker_addr_from(stream: CallerStream[bytes, bytes]) -> str:
    """The worker a worker.v1 call names, or INVALID_ARGUMENT saying what is wrong."""
    values = stream.metadata.getall(WORKER_ADDR_HEADER, []) if stream.metadata else []
    if not values:
        raise GRPCError(Status.INVALID_ARGUMENT, MISSING_WORKER_ADDR)
    if len(values) > 1:
        raise GRPCError(
            Status.INVALID_ARGUMENT,
            f"{WORKER_ADDR_HEADER} is given {len(values)} times; name exactly one worker",
        )
    value = values[0]
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    try:
        return validate_upstream_addr(text.strip())
    except InvalidAddress as exc:
        raise GRPCError(
            Status.INVALID_ARGUMENT, f"{WORKER_ADDR_HEADER} must be host:port: {exc}"
        ) from None


def forwarded_metadata(stream: CallerStream[bytes, bytes]) -> Metadata:
    """The caller's metadata minus this hop's own headers and the routing header."""
    if stream.metadata is None:
        return []
    return _sendable(
        (key, value) for key, value in stream.metadata.items() if key not in _HOP_HEADERS
    )


def response_metadata(metadata: Mapping[str, str | bytes] | None) -> Metadata:
    """The upstream's response metadata, to send on to the caller."""
    return _sendable(metadata.items()) if metadata is not None else []


def _sendable(pairs: Iterable[tuple[str, str | bytes]]) -> Metadata:
    """The pairs grpclib can send: a peer may have sent keys or values grpclib would
    refuse to encode, and one such entry must not fail the call."""
    kept: Metadata = []
    for key, value in pairs:
        try:
            encode_metadata([(key, value)])
        except (TypeError, ValueError):
            log.debug("dropping metadata %r that cannot be sent on", key)
            continue
        kept.append((key, value))
    return kept


class RoutingTable(dict[str, Handler]):
    """The server's handler table, answering UNIMPLEMENTED for a path it lacks.

    grpclib's own answer to an unknown path has no content-type, which grpclib
    and grpc-go clients report as UNKNOWN "Missing content-type header"; a
    handler's answer carries one. grpclib looks handlers up with ``.get(path)``.
    """

    def get(self, path: str, default: Any = None) -> Any:
        handler = super().get(path)
        if handler is not None:
            return handler
        return Handler(
            functools.partial(_unimplemented, path), Cardinality.UNARY_UNARY, bytes, bytes
        )


async def _unimplemented(path: str, stream: CallerStream[bytes, bytes]) -> None:
    raise GRPCError(
        Status.UNIMPLEMENTED,
        f"{path} is not routed by blockx-proxy (it routes coordinator.v1, "
        "bundlecoordinator.v1, syncinvoker.v1 and worker.v1)",
    )
