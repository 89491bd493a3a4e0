"""Wiring of the proxy process: the routing handler (``service.py``) served on
one Unix socket, with the pass-through codecs (``codec.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Mapping

from grpclib.server import Server

from blockx_core.addr import WORKER_ADDR_HEADER
from blockx_proto.channel import PASS_THROUGH_DETAILS
from blockx_server.etcd.watcher import EtcdWorkerWatcher
from blockx_server.proxy.allowed import AllowedWorkers
from blockx_server.proxy.codec import PASS_THROUGH
from blockx_server.proxy.config import ProxyConfig
from blockx_server.proxy.service import ProxyRouter, Route, RoutingTable
from blockx_server.runtime.clock import SystemClock
from blockx_server.runtime.connection_limits import BoundedServer
from blockx_server.runtime.env import ConfigError
from blockx_server.runtime.process import stop_on_signals

log = logging.getLogger(__name__)


class ProxyServer:
    """The router on its Unix socket; ``async with ProxyServer(config):`` serves.

    At start a stale socket file is replaced (never a live one, nor a file that
    is not a socket); at exit the socket file is removed if it is still ours.
    Without a fixed allow-list, the registry is watched from start to close.
    """

    def __init__(self, config: ProxyConfig, routes: Mapping[str, Route] | None = None) -> None:
        self.config = config
        self.allowed = AllowedWorkers(config.allowed_workers)
        self.router = ProxyRouter(config, routes, self.allowed)
        self._server: Server | None = None
        self._socket_id: tuple[int, int] | None = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.config.registry is not None:
            watcher = EtcdWorkerWatcher(self.config.registry, self.allowed, SystemClock())
            self._watch = asyncio.create_task(watcher.run(), name="proxy registry watch")
        path = self.config.socket_path
        claim_socket_path(path)
        server = BoundedServer(
            [self.router],
            limits=self.config.grpc_limits,
            codec=PASS_THROUGH,
            status_details_codec=PASS_THROUGH_DETAILS,
        )
        # A private attribute of grpclib.server.Server (0.4.x); without it, unknown
        # paths still fail, as grpclib answers them (see RoutingTable).
        if type(getattr(server, "_mapping", None)) is dict:
            server._mapping = RoutingTable(server._mapping)
        await server.start(path=path)
        self._server = server
        st = os.stat(path)
        self._socket_id = (st.st_dev, st.st_ino)

    async def close(self) -> None:
        try:
            if self._watch is not None:
                self._watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._watch
                self._watch = None
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
            "syncinvoker.v1 → %s, worker.v1 → the %s header, if it names %s",
            config.socket_path,
            config.coordinator_addr,
            config.bundle_coordinator_addr or "(not configured)",
            config.sync_invoker_addr,
            WORKER_ADDR_HEADER,
            (
                "one of PROXY_ALLOWED_WORKERS"
                if config.registry is None
                else f"a Worker registered under {', '.join(config.registry.key_prefixes)}"
            ),
        )
        await stop.wait()
        log.info("shutting down")
