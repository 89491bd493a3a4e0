"""Worker process configuration: the Profile and the environment.

| variable | default | rule |
| --- | --- | --- |
| WORKER_LISTEN | 0.0.0.0:9090 | host:port |
| WORKER_ADVERTISE_ADDR | primary address + listen port (for a wildcard listen) | host:port |
| WORKER_REGISTRY_PREFIX | the profile's | a registry prefix of the profile's kind |
| ETCD_ENDPOINTS | localhost:2379 | comma-separated host[:port] |
| TASK_SLOTS | 50 | >= 1 |
| TASK_DEADLINE_MS | 300000 | >= 1, <= MAX_TASK_TIMEOUT_MS |
| MAX_TASK_TIMEOUT_MS | 28800000 (8 h) | >= 1 |
| RESULT_RETENTION_MS | 300000 | >= 1 |
| DEFAULT_SLOT_TTL_MS | 5000 | >= 1; SubmitTask without a slot reserves inline |
| WATCH_DISCONNECT_GRACE_MS | 0 (off) | >= 0 |
| WORKER_HEARTBEAT_INTERVAL | 200 (ms; 2000 in production) | >= 1 |
| WORKER_LEASE_TTL_S | 10 | >= 2 |
| GRPC_KEEPALIVE_TIME_MS / GRPC_KEEPALIVE_TIMEOUT_MS | 30000 / 10000 | >= 1 |
| BUILDER_SLOTS / EXECUTOR_TASK_SLOTS / PLUGIN_SLOTS | 16 / 32 / 16 | >= 1 |
| DRAIN_TIMEOUT_MS | 30000 | >= 0 |
| BLOCKX_PROMETHEUS_LISTEN_ADDR / BLOCKX_PROMETHEUS_PATH | off / /metrics | |
| BLOCKX_LOG_LEVEL | INFO | |

plus the Calls-phase variables of ``blockx_server.calls.config`` (EXECUTOR_COUNT,
CALL_DEADLINE_MS, TASK_MAX_INFLIGHT_CALLS, MAX_COLLECTED_OUTPUT_BYTES, FUNCTIONS_DIR, ...).
"""

from __future__ import annotations

import socket
from typing import Final

import msgspec

from blockx_core.addr import join_host_port
from blockx_core.errors import InvalidConfig
from blockx_core.registry import (
    LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,
    LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX,
    InvalidRegistryPrefix,
    RegistryKind,
    parse_registry_prefix,
)
from blockx_core.worker import WorkerConfig
from blockx_server.calls.config import CallSettings, load_call_settings
from blockx_server.etcd.watcher import EtcdWatcherConfig
from blockx_server.runtime.env import (
    ConfigError,
    Environ,
    env_int_at_least,
    env_list,
    env_listen_addr,
    env_log_level,
    env_optional,
    env_prometheus,
    env_str,
    validate_in_env_names,
)
from blockx_server.worker.orchestrator import AdmissionConfig


class WorkerProfile(msgspec.Struct, frozen=True, kw_only=True):
    deployment: RegistryKind
    registry_prefix: str
    program: str


BLOCK_WORKER: Final = WorkerProfile(
    deployment=RegistryKind.BLOCK,
    registry_prefix=LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,
    program="blockx-worker",
)
BUNDLE_WORKER: Final = WorkerProfile(
    deployment=RegistryKind.BUNDLE,
    registry_prefix=LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX,
    program="blockx-bundle-worker",
)

_WILDCARDS: Final = ("", "0.0.0.0", "::")

_CORE_ENV: Final = {
    "task_slots": "TASK_SLOTS",
    "default_ttl_ms": "DEFAULT_SLOT_TTL_MS",
    "task_deadline_ms": "TASK_DEADLINE_MS",
    "max_task_timeout_ms": "MAX_TASK_TIMEOUT_MS",
    "result_retention_ms": "RESULT_RETENTION_MS",
    "watch_disconnect_grace_ms": "WATCH_DISCONNECT_GRACE_MS",
}


class WorkerRuntimeConfig(msgspec.Struct, frozen=True, kw_only=True):
    profile: WorkerProfile
    listen_host: str
    listen_port: int
    advertise_addr: str
    registry_prefix: str
    etcd_endpoints: tuple[str, ...]
    heartbeat_interval_ms: int
    lease_ttl_s: int
    core: WorkerConfig
    admission: AdmissionConfig
    calls: CallSettings
    keepalive_time_ms: int
    keepalive_timeout_ms: int
    drain_timeout_ms: int
    prometheus_listen: tuple[str, int] | None
    prometheus_path: str
    log_level: str


def primary_address() -> str:
    """This host's address on its default route (no packet is sent), or loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: routing only
            address: str = probe.getsockname()[0]
            return address
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def load_worker_config(profile: WorkerProfile, environ: Environ) -> WorkerRuntimeConfig:
    listen_host, listen_port = env_listen_addr(environ, "WORKER_LISTEN", "0.0.0.0:9090")
    advertise = env_optional(environ, "WORKER_ADVERTISE_ADDR")
    if advertise is None:
        host = primary_address() if listen_host in _WILDCARDS else listen_host
        advertise = join_host_port(host, listen_port)
    else:
        env_listen_addr(environ, "WORKER_ADVERTISE_ADDR", advertise)  # validates host:port
        if advertise.startswith(":"):
            raise ConfigError("WORKER_ADVERTISE_ADDR", f"needs a host (got {advertise!r})")

    prefix = env_str(environ, "WORKER_REGISTRY_PREFIX", profile.registry_prefix)
    try:
        parsed = parse_registry_prefix(prefix)
    except InvalidRegistryPrefix as exc:
        raise ConfigError("WORKER_REGISTRY_PREFIX", f"is invalid: {exc}") from None
    if parsed.kind is not profile.deployment:
        raise ConfigError(
            "WORKER_REGISTRY_PREFIX",
            f"has {prefix!r}, a {parsed.kind} registry, but {profile.program} is the "
            f"{profile.deployment} deployment",
        )
    endpoints = env_list(environ, "ETCD_ENDPOINTS", ("localhost:2379",))
    try:
        EtcdWatcherConfig(endpoints=endpoints, key_prefixes=(prefix,)).validate()
    except InvalidConfig as exc:
        raise ConfigError("ETCD_ENDPOINTS", exc.rule) from None

    defaults = WorkerConfig()
    core_values = {
        field: env_int_at_least(
            environ, var, getattr(defaults, field), 0 if field == "watch_disconnect_grace_ms" else 1
        )
        for field, var in _CORE_ENV.items()
    }
    core = msgspec.convert(core_values, WorkerConfig)
    validate_in_env_names(core, _CORE_ENV)

    prometheus_listen, prometheus_path = env_prometheus(environ)
    return WorkerRuntimeConfig(
        profile=profile,
        listen_host=listen_host,
        listen_port=listen_port,
        advertise_addr=advertise,
        registry_prefix=prefix,
        etcd_endpoints=endpoints,
        heartbeat_interval_ms=env_int_at_least(environ, "WORKER_HEARTBEAT_INTERVAL", 200, 1),
        lease_ttl_s=env_int_at_least(environ, "WORKER_LEASE_TTL_S", 10, 2),
        core=core,
        admission=AdmissionConfig(
            builder_slots=env_int_at_least(environ, "BUILDER_SLOTS", 16, 1),
            executor_task_slots=env_int_at_least(environ, "EXECUTOR_TASK_SLOTS", 32, 1),
            writer_slots=env_int_at_least(environ, "PLUGIN_SLOTS", 16, 1),
        ),
        calls=load_call_settings(environ),
        keepalive_time_ms=env_int_at_least(environ, "GRPC_KEEPALIVE_TIME_MS", 30_000, 1),
        keepalive_timeout_ms=env_int_at_least(environ, "GRPC_KEEPALIVE_TIMEOUT_MS", 10_000, 1),
        drain_timeout_ms=env_int_at_least(environ, "DRAIN_TIMEOUT_MS", 30_000, 0),
        prometheus_listen=prometheus_listen,
        prometheus_path=prometheus_path,
        log_level=env_log_level(environ),
    )
