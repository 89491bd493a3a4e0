"""Serving the dashboard with uvicorn on a socket bound here first, so a port in
use is one clear line (and port 0 a free port, printed)."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable

import uvicorn

from blockx_cli.dashboard.app import create_app
from blockx_cli.dashboard.config import DashboardConfig
from blockx_cli.launch import collect_cycles


class BindError(RuntimeError):
    """The address cannot be bound; ``str()`` is the line users see."""


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise BindError(f"port {port} on {host} is already in use (--port)") from None
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(
    config: DashboardConfig,
    host: str,
    port: int,
    *,
    on_listening: Callable[[str], None] = print,
    log_level: str = "warning",
) -> None:
    """Serve until SIGINT or SIGTERM; BindError when ``host:port`` cannot be bound."""
    sock = bind(host, port)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            log_level=log_level,
            access_log=False,
            server_header=False,
            lifespan="on",
        )
    )
    on_listening(url_of(sock))
    collect_cycles()
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()
