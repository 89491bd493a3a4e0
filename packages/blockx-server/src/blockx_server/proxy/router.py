"""The routing server: one Unix socket, calls forwarded by gRPC method path.

* ``/coordinator.v1.CoordinatorService/*`` → the block Coordinator;
* ``/bundlecoordinator.v1.BundleCoordinatorService/*`` → the bundle Coordinator
  (UNAVAILABLE when none is configured);
* ``/syncinvoker.v1.SyncInvokerService/*`` → the Sync Invoker;
* ``/worker.v1.WorkerService/*`` → the worker named by ``x-blockx-worker-addr``;
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
import os
import socket
import stat
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, NamedTuple

from grpclib.client import Channel
from grpclib.client import Stream as UpstreamStream
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.metadata import encode_metadata
from grpclib.server import Server
from grpclib.server import Stream as CallerStream

from blockx_core.addr import InvalidAddress, split_host_port
from blockx_proto import bundlecoordinator_v1, coordinator_v1, syncinvoker_v1, worker_v1
from blockx_server.proxy.codec import PassThroughCodec, PassThroughStatusDetailsCodec
from blockx_server.proxy.config import ProxyConfig, validate_upstream_addr
from blockx_server.runtime.env import ConfigError
from blockx_server.runtime.process import stop_on_signals

log = logging.getLogger(__name__)

WORKER_ADDR_HEADER: Final = "x-blockx-worker-addr"
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

_CODEC: Final = PassThroughCodec()
_DETAILS_CODEC: Final = PassThroughStatusDetailsCodec()

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

    def __init__(self, max_upstreams: int, max_streams: int = 100) -> None:
        self._max_upstreams = max_upstreams
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
            channel = Channel(host, port, codec=_CODEC, status_details_codec=_DETAILS_CODEC)
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


class ProxyRouter:
    """The grpclib handler mapping: every routed method forwards raw bytes."""

    def __init__(self, config: ProxyConfig, routes: Mapping[str, Route] | None = None) -> None:
        self._addrs: dict[Upstream, str | None] = {
            Upstream.COORDINATOR: config.coordinator_addr,
            Upstream.BUNDLE_COORDINATOR: config.bundle_coordinator_addr,
            Upstream.SYNC_INVOKER: config.sync_invoker_addr,
        }
        self._connect_timeout = config.connect_timeout_ms / 1000
        self._routes = dict(generated_routes() if routes is None else routes)
        self.pool = ChannelPool(config.max_upstreams, config.max_streams_per_connection)

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
            return worker_addr_from(stream)
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


class _RoutingTable(dict[str, Handler]):
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


class ProxyServer:
    """The router on its Unix socket; ``async with ProxyServer(config):`` serves.

    At start a stale socket file is replaced (never a live one, nor a file that
    is not a socket); at exit the socket file is removed if it is still ours.
    """

    def __init__(self, config: ProxyConfig, routes: Mapping[str, Route] | None = None) -> None:
        self.config = config
        self.router = ProxyRouter(config, routes)
        self._server: Server | None = None
        self._socket_id: tuple[int, int] | None = None

    async def start(self) -> None:
        path = self.config.socket_path
        claim_socket_path(path)
        server = Server([self.router], codec=_CODEC, status_details_codec=_DETAILS_CODEC)
        # A private attribute of grpclib.server.Server (0.4.x); without it, unknown
        # paths still fail, as grpclib answers them (see _RoutingTable).
        if type(getattr(server, "_mapping", None)) is dict:
            server._mapping = _RoutingTable(server._mapping)
        await server.start(path=path)
        self._server = server
        st = os.stat(path)
        self._socket_id = (st.st_dev, st.st_ino)

    async def close(self) -> None:
        try:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
                self._server = None
        finally:
            self.router.close()
            self._remove_socket()

    def _remove_socket(self) -> None:
        if self._socket_id is None:
            return
        path, ours, self._socket_id = self.config.socket_path, self._socket_id, None
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            # Another process may have taken the path over since: leave its socket.
            if (st.st_dev, st.st_ino) == ours:
                os.unlink(path)

    async def __aenter__(self) -> ProxyServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def claim_socket_path(path: str) -> None:
    """Remove a stale socket at ``path``; ConfigError if the path is taken otherwise."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigError(
            "PROXY_SOCKET_PATH", f"names an existing file that is not a socket ({path!r})"
        )
    if _socket_answers(path):
        raise ConfigError("PROXY_SOCKET_PATH", f"is in use: another process listens on {path!r}")
    log.info("removing the stale socket %s", path)
    os.unlink(path)


def _socket_answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        # Non-blocking: a live listener with a full backlog must not hang start-up.
        sock.setblocking(False)
        try:
            sock.connect(path)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return True


async def serve(config: ProxyConfig, *, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGINT/SIGTERM when ``stop`` is None)."""
    stop = stop or stop_on_signals()
    async with ProxyServer(config):
        log.info(
            "blockx-proxy listening on %s: coordinator.v1 → %s, bundlecoordinator.v1 → %s, "
            "syncinvoker.v1 → %s, worker.v1 → the %s header",
            config.socket_path,
            config.coordinator_addr,
            config.bundle_coordinator_addr or "(not configured)",
            config.sync_invoker_addr,
            WORKER_ADDR_HEADER,
        )
        await stop.wait()
        log.info("shutting down")
