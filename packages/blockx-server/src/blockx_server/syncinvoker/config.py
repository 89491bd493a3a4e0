"""Sync Invoker process configuration, from the environment.

Each variable is declared once below with its default, rule and help; the Sync
Invoker also reads the Calls-phase variables of ``blockx_server.calls.config``:
CALL_DEADLINE_MS is the budget of an invoke whose timeout_ms is 0, and TASK_* and
MAX_COLLECTED_OUTPUT_BYTES apply to the one call.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from blockx_chain.lake import LakeConfig
from blockx_server.calls.config import (
    CALL_DEADLINE_MS,
    CALL_SETTINGS,
    CallSettings,
    read_call_settings,
)
from blockx_server.io.backends.rpc import RPC_SETTINGS, RpcSettings, read_rpc_settings
from blockx_server.io.chain_config import ChainSettings, read_chain_settings
from blockx_server.io.config import (
    BLOCKDB_SETTINGS,
    ICEBERG_SETTINGS,
    IO_SETTINGS,
    BlockDbSettings,
    read_blockdb_settings,
    read_iceberg_settings,
    read_io_settings,
)
from blockx_server.io.settings import IoSettings
from blockx_server.runtime.connection_limits import (
    GRPC_LIMIT_SETTINGS,
    GrpcLimits,
    read_grpc_limits,
)
from blockx_server.runtime.env import ConfigReader, Environ, EnvironSource
from blockx_server.runtime.event_loop import EVENT_LOOP, EventLoop
from blockx_server.runtime.settings import (
    DRAIN_TIMEOUT_MS,
    GRPC_KEEPALIVE_TIME_MS,
    GRPC_KEEPALIVE_TIMEOUT_MS,
    GRPC_TLS_SETTINGS,
    LOG_LEVEL,
    PROMETHEUS_LISTEN_ADDR,
    PROMETHEUS_PATH,
    Setting,
    integer,
    listen_address,
)
from blockx_server.runtime.tls import GrpcTls, read_grpc_tls

PROGRAM: Final = "blockx-syncinvoker"


class SyncInvokerConfig(msgspec.Struct, frozen=True, kw_only=True):
    listen_host: str
    listen_port: int
    max_concurrent: int
    # The budget of an invoke that names none (CALL_DEADLINE_MS) and the most one may name.
    default_timeout_ms: int
    max_timeout_ms: int
    drain_timeout_ms: int
    calls: CallSettings
    # io.rpc: present when CHAIN_RPC_URL is set.
    rpc: RpcSettings = RpcSettings()
    keepalive_time_ms: int
    keepalive_timeout_ms: int
    grpc_limits: GrpcLimits = GrpcLimits()
    prometheus_listen: tuple[str, int] | None
    prometheus_path: str
    log_level: str
    event_loop: EventLoop = EventLoop.ASYNCIO
    blockdb: BlockDbSettings | None = None
    # The chains served: [chains.NAME] tables of --config, or BLOCKDB_URL /
    # CHAIN_RPC_URL as the chain "default" (``blockx_server.io.chain_config``).
    chains: tuple[ChainSettings, ...] = ()
    # io.iceberg, read-only here (ICEBERG_CATALOG_URI...); None when unset.
    iceberg: LakeConfig | None = None
    grpc_tls: GrpcTls = GrpcTls()
    io: IoSettings = IoSettings()


LISTEN: Final = Setting(
    name="SYNC_INVOKER_LISTEN",
    default=("0.0.0.0", 9091),
    parse=listen_address,
    help="gRPC listen address, host:port or :port",
    shown_default="0.0.0.0:9091",
)
MAX_CONCURRENT: Final = Setting(
    name="SYNC_INVOKER_MAX_CONCURRENT",
    default=256,
    parse=integer(at_least=1),
    help="invokes in flight; more answer RESOURCE_EXHAUSTED",
)
MAX_INVOKE_TIMEOUT_MS: Final = Setting(
    name="MAX_INVOKE_TIMEOUT_MS",
    default=60_000,
    parse=integer(at_least=1),
    help="the largest timeout_ms a caller may ask for; >= CALL_DEADLINE_MS",
)

SETTINGS: Final[tuple[Setting[Any], ...]] = (
    LISTEN,
    MAX_CONCURRENT,
    *CALL_SETTINGS,
    *BLOCKDB_SETTINGS,
    *ICEBERG_SETTINGS,
    *RPC_SETTINGS,
    *IO_SETTINGS,
    MAX_INVOKE_TIMEOUT_MS,
    PROMETHEUS_LISTEN_ADDR,
    PROMETHEUS_PATH,
    DRAIN_TIMEOUT_MS,
    GRPC_KEEPALIVE_TIME_MS,
    GRPC_KEEPALIVE_TIMEOUT_MS,
    *GRPC_LIMIT_SETTINGS,
    *GRPC_TLS_SETTINGS,
    LOG_LEVEL,
    EVENT_LOOP,
)


def load_syncinvoker_config(environ: Environ) -> SyncInvokerConfig:
    """Read and validate everything; raise ConfigErrors naming every bad variable."""
    reader = ConfigReader(EnvironSource(environ))
    config = read_syncinvoker_config(reader)
    reader.finish()
    return config


def read_syncinvoker_config(reader: ConfigReader) -> SyncInvokerConfig:
    listen_host, listen_port = reader.get(LISTEN)
    max_concurrent = reader.get(MAX_CONCURRENT)
    calls = read_call_settings(reader)
    default_timeout_ms = calls.engine.dispatch.call_deadline_ms
    max_timeout_ms = reader.get(MAX_INVOKE_TIMEOUT_MS)
    if reader.valid(MAX_INVOKE_TIMEOUT_MS.name, CALL_DEADLINE_MS.name) and (
        max_timeout_ms < default_timeout_ms
    ):
        reader.report(
            MAX_INVOKE_TIMEOUT_MS.name,
            f"must be >= CALL_DEADLINE_MS ({max_timeout_ms} < {default_timeout_ms})",
        )
    io = read_io_settings(reader, default_timeout_ms)
    prometheus_listen = reader.get(PROMETHEUS_LISTEN_ADDR)
    prometheus_path = reader.get(PROMETHEUS_PATH)
    config = SyncInvokerConfig(
        listen_host=listen_host,
        listen_port=listen_port,
        max_concurrent=max_concurrent,
        default_timeout_ms=default_timeout_ms,
        max_timeout_ms=max_timeout_ms,
        drain_timeout_ms=reader.get(DRAIN_TIMEOUT_MS),
        calls=calls,
        rpc=read_rpc_settings(reader),
        keepalive_time_ms=reader.get(GRPC_KEEPALIVE_TIME_MS),
        keepalive_timeout_ms=reader.get(GRPC_KEEPALIVE_TIMEOUT_MS),
        grpc_limits=read_grpc_limits(reader),
        grpc_tls=read_grpc_tls(reader, serves=True),
        prometheus_listen=prometheus_listen,
        prometheus_path=prometheus_path,
        log_level=reader.get(LOG_LEVEL),
        event_loop=reader.get(EVENT_LOOP),
        blockdb=read_blockdb_settings(reader),
        iceberg=read_iceberg_settings(reader),
        io=io,
    )
    chains = read_chain_settings(reader, config.blockdb, config.rpc)
    return msgspec.structs.replace(config, chains=chains)
