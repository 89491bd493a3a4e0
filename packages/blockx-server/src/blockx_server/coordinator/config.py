"""Coordinator process configuration: the Profile and the environment.

Variable names and defaults are the seeds' (``internal/coordinator/app/config.go``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import msgspec

from blockx_core.coordinator import CoordinatorConfig
from blockx_core.errors import InvalidConfig
from blockx_core.registry import (
    LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,
    LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX,
    PROD_DEFAULT_BUNDLE_WORKER_REGISTRY_PREFIX,
    InvalidRegistryPrefix,
    RegistryKind,
    parse_registry_prefix,
)
from blockx_server.coordinator.reservation import HandlerConfig
from blockx_server.etcd.watcher import EtcdWatcherConfig
from blockx_server.runtime.env import (
    ConfigError,
    Environ,
    env_float,
    env_int,
    env_list,
    env_listen_addr,
    env_log_level,
    env_optional,
    env_prometheus,
    validate_in_env_names,
)


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    """The identity of a coordinator entry point."""

    deployment: RegistryKind
    # Fully qualified gRPC service this deployment registers (and only it).
    service: str
    registry_prefixes: tuple[str, ...]
    program: str


BLOCK_PROFILE: Final = Profile(
    deployment=RegistryKind.BLOCK,
    service="coordinator.v1.CoordinatorService",
    registry_prefixes=(LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,),
    program="blockx-coordinator",
)
BUNDLE_PROFILE: Final = Profile(
    deployment=RegistryKind.BUNDLE,
    service="bundlecoordinator.v1.BundleCoordinatorService",
    registry_prefixes=(
        LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX,
        PROD_DEFAULT_BUNDLE_WORKER_REGISTRY_PREFIX,
    ),
    program="blockx-bundle-coordinator",
)


class CoordinatorRuntimeConfig(msgspec.Struct, frozen=True, kw_only=True):
    profile: Profile
    listen_host: str
    listen_port: int
    worker_rpc_timeout_ms: int
    core: CoordinatorConfig
    handler: HandlerConfig
    watcher: EtcdWatcherConfig
    # (host, port) of the Prometheus endpoint; None = metrics off.
    prometheus_listen: tuple[str, int] | None
    prometheus_path: str
    cpu_profile_path: str | None
    log_level: str


# The environment variable behind each field that CoordinatorConfig.validate checks.
_CORE_ENV: Final[Mapping[str, str]] = {
    "heartbeat_timeout_ms": "COORDINATOR_HEARTBEAT_TIMEOUT_MS",
    "watch_grace_period_ms": "COORDINATOR_WATCH_GRACE_PERIOD_MS",
    "slot_ttl_ms": "COORDINATOR_SLOT_TTL_MS",
    "max_candidates": "COORDINATOR_MAX_CANDIDATES",
    "circuit_breaker_threshold": "COORDINATOR_CIRCUIT_BREAKER_THRESHOLD",
    "circuit_breaker_cooldown_ms": "COORDINATOR_CIRCUIT_BREAKER_COOLDOWN_MS",
    "cpu_red_line": "COORDINATOR_CPU_RED_LINE",
    "memory_red_line": "COORDINATOR_MEMORY_RED_LINE",
    "error_rate_red_line": "COORDINATOR_ERROR_RATE_RED_LINE",
}

_WATCHER_ENV: Final[Mapping[str, str]] = {
    "endpoints": "ETCD_ENDPOINTS",
    "key_prefixes": "COORDINATOR_REGISTRY_PREFIXES",
}


def load_coordinator_config(profile: Profile, environ: Environ) -> CoordinatorRuntimeConfig:
    """Read and validate every variable; raise ConfigError naming the first bad one."""
    defaults = CoordinatorConfig()
    ints = {
        field: env_int(environ, var, getattr(defaults, field))
        for field, var in _CORE_ENV.items()
        if not field.endswith("red_line")
    }
    fractions = {
        field: env_float(environ, var, getattr(defaults, field))
        for field, var in _CORE_ENV.items()
        if field.endswith("red_line")
    }
    core = msgspec.convert({**ints, **fractions}, CoordinatorConfig)
    validate_in_env_names(core, _CORE_ENV)

    retries = env_int(environ, "COORDINATOR_MAX_TIMEOUT_RETRIES", 1)
    if retries < 0:
        raise ConfigError("COORDINATOR_MAX_TIMEOUT_RETRIES", f"must be >= 0 (got {retries})")
    ms = {
        var: _positive_ms(environ, var, default)
        for var, default in (
            ("COORDINATOR_WORKER_RPC_TIMEOUT_MS", 3000),
            ("COORDINATOR_ETCD_DIAL_TIMEOUT_MS", 5000),
            ("COORDINATOR_ETCD_WATCH_RETRY_DELAY_MS", 1000),
        )
    }
    listen_host, listen_port = env_listen_addr(environ, "COORDINATOR_LISTEN", ":8080")
    endpoints = env_list(environ, "ETCD_ENDPOINTS", ("localhost:2379",))
    prefixes = env_list(environ, "COORDINATOR_REGISTRY_PREFIXES", profile.registry_prefixes)
    _check_prefixes(profile, prefixes)

    prometheus_listen, prometheus_path = env_prometheus(environ)

    watcher = EtcdWatcherConfig(
        endpoints=endpoints,
        key_prefixes=prefixes,
        dial_timeout_ms=ms["COORDINATOR_ETCD_DIAL_TIMEOUT_MS"],
        retry_delay_ms=ms["COORDINATOR_ETCD_WATCH_RETRY_DELAY_MS"],
    )
    try:
        watcher.validate()
    except InvalidConfig as exc:
        raise ConfigError(_WATCHER_ENV.get(exc.field, exc.field), exc.rule) from None

    return CoordinatorRuntimeConfig(
        profile=profile,
        listen_host=listen_host,
        listen_port=listen_port,
        worker_rpc_timeout_ms=ms["COORDINATOR_WORKER_RPC_TIMEOUT_MS"],
        core=core,
        handler=HandlerConfig(max_timeout_retries=retries),
        watcher=watcher,
        prometheus_listen=prometheus_listen,
        prometheus_path=prometheus_path,
        cpu_profile_path=env_optional(environ, "COORDINATOR_CPU_PROFILE"),
        log_level=env_log_level(environ),
    )


def _positive_ms(environ: Environ, var: str, default: int) -> int:
    value = env_int(environ, var, default)
    if value <= 0:
        raise ConfigError(var, f"must be > 0 (got {value})")
    return value


def _check_prefixes(profile: Profile, prefixes: tuple[str, ...]) -> None:
    var = "COORDINATOR_REGISTRY_PREFIXES"
    if len(set(prefixes)) != len(prefixes):
        raise ConfigError(var, f"lists a prefix twice (got {','.join(prefixes)!r})")
    for prefix in prefixes:
        try:
            parsed = parse_registry_prefix(prefix)
        except InvalidRegistryPrefix as exc:
            raise ConfigError(var, f"is invalid: {exc}") from None
        if parsed.kind is not profile.deployment:
            raise ConfigError(
                var,
                f"has {prefix!r}, a {parsed.kind} registry, but {profile.program} is the "
                f"{profile.deployment} deployment",
            )
