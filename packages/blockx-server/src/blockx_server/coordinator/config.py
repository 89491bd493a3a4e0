"""Coordinator process configuration: the Profile and the environment.

Each variable is declared once below with its default, rule and help.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

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
    PROMETHEUS_LISTEN_ADDR,
    PROMETHEUS_PATH,
    InvalidValue,
    Setting,
    integer,
    items,
    listen_address,
    number,
    output_file,
)
from blockx_server.runtime.tls import GrpcTls, read_grpc_tls


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
    event_loop: EventLoop = EventLoop.ASYNCIO
    grpc_limits: GrpcLimits = GrpcLimits()
    grpc_tls: GrpcTls = GrpcTls()


_CORE_DEFAULTS: Final = CoordinatorConfig()


def _core_int(name: str, field: str, help: str) -> Setting[int]:
    # CoordinatorConfig.validate() holds the range rules of the core settings.
    return Setting(name=name, default=getattr(_CORE_DEFAULTS, field), parse=integer(), help=help)


def _core_fraction(name: str, field: str, help: str) -> Setting[float]:
    return Setting(name=name, default=getattr(_CORE_DEFAULTS, field), parse=number, help=help)


LISTEN: Final = Setting(
    name="COORDINATOR_LISTEN",
    default=("", 8080),
    parse=listen_address,
    help="gRPC listen address, host:port or :port",
    shown_default=":8080",
)
# Read through _prefixes_setting(profile): the default and the kind are the profile's.
REGISTRY_PREFIXES: Final = Setting(
    name="COORDINATOR_REGISTRY_PREFIXES",
    default=BLOCK_PROFILE.registry_prefixes,
    parse=items,
    help="registry prefixes to watch, of the deployment's kind; replaces the default",
)
WORKER_RPC_TIMEOUT_MS: Final = Setting(
    name="COORDINATOR_WORKER_RPC_TIMEOUT_MS",
    default=3000,
    parse=integer(above=0),
    help="timeout of one RequestTaskSlot",
)
ETCD_DIAL_TIMEOUT_MS: Final = Setting(
    name="COORDINATOR_ETCD_DIAL_TIMEOUT_MS",
    default=5000,
    parse=integer(above=0),
    help="timeout of etcd calls",
)
ETCD_WATCH_RETRY_DELAY_MS: Final = Setting(
    name="COORDINATOR_ETCD_WATCH_RETRY_DELAY_MS",
    default=1000,
    parse=integer(above=0),
    help="wait before reconnecting a failed list+watch",
)
MAX_TIMEOUT_RETRIES: Final = Setting(
    name="COORDINATOR_MAX_TIMEOUT_RETRIES",
    default=1,
    parse=integer(at_least=0),
    help="same-worker retries after an uncertain outcome, >= 0",
)
CPU_PROFILE: Final[Setting[str | None]] = Setting(
    name="COORDINATOR_CPU_PROFILE",
    default=None,
    parse=output_file,
    help="write a cProfile of the process lifetime to this file at exit",
)

# The setting behind each field that CoordinatorConfig.validate checks.
_CORE: Final[Mapping[str, Setting[Any]]] = {
    "heartbeat_timeout_ms": _core_int(
        "COORDINATOR_HEARTBEAT_TIMEOUT_MS",
        "heartbeat_timeout_ms",
        "a worker whose heartbeat is older is not routed to, > 0",
    ),
    "watch_grace_period_ms": _core_int(
        "COORDINATOR_WATCH_GRACE_PERIOD_MS",
        "watch_grace_period_ms",
        "how long a lost watch is still trusted; <= COORDINATOR_HEARTBEAT_TIMEOUT_MS",
    ),
    "slot_ttl_ms": _core_int(
        "COORDINATOR_SLOT_TTL_MS",
        "slot_ttl_ms",
        "the ttl_ms passed to RequestTaskSlot, > 0; <= COORDINATOR_WORKERS_MAX_SLOT_TTL_MS",
    ),
    "workers_max_slot_ttl_ms": _core_int(
        "COORDINATOR_WORKERS_MAX_SLOT_TTL_MS",
        "workers_max_slot_ttl_ms",
        "the Workers' MAX_SLOT_TTL_MS (the largest ttl_ms they grant), > 0; set it only "
        "when every Worker allows more than the default",
    ),
    "max_candidates": _core_int(
        "COORDINATOR_MAX_CANDIDATES", "max_candidates", "candidates tried per request, >= 1"
    ),
    "circuit_breaker_threshold": _core_int(
        "COORDINATOR_CIRCUIT_BREAKER_THRESHOLD",
        "circuit_breaker_threshold",
        "failures that open a worker's breaker, >= 1",
    ),
    "circuit_breaker_cooldown_ms": _core_int(
        "COORDINATOR_CIRCUIT_BREAKER_COOLDOWN_MS",
        "circuit_breaker_cooldown_ms",
        "how long an open breaker stays open, > 0",
    ),
    "cpu_red_line": _core_fraction(
        "COORDINATOR_CPU_RED_LINE", "cpu_red_line", "skip workers above this cpu fraction, (0, 1]"
    ),
    "memory_red_line": _core_fraction(
        "COORDINATOR_MEMORY_RED_LINE",
        "memory_red_line",
        "skip workers above this memory fraction, (0, 1]",
    ),
    "error_rate_red_line": _core_fraction(
        "COORDINATOR_ERROR_RATE_RED_LINE",
        "error_rate_red_line",
        "skip workers above this error rate, (0, 1]",
    ),
}
_CORE_ENV: Final[Mapping[str, str]] = {field: s.name for field, s in _CORE.items()}

_WATCHER_ENV: Final[Mapping[str, str]] = {
    "endpoints": ETCD_ENDPOINTS.name,
    "key_prefixes": REGISTRY_PREFIXES.name,
}


def coordinator_settings(profile: Profile) -> tuple[Setting[Any], ...]:
    """Every setting ``profile``'s program reads, with that program's defaults."""
    return (
        *_CORE.values(),
        MAX_TIMEOUT_RETRIES,
        WORKER_RPC_TIMEOUT_MS,
        ETCD_DIAL_TIMEOUT_MS,
        ETCD_WATCH_RETRY_DELAY_MS,
        LISTEN,
        ETCD_ENDPOINTS,
        _prefixes_setting(profile),
        *ETCD_SECURITY_SETTINGS,
        *GRPC_TLS_SETTINGS,
        PROMETHEUS_LISTEN_ADDR,
        PROMETHEUS_PATH,
        CPU_PROFILE,
        LOG_LEVEL,
        EVENT_LOOP,
        *GRPC_LIMIT_SETTINGS,
    )


def _prefixes_setting(profile: Profile) -> Setting[tuple[str, ...]]:
    """REGISTRY_PREFIXES with ``profile``'s default, refusing prefixes of the other kind."""

    def parse(raw: str) -> tuple[str, ...]:
        prefixes = items(raw)
        if len(set(prefixes)) != len(prefixes):
            raise InvalidValue(f"lists a prefix twice (got {','.join(prefixes)!r})")
        for prefix in prefixes:
            try:
                parsed = parse_registry_prefix(prefix)
            except InvalidRegistryPrefix as exc:
                raise InvalidValue(f"is invalid: {exc}") from None
            if parsed.kind is not profile.deployment:
                raise InvalidValue(
                    f"has {prefix!r}, a {parsed.kind} registry, but {profile.program} is the "
                    f"{profile.deployment} deployment"
                )
        return prefixes

    return dataclasses.replace(REGISTRY_PREFIXES, default=profile.registry_prefixes, parse=parse)


def load_coordinator_config(profile: Profile, environ: Environ) -> CoordinatorRuntimeConfig:
    """Read and validate every variable; raise ConfigErrors naming every bad one."""
    reader = ConfigReader(EnvironSource(environ))
    config = read_coordinator_config(profile, reader)
    reader.finish()
    return config


def read_coordinator_config(profile: Profile, reader: ConfigReader) -> CoordinatorRuntimeConfig:
    values = {field: reader.get(setting) for field, setting in _CORE.items()}
    core = reader.validate(msgspec.convert(values, CoordinatorConfig), _CORE_ENV, _CORE_DEFAULTS)

    retries = reader.get(MAX_TIMEOUT_RETRIES)
    worker_rpc_timeout_ms = reader.get(WORKER_RPC_TIMEOUT_MS)
    dial_timeout_ms = reader.get(ETCD_DIAL_TIMEOUT_MS)
    retry_delay_ms = reader.get(ETCD_WATCH_RETRY_DELAY_MS)
    listen_host, listen_port = reader.get(LISTEN)
    endpoints = reader.get(ETCD_ENDPOINTS)
    prefixes = reader.get(_prefixes_setting(profile))
    etcd_security = read_etcd_security(reader)
    grpc_tls = read_grpc_tls(reader, serves=True)

    prometheus_listen = reader.get(PROMETHEUS_LISTEN_ADDR)
    prometheus_path = reader.get(PROMETHEUS_PATH)

    watcher = EtcdWatcherConfig(
        endpoints=endpoints,
        key_prefixes=prefixes,
        dial_timeout_ms=dial_timeout_ms,
        retry_delay_ms=retry_delay_ms,
        security=etcd_security,
    )
    if reader.valid(
        *_WATCHER_ENV.values(), ETCD_DIAL_TIMEOUT_MS.name, ETCD_WATCH_RETRY_DELAY_MS.name
    ):
        try:
            watcher.validate()
        except InvalidConfig as exc:
            reader.report(_WATCHER_ENV.get(exc.field, exc.field), exc.rule)

    return CoordinatorRuntimeConfig(
        profile=profile,
        listen_host=listen_host,
        listen_port=listen_port,
        worker_rpc_timeout_ms=worker_rpc_timeout_ms,
        core=core,
        handler=HandlerConfig(max_timeout_retries=retries),
        watcher=watcher,
        prometheus_listen=prometheus_listen,
        prometheus_path=prometheus_path,
        cpu_profile_path=reader.get(CPU_PROFILE),
        log_level=reader.get(LOG_LEVEL),
        event_loop=reader.get(EVENT_LOOP),
        grpc_limits=read_grpc_limits(reader),
        grpc_tls=grpc_tls,
    )
