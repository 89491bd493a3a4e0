"""blockx-proxy configuration, read from the environment.

Each variable is declared once below with its default, rule and help.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Final

import msgspec

from blockx_core.addr import InvalidAddress, split_host_port
from blockx_core.errors import InvalidConfig
from blockx_core.registry import (
    LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,
    LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX,
    PROD_DEFAULT_BUNDLE_WORKER_REGISTRY_PREFIX,
)
from blockx_server.etcd.security import read_etcd_security
from blockx_server.etcd.watcher import EtcdWatcherConfig
from blockx_server.runtime.connection_limits import (
    GRPC_LIMIT_SETTINGS,
    GrpcLimits,
    read_grpc_limits,
)
from blockx_server.runtime.env import ConfigReader, Environ, EnvironSource
from blockx_server.runtime.event_loop import EVENT_LOOP, EventLoop
from blockx_server.runtime.settings import (
    ETCD_ENDPOINTS,
    ETCD_SECURITY_SETTINGS,
    GRPC_TLS_SETTINGS,
    LOG_LEVEL,
    InvalidValue,
    Setting,
    integer,
    items,
)
from blockx_server.runtime.tls import GrpcTls, read_grpc_tls

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
    # Concurrent calls per upstream connection before another opens (BlockX servers
    # accept 1,000 on one connection; a plain grpclib server 100).
    max_streams_per_connection: int = 100
    connect_timeout_ms: int = 5000
    log_level: str = "INFO"
    event_loop: EventLoop = EventLoop.ASYNCIO
    grpc_limits: GrpcLimits = GrpcLimits()
    # worker.v1 calls go only to these addresses (PROXY_ALLOWED_WORKERS) ...
    allowed_workers: tuple[str, ...] = ()
    # ... or, when that list is empty, to the Workers registered where this watches.
    registry: EtcdWatcherConfig | None = None
    # GRPC_TLS_*: the upstream channels' TLS (the Unix socket itself is plaintext).
    grpc_tls: GrpcTls = GrpcTls()


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


def _upstream_addresses(raw: str) -> tuple[str, ...]:
    return tuple(_upstream_address(addr) for addr in items(raw))


ALLOWED_WORKERS: Final[Setting[tuple[str, ...]]] = Setting(
    name="PROXY_ALLOWED_WORKERS",
    default=(),
    parse=_upstream_addresses,
    help="comma-separated worker host:port the proxy forwards to; unset: the registered ones",
    shown_default="unset",
)
REGISTRY_PREFIXES: Final[Setting[tuple[str, ...]]] = Setting(
    name="PROXY_REGISTRY_PREFIXES",
    default=(
        LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,
        LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX,
        PROD_DEFAULT_BUNDLE_WORKER_REGISTRY_PREFIX,
    ),
    parse=items,
    help="registry prefixes whose Workers the proxy forwards to (without PROXY_ALLOWED_WORKERS)",
)
ETCD_DIAL_TIMEOUT_MS: Final = Setting(
    name="PROXY_ETCD_DIAL_TIMEOUT_MS",
    default=5000,
    parse=integer(above=0),
    help="timeout of etcd calls",
)
ETCD_WATCH_RETRY_DELAY_MS: Final = Setting(
    name="PROXY_ETCD_WATCH_RETRY_DELAY_MS",
    default=1000,
    parse=integer(above=0),
    help="wait before reconnecting a failed list+watch of the registry",
)

SETTINGS: Final[tuple[Setting[Any], ...]] = (
    SOCKET_PATH,
    COORDINATOR_ADDR,
    BUNDLE_COORDINATOR_ADDR,
    SYNC_INVOKER_ADDR,
    MAX_UPSTREAMS,
    MAX_STREAMS_PER_CONNECTION,
    CONNECT_TIMEOUT_MS,
    ALLOWED_WORKERS,
    REGISTRY_PREFIXES,
    ETCD_ENDPOINTS,
    *ETCD_SECURITY_SETTINGS,
    ETCD_DIAL_TIMEOUT_MS,
    ETCD_WATCH_RETRY_DELAY_MS,
    *GRPC_TLS_SETTINGS,
    LOG_LEVEL,
    EVENT_LOOP,
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
    allowed = reader.get(ALLOWED_WORKERS)
    return ProxyConfig(
        socket_path=socket_path or "",
        coordinator_addr=reader.get(COORDINATOR_ADDR),
        bundle_coordinator_addr=reader.get(BUNDLE_COORDINATOR_ADDR),
        sync_invoker_addr=reader.get(SYNC_INVOKER_ADDR),
        max_upstreams=reader.get(MAX_UPSTREAMS),
        max_streams_per_connection=reader.get(MAX_STREAMS_PER_CONNECTION),
        connect_timeout_ms=reader.get(CONNECT_TIMEOUT_MS),
        allowed_workers=allowed,
        registry=_read_registry(reader, watch=not allowed),
        grpc_tls=read_grpc_tls(reader, serves=False),
        log_level=reader.get(LOG_LEVEL),
        event_loop=reader.get(EVENT_LOOP),
        grpc_limits=read_grpc_limits(reader),
    )


def _read_registry(reader: ConfigReader, *, watch: bool) -> EtcdWatcherConfig | None:
    """Where the registered Workers are read from; None with a fixed allow-list."""
    prefixes = reader.get(REGISTRY_PREFIXES)
    registry = EtcdWatcherConfig(
        endpoints=reader.get(ETCD_ENDPOINTS),
        key_prefixes=prefixes,
        security=read_etcd_security(reader),
        dial_timeout_ms=reader.get(ETCD_DIAL_TIMEOUT_MS),
        retry_delay_ms=reader.get(ETCD_WATCH_RETRY_DELAY_MS),
    )
    names = {"endpoints": ETCD_ENDPOINTS.name, "key_prefixes": REGISTRY_PREFIXES.name}
    if watch and reader.valid(*names.values()):
        try:
            registry.validate()
        except InvalidConfig as exc:
            reader.report(names.get(exc.field, exc.field), exc.rule)
    return registry if watch else None
