"""Sync Invoker process configuration, from the environment.

| variable | default | rule |
| --- | --- | --- |
| SYNC_INVOKER_LISTEN | 0.0.0.0:9091 | host:port or :port |
| SYNC_INVOKER_MAX_CONCURRENT | 256 | >= 1; invokes in flight before RESOURCE_EXHAUSTED |
| MAX_INVOKE_TIMEOUT_MS | 60000 | >= CALL_DEADLINE_MS; the largest timeout_ms a caller may ask for |
| DRAIN_TIMEOUT_MS | 30000 | >= 0; on SIGTERM, how long running invokes may finish |
| GRPC_KEEPALIVE_TIME_MS / GRPC_KEEPALIVE_TIMEOUT_MS | 30000 / 10000 | >= 1 |
| BLOCKX_PROMETHEUS_LISTEN_ADDR / BLOCKX_PROMETHEUS_PATH | off / /metrics | host:port / a path |
| BLOCKX_LOG_LEVEL | INFO | DEBUG, INFO, WARNING or ERROR |

plus the Calls-phase variables of ``blockx_server.calls.config``: EXECUTOR_COUNT,
CALL_DEADLINE_MS (the default budget of an invoke whose timeout_ms is 0),
FUNCTIONS_DIR, FUNCTIONS_POLL_INTERVAL_MS, IO_MEMORY_SEED_FILE, EXECUTOR_*,
CALL_RETRY_* (TASK_* and MAX_COLLECTED_OUTPUT_BYTES apply too, to the one call).
"""

from __future__ import annotations

from typing import Final

import msgspec

from blockx_server.calls.config import CallSettings, load_call_settings
from blockx_server.runtime.env import (
    ConfigError,
    Environ,
    env_int_at_least,
    env_listen_addr,
    env_log_level,
    env_prometheus,
)

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
    keepalive_time_ms: int
    keepalive_timeout_ms: int
    prometheus_listen: tuple[str, int] | None
    prometheus_path: str
    log_level: str


def load_syncinvoker_config(environ: Environ) -> SyncInvokerConfig:
    """Read and validate everything; raise ConfigError naming the first bad variable."""
    listen_host, listen_port = env_listen_addr(environ, "SYNC_INVOKER_LISTEN", "0.0.0.0:9091")
    max_concurrent = env_int_at_least(environ, "SYNC_INVOKER_MAX_CONCURRENT", 256, 1)
    calls = load_call_settings(environ)
    default_timeout_ms = calls.engine.dispatch.call_deadline_ms
    max_timeout_ms = env_int_at_least(environ, "MAX_INVOKE_TIMEOUT_MS", 60_000, 1)
    if max_timeout_ms < default_timeout_ms:
        raise ConfigError(
            "MAX_INVOKE_TIMEOUT_MS",
            f"must be >= CALL_DEADLINE_MS ({max_timeout_ms} < {default_timeout_ms})",
        )
    prometheus_listen, prometheus_path = env_prometheus(environ)
    return SyncInvokerConfig(
        listen_host=listen_host,
        listen_port=listen_port,
        max_concurrent=max_concurrent,
        default_timeout_ms=default_timeout_ms,
        max_timeout_ms=max_timeout_ms,
        drain_timeout_ms=env_int_at_least(environ, "DRAIN_TIMEOUT_MS", 30_000, 0),
        calls=calls,
        keepalive_time_ms=env_int_at_least(environ, "GRPC_KEEPALIVE_TIME_MS", 30_000, 1),
        keepalive_timeout_ms=env_int_at_least(environ, "GRPC_KEEPALIVE_TIMEOUT_MS", 10_000, 1),
        prometheus_listen=prometheus_listen,
        prometheus_path=prometheus_path,
        log_level=env_log_level(environ),
    )
