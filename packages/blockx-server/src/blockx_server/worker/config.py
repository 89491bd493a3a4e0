"""Worker process configuration: the Profile and the environment.

Each variable is declared once below with its default, rule and help; the Worker
also reads the Calls-phase variables of ``blockx_server.calls.config``.
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Any, Final

import msgspec

from blockx_chain.lake import LakeConfig
from blockx_core.addr import join_host_port
from blockx_core.errors import InvalidConfig
from blockx_core.registry import (
    LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,
    LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX,
    InvalidRegistryPrefix,
    RegistryKind,
    parse_registry_prefix,
)
from blockx_core.worker import MAX_FAILED_TASKS_KEPT, WorkerConfig
from blockx_server.calls.config import CALL_SETTINGS, CallSettings, read_call_settings
from blockx_server.etcd.security import EtcdSecurity, read_etcd_security
from blockx_server.etcd.watcher import EtcdWatcherConfig
from blockx_server.io.backends.rpc import RPC_SETTINGS, RpcSettings, read_rpc_settings
from blockx_server.io.chain_config import ChainSettings, read_chain_settings
from blockx_server.io.config import (
    BLOCKDB_SETTINGS,
    ICEBERG_SETTINGS,
    IO_SETTINGS,
    SINK_SETTINGS,
    BlockDbSettings,
    SinkSettings,
    read_blockdb_settings,
    read_iceberg_settings,
    read_io_settings,
    read_sink_settings,
)
from blockx_server.io.settings import IoSettings
from blockx_server.pipeline.builders import DEFAULT_TASK_MAX_CALLS, StreamBuildConfig
from blockx_server.runtime.connection_limits import (
    GRPC_LIMIT_SETTINGS,
    GrpcLimits,
    read_grpc_limits,
)
from blockx_server.runtime.env import ConfigReader, Environ, EnvironSource
from blockx_server.runtime.event_loop import EVENT_LOOP, EventLoop
from blockx_server.runtime.settings import (
    DRAIN_TIMEOUT_MS,
    ETCD_ENDPOINTS,
    ETCD_SECURITY_SETTINGS,
    GRPC_KEEPALIVE_TIME_MS,
    GRPC_KEEPALIVE_TIMEOUT_MS,
    GRPC_TLS_SETTINGS,
    LOG_LEVEL,
    PROMETHEUS_LISTEN_ADDR,
    PROMETHEUS_PATH,
    InvalidValue,
    Setting,
    flag,
    integer,
    listen_address,
    output_file,
    text,
)
from blockx_server.runtime.tls import GrpcTls, read_grpc_tls
from blockx_server.worker.phase_work import AdmissionConfig


class WorkerProfile(msgspec.Struct, frozen=True, kw_only=True):
    deployment: RegistryKind
    registry_prefix: str
    program: str
    # STREAM_BUILD_ENABLED's default: the bundle cluster backfills long ranges.
    stream_build: bool


BLOCK_WORKER: Final = WorkerProfile(
    deployment=RegistryKind.BLOCK,
    registry_prefix=LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,
    program="blockx-worker",
    stream_build=False,
)
BUNDLE_WORKER: Final = WorkerProfile(
    deployment=RegistryKind.BUNDLE,
    registry_prefix=LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX,
    program="blockx-bundle-worker",
    stream_build=True,
)

_WILDCARDS: Final = ("", "0.0.0.0", "::")


class WorkerRuntimeConfig(msgspec.Struct, frozen=True, kw_only=True):
    profile: WorkerProfile
    listen_host: str
    listen_port: int
    advertise_addr: str
    registry_prefix: str
    etcd_endpoints: tuple[str, ...]
    etcd_security: EtcdSecurity
    heartbeat_interval_ms: int
    lease_ttl_s: int
    core: WorkerConfig
    admission: AdmissionConfig
    calls: CallSettings
    # io.rpc: present when CHAIN_RPC_URL is set.
    rpc: RpcSettings = RpcSettings()
    keepalive_time_ms: int
    keepalive_timeout_ms: int
    grpc_limits: GrpcLimits = GrpcLimits()
    drain_timeout_ms: int
    prometheus_listen: tuple[str, int] | None
    prometheus_path: str
    log_level: str
    event_loop: EventLoop = EventLoop.ASYNCIO
    cpu_profile_path: str | None = None
    blockdb: BlockDbSettings | None = None
    # The chains served: [chains.NAME] tables of --config, or BLOCKDB_URL /
    # CHAIN_RPC_URL as the chain "default" (``blockx_server.io.chain_config``).
    chains: tuple[ChainSettings, ...] = ()
    # io.sink: the database Writer Plugins write (SINK_DB_URL); None when unset.
    sink: SinkSettings | None = None
    # io.iceberg: the lake (ICEBERG_CATALOG_URI...); None when unset.
    iceberg: LakeConfig | None = None
    io: IoSettings = IoSettings()
    stream_build: StreamBuildConfig = StreamBuildConfig()
    grpc_tls: GrpcTls = GrpcTls()


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


_CORE_DEFAULTS: Final = WorkerConfig()


def _core(name: str, field: str, minimum: int, help: str) -> Setting[int]:
    # WorkerConfig.validate() holds the rules between core settings.
    return Setting(
        name=name,
        default=getattr(_CORE_DEFAULTS, field),
        parse=integer(at_least=minimum),
        help=help,
    )


# The setting behind each field that WorkerConfig.validate checks.
_CORE: Final[dict[str, Setting[int]]] = {
    "task_slots": _core("TASK_SLOTS", "task_slots", 1, "tasks reserved or running at once"),
    "default_ttl_ms": _core(
        "DEFAULT_SLOT_TTL_MS",
        "default_ttl_ms",
        1,
        "the lease of a slot SubmitTask reserves inline",
    ),
    "max_slot_ttl_ms": _core(
        "MAX_SLOT_TTL_MS",
        "max_slot_ttl_ms",
        1,
        "a larger RequestTaskSlot ttl_ms is INVALID_ARGUMENT; >= DEFAULT_SLOT_TTL_MS",
    ),
    "task_deadline_ms": _core(
        "TASK_DEADLINE_MS",
        "task_deadline_ms",
        1,
        "timeout of a task with task_timeout_ms = 0; <= MAX_TASK_TIMEOUT_MS",
    ),
    "max_task_timeout_ms": _core(
        "MAX_TASK_TIMEOUT_MS",
        "max_task_timeout_ms",
        1,
        "a larger task_timeout_ms is INVALID_ARGUMENT",
    ),
    "result_retention_ms": _core(
        "RESULT_RETENTION_MS", "result_retention_ms", 1, "how long a finished result is kept"
    ),
    "result_retention_max_bytes": _core(
        "RESULT_RETENTION_MAX_BYTES",
        "result_retention_max_bytes",
        1,
        "bytes of retained results; past it the oldest drop their outputs (a tombstone)",
    ),
    "result_tombstones_max": _core(
        "RESULT_TOMBSTONES_MAX",
        "result_tombstones_max",
        1,
        "tombstones of dropped results kept; past it the oldest is forgotten",
    ),
    "failed_tasks_kept": _core(
        "FAILED_TASKS_KEPT",
        "failed_tasks_kept",
        0,
        "failed tasks remembered (a summary, no outputs) after their results expire; "
        f"0 = none, at most {MAX_FAILED_TASKS_KEPT}",
    ),
    "watch_disconnect_grace_ms": _core(
        "WATCH_DISCONNECT_GRACE_MS",
        "watch_disconnect_grace_ms",
        0,
        "a watched task with no Watch this long fails; 0 = off",
    ),
}
_CORE_ENV: Final = {field: setting.name for field, setting in _CORE.items()}

LISTEN: Final = Setting(
    name="WORKER_LISTEN",
    default=("0.0.0.0", 9090),
    parse=listen_address,
    help="gRPC listen address, host:port or :port",
    shown_default="0.0.0.0:9090",
)


def _advertise_address(raw: str) -> str | None:
    listen_address(raw)  # the same host:port rule
    if raw.startswith(":"):
        raise InvalidValue(f"needs a host (got {raw!r})")
    return raw


ADVERTISE_ADDR: Final[Setting[str | None]] = Setting(
    name="WORKER_ADVERTISE_ADDR",
    default=None,
    parse=_advertise_address,
    help="the host:port put in the heartbeat and in answers",
    shown_default="primary address:listen port (for a wildcard listen)",
)
# Read through _prefix_setting(profile): the default and the kind are the profile's.
REGISTRY_PREFIX: Final = Setting(
    name="WORKER_REGISTRY_PREFIX",
    default=BLOCK_WORKER.registry_prefix,
    parse=text,
    help="where to register; a registry prefix of the deployment's kind",
)
HEARTBEAT_INTERVAL: Final = Setting(
    name="WORKER_HEARTBEAT_INTERVAL",
    default=200,
    parse=integer(at_least=1),
    help="ms between heartbeat writes (2000 recommended in production)",
)
LEASE_TTL_S: Final = Setting(
    name="WORKER_LEASE_TTL_S",
    default=10,
    parse=integer(at_least=2),
    help="the etcd lease of the registration, in seconds",
)
CPU_PROFILE: Final[Setting[str | None]] = Setting(
    name="WORKER_CPU_PROFILE",
    default=None,
    parse=output_file,
    help="write a cProfile of the event loop's thread to this file at exit",
)
BUILDER_SLOTS: Final = Setting(
    name="BUILDER_SLOTS", default=16, parse=integer(at_least=1), help="tasks in the build phase"
)
EXECUTOR_TASK_SLOTS: Final = Setting(
    name="EXECUTOR_TASK_SLOTS",
    default=32,
    parse=integer(at_least=1),
    help="tasks in the calls phase",
)
TASK_MAX_CALLS: Final = Setting(
    name="TASK_MAX_CALLS",
    default=DEFAULT_TASK_MAX_CALLS,
    parse=integer(at_least=1),
    help="root calls one task may make, streamed ones included; more fails BUILDER_FAILED",
)
PLUGIN_SLOTS: Final = Setting(
    name="PLUGIN_SLOTS", default=16, parse=integer(at_least=1), help="tasks in the writer phase"
)
SCAN_SLOTS: Final = Setting(
    name="SCAN_SLOTS",
    default=StreamBuildConfig().scan_slots,
    parse=integer(at_least=1),
    help="streaming Builder scans running at once (scanSem)",
)
# Read through _stream_build_setting(profile): the default is the profile's.
STREAM_BUILD_ENABLED: Final = Setting(
    name="STREAM_BUILD_ENABLED",
    default=BLOCK_WORKER.stream_build,
    parse=flag,
    help="BlockBundleCallConfig scans inside the Calls phase, feeding calls as it reads",
)


def worker_settings(profile: WorkerProfile) -> tuple[Setting[Any], ...]:
    """Every setting ``profile``'s program reads, with that program's defaults."""
    return (
        LISTEN,
        ADVERTISE_ADDR,
        _prefix_setting(profile),
        ETCD_ENDPOINTS,
        *ETCD_SECURITY_SETTINGS,
        *_CORE.values(),
        PROMETHEUS_LISTEN_ADDR,
        PROMETHEUS_PATH,
        HEARTBEAT_INTERVAL,
        LEASE_TTL_S,
        BUILDER_SLOTS,
        EXECUTOR_TASK_SLOTS,
        PLUGIN_SLOTS,
        TASK_MAX_CALLS,
        _stream_build_setting(profile),
        SCAN_SLOTS,
        *CALL_SETTINGS,
        *BLOCKDB_SETTINGS,
        *SINK_SETTINGS,
        *ICEBERG_SETTINGS,
        *RPC_SETTINGS,
        *IO_SETTINGS,
        GRPC_KEEPALIVE_TIME_MS,
        GRPC_KEEPALIVE_TIMEOUT_MS,
        *GRPC_LIMIT_SETTINGS,
        *GRPC_TLS_SETTINGS,
        DRAIN_TIMEOUT_MS,
        LOG_LEVEL,
        EVENT_LOOP,
        CPU_PROFILE,
    )


def _prefix_setting(profile: WorkerProfile) -> Setting[str]:
    """REGISTRY_PREFIX with ``profile``'s default, refusing a prefix of the other kind."""

    def parse(raw: str) -> str:
        try:
            parsed = parse_registry_prefix(raw)
        except InvalidRegistryPrefix as exc:
            raise InvalidValue(f"is invalid: {exc}") from None
        if parsed.kind is not profile.deployment:
            raise InvalidValue(
                f"has {raw!r}, a {parsed.kind} registry, but {profile.program} is the "
                f"{profile.deployment} deployment"
            )
        return raw

    return dataclasses.replace(REGISTRY_PREFIX, default=profile.registry_prefix, parse=parse)


def _stream_build_setting(profile: WorkerProfile) -> Setting[bool]:
    return dataclasses.replace(STREAM_BUILD_ENABLED, default=profile.stream_build)


def load_worker_config(profile: WorkerProfile, environ: Environ) -> WorkerRuntimeConfig:
    """Read and validate every variable; raise ConfigErrors naming every bad one."""
    reader = ConfigReader(EnvironSource(environ))
    config = read_worker_config(profile, reader)
    reader.finish()
    return config


def read_worker_config(profile: WorkerProfile, reader: ConfigReader) -> WorkerRuntimeConfig:
    listen_host, listen_port = reader.get(LISTEN)
    advertise = reader.get(ADVERTISE_ADDR)
    if advertise is None:
        host = primary_address() if listen_host in _WILDCARDS else listen_host
        advertise = join_host_port(host, listen_port)
        if listen_port == 0 and reader.valid(LISTEN.name):
            # The heartbeat names the address Coordinators and clients dial.
            reader.report(
                LISTEN.name,
                "has port 0, which the Worker could not advertise: give a port, or set "
                "WORKER_ADVERTISE_ADDR to the address it is reached at",
            )
    elif listen_address(advertise)[1] == 0:
        reader.report(ADVERTISE_ADDR.name, f"has port 0, which no one can dial (got {advertise!r})")

    prefix = reader.get(_prefix_setting(profile))
    endpoints = reader.get(ETCD_ENDPOINTS)
    if reader.valid(REGISTRY_PREFIX.name, ETCD_ENDPOINTS.name):
        try:
            EtcdWatcherConfig(endpoints=endpoints, key_prefixes=(prefix,)).validate()
        except InvalidConfig as exc:
            reader.report(ETCD_ENDPOINTS.name, exc.rule)
    etcd_security = read_etcd_security(reader)

    core_values = {field: reader.get(setting) for field, setting in _CORE.items()}
    core = reader.validate(msgspec.convert(core_values, WorkerConfig), _CORE_ENV, _CORE_DEFAULTS)

    calls = read_call_settings(reader)
    io = read_io_settings(reader, calls.engine.dispatch.call_deadline_ms)
    prometheus_listen = reader.get(PROMETHEUS_LISTEN_ADDR)
    prometheus_path = reader.get(PROMETHEUS_PATH)
    config = WorkerRuntimeConfig(
        profile=profile,
        listen_host=listen_host,
        listen_port=listen_port,
        advertise_addr=advertise,
        registry_prefix=prefix,
        etcd_endpoints=endpoints,
        etcd_security=etcd_security,
        heartbeat_interval_ms=reader.get(HEARTBEAT_INTERVAL),
        lease_ttl_s=reader.get(LEASE_TTL_S),
        core=core,
        admission=AdmissionConfig(
            builder_slots=reader.get(BUILDER_SLOTS),
            executor_task_slots=reader.get(EXECUTOR_TASK_SLOTS),
            writer_slots=reader.get(PLUGIN_SLOTS),
            task_max_calls=reader.get(TASK_MAX_CALLS),
        ),
        calls=calls,
        rpc=read_rpc_settings(reader),
        keepalive_time_ms=reader.get(GRPC_KEEPALIVE_TIME_MS),
        keepalive_timeout_ms=reader.get(GRPC_KEEPALIVE_TIMEOUT_MS),
        grpc_limits=read_grpc_limits(reader),
        grpc_tls=read_grpc_tls(reader, serves=True),
        drain_timeout_ms=reader.get(DRAIN_TIMEOUT_MS),
        prometheus_listen=prometheus_listen,
        prometheus_path=prometheus_path,
        log_level=reader.get(LOG_LEVEL),
        event_loop=reader.get(EVENT_LOOP),
        cpu_profile_path=reader.get(CPU_PROFILE),
        blockdb=read_blockdb_settings(reader),
        sink=read_sink_settings(reader),
        iceberg=read_iceberg_settings(reader),
        io=io,
        stream_build=StreamBuildConfig(
            enabled=reader.get(_stream_build_setting(profile)),
            scan_slots=reader.get(SCAN_SLOTS),
        ),
    )
    chains = read_chain_settings(reader, config.blockdb, config.rpc)
    return msgspec.structs.replace(config, chains=chains)
