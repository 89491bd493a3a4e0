"""blockx-proxy configuration, read from the environment.

| Variable | Default | Meaning |
| --- | --- | --- |
| PROXY_SOCKET_PATH | (required) | Unix socket to listen on; a stale socket file is replaced |
| PROXY_COORDINATOR_ADDR | 127.0.0.1:8080 | block Coordinator (coordinator.v1) |
| PROXY_BUNDLE_COORDINATOR_ADDR | (unset) | bundle Coordinator; unset: its calls get UNAVAILABLE |
| PROXY_SYNC_INVOKER_ADDR | 127.0.0.1:9091 | Sync Invoker (syncinvoker.v1) |
| PROXY_MAX_UPSTREAMS | 256 | upstream addresses with pooled connections (LRU) |
| PROXY_MAX_STREAMS_PER_CONNECTION | 100 | calls per upstream connection before another opens |
| PROXY_CONNECT_TIMEOUT_MS | 5000 | connecting to an upstream longer than this: UNAVAILABLE |
| BLOCKX_LOG_LEVEL | INFO | DEBUG, INFO, WARNING or ERROR |
"""

from __future__ import annotations

import os
import stat
from typing import Final

import msgspec

from blockx_core.addr import InvalidAddress, split_host_port
from blockx_server.runtime.env import (
    ConfigError,
    Environ,
    env_int_at_least,
    env_log_level,
    env_optional,
    env_str,
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


def load_proxy_config(environ: Environ) -> ProxyConfig:
    """Read and validate every variable; raise ConfigError naming the first bad one."""
    socket_path = _socket_path(environ)
    coordinator = _upstream_addr(environ, "PROXY_COORDINATOR_ADDR", "127.0.0.1:8080")
    bundle_raw = env_optional(environ, "PROXY_BUNDLE_COORDINATOR_ADDR")
    bundle = (
        _upstream_addr(environ, "PROXY_BUNDLE_COORDINATOR_ADDR", bundle_raw)
        if bundle_raw is not None
        else None
    )
    sync_invoker = _upstream_addr(environ, "PROXY_SYNC_INVOKER_ADDR", "127.0.0.1:9091")
    return ProxyConfig(
        socket_path=socket_path,
        coordinator_addr=coordinator,
        bundle_coordinator_addr=bundle,
        sync_invoker_addr=sync_invoker,
        max_upstreams=env_int_at_least(environ, "PROXY_MAX_UPSTREAMS", 256, 1),
        max_streams_per_connection=env_int_at_least(
            environ, "PROXY_MAX_STREAMS_PER_CONNECTION", 100, 1
        ),
        connect_timeout_ms=env_int_at_least(environ, "PROXY_CONNECT_TIMEOUT_MS", 5000, 1),
        log_level=env_log_level(environ),
    )


def validate_upstream_addr(addr: str) -> str:
    """``addr`` when it is ``host:port`` with a host and a port in 1-65535.

    Raises InvalidAddress otherwise (the router uses it on the worker header too).
    """
    _, port = split_host_port(addr)
    if port == 0:
        raise InvalidAddress(f"{addr!r} has no valid port (1-65535)")
    return addr


def _upstream_addr(environ: Environ, name: str, default: str) -> str:
    raw = env_str(environ, name, default)
    try:
        return validate_upstream_addr(raw)
    except InvalidAddress as exc:
        raise ConfigError(name, f"must be host:port ({exc})") from None


def _socket_path(environ: Environ) -> str:
    name = "PROXY_SOCKET_PATH"
    path = env_optional(environ, name)
    if path is None:
        raise ConfigError(name, "is required: the Unix socket the proxy listens on")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(
            name, f"is longer than {MAX_SOCKET_PATH_BYTES} bytes, the Unix socket limit ({path!r})"
        )
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConfigError(name, f"is in a directory that does not exist ({directory!r})")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if not stat.S_ISSOCK(mode):
        raise ConfigError(name, f"names an existing file that is not a socket ({path!r})")
    return path
