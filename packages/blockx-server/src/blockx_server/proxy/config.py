"""blockx-proxy configuration, read from the environment.

Each variable is declared once below with its default, rule and help.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Final

import msgspec

from blockx_core.addr import InvalidAddress, split_host_port
from blockx_server.runtime.connection_limits import (
    GRPC_LIMIT_SETTINGS,
    GrpcLimits,
    read_grpc_limits,
)
from blockx_server.runtime.env import ConfigReader, Environ, EnvironSource
from blockx_server.runtime.settings import (
    LOG_LEVEL,
    InvalidValue,
    Setting,
    integer,
)

# sun_path holds 108 bytes on Linux, the terminating NUL included.
MAX_SOCKET_PATH_BYTES: Final = 107


class ProxyConfig(msgspec.Struct, frozen=True, kw_only=True):
    socket_path: str
    coordinator_addr: str
    # None: bundlecoordinator.v1 calls are answered UNAVAILABLE.
    bundle_coordinator_addr: str | None
    sync_invoker_addr: str
    # Addresses with pooled connections (LRU: workers come and go).
    max_upstreams: int = 256
    # Concurrent calls per upstream connection: grpclib servers accept 100.
    max_streams_per_connection: int = 100
    connect_timeout_ms: int = 5000
    log_level: str = "INFO"
    grpc_limits: GrpcLimits = GrpcLimits()


def validate_upstream_addr(addr: str) -> str:
    """``addr`` when it is ``host:port`` with a host and a port in 1-65535.

    Raises InvalidAddress otherwise (the router uses it on the worker header too).
    """
    _, port = split_host_port(addr)
    if port == 0:
        raise InvalidAddress(f"{addr!r} has no valid port (1-65535)")
    return addr


def _upstream_address(raw: str) -> str:
    try:
        return validate_upstream_addr(raw)
    except InvalidAddress as exc:
        raise InvalidValue(f"must be host:port ({exc})") from None


def _optional_upstream_address(raw: str) -> str | None:
    return _upstream_address(raw)


def _socket_path(path: str) -> str | None:
    """A path a Unix socket can be bound at: short enough, in a directory that
    exists, and free or held by a (stale) socket."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise InvalidValue(
            f"is longer than {MAX_SOCKET_PATH_BYTES} bytes, the Unix socket limit ({path!r})"
        )
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InvalidValue(f"is in a directory that does not exist ({directory!r})")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if not stat.S_ISSOCK(mode):
        raise InvalidValue(f"names an existing file that is not a socket ({path!r})")
    return path


SOCKET_PATH: Final[Setting[str | None]] = Setting(
    name="PROXY_SOCKET_PATH",
    default=None,
    parse=_socket_path,
    help="the Unix socket to listen on; a stale socket file is replaced",
    shown_default="required",
)
COORDINATOR_ADDR: Final = Setting(
    name="PROXY_COORDINATOR_ADDR",
    default="127.0.0.1:8080",
    parse=_upstream_address,
    help="the block Coordinator (coordinator.v1)",
)
BUNDLE_COORDINATOR_ADDR: Final[Setting[str | None]] = Setting(
    name="PROXY_BUNDLE_COORDINATOR_ADDR",
    default=None,
    parse=_optional_upstream_address,
    help="the bundle Coordinator; unset: its calls get UNAVAILABLE",
)
SYNC_INVOKER_ADDR: Final = Setting(
    name="PROXY_SYNC_INVOKER_ADDR",
    default="127.0.0.1:9091",
    parse=_upstream_address,
    help="the Sync Invoker (syncinvoker.v1)",
)
MAX_UPSTREAMS: Final = Setting(
    name="PROXY_MAX_UPSTREAMS",
    default=256,
    parse=integer(at_least=1),
    help="upstream addresses with pooled connections (LRU)",
)
MAX_STREAMS_PER_CONNECTION: Final = Setting(
    name="PROXY_MAX_STREAMS_PER_CONNECTION",
    default=100,
    parse=integer(at_least=1),
    help="calls per upstream connection before another opens",
)
CONNECT_TIMEOUT_MS: Final = Setting(
    name="PROXY_CONNECT_TIMEOUT_MS",
    default=5000,
    parse=integer(at_least=1),
    help="connecting to an upstream for longer than this is UNAVAILABLE",
)

SETTINGS: Final[tuple[Setting[Any], ...]] = (
    SOCKET_PATH,
    COORDINATOR_ADDR,
    BUNDLE_COORDINATOR_ADDR,
    SYNC_INVOKER_ADDR,
    MAX_UPSTREAMS,
    MAX_STREAMS_PER_CONNECTION,
    CONNECT_TIMEOUT_MS,
    LOG_LEVEL,
    *GRPC_LIMIT_SETTINGS,
)


def load_proxy_config(environ: Environ) -> ProxyConfig:
    """Read and validate every variable; raise ConfigErrors naming every bad one."""
    reader = ConfigReader(EnvironSource(environ))
    config = read_proxy_config(reader)
    reader.finish()
    return config


def read_proxy_config(reader: ConfigReader) -> ProxyConfig:
    socket_path = reader.get(SOCKET_PATH)
    if socket_path is None and reader.valid(SOCKET_PATH.name):
        reader.report(SOCKET_PATH.name, "is required: the Unix socket the proxy listens on")
    return ProxyConfig(
        socket_path=socket_path or "",
        coordinator_addr=reader.get(COORDINATOR_ADDR),
        bundle_coordinator_addr=reader.get(BUNDLE_COORDINATOR_ADDR),
        sync_invoker_addr=reader.get(SYNC_INVOKER_ADDR),
        max_upstreams=reader.get(MAX_UPSTREAMS),
        max_streams_per_connection=reader.get(MAX_STREAMS_PER_CONNECTION),
        connect_timeout_ms=reader.get(CONNECT_TIMEOUT_MS),
        log_level=reader.get(LOG_LEVEL),
        grpc_limits=read_grpc_limits(reader),
    )
