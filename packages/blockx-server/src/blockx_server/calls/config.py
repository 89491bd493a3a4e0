"""Configuration of the Calls phase (executors, dispatch, retries, function code).

Read by every process that runs calls (the Worker, later the Sync Invoker).

| variable | default | rule |
| --- | --- | --- |
| EXECUTOR_COUNT | 8 | >= 1 |
| CALL_DEADLINE_MS | 5000 | >= 1; CPU + IO budget of one call attempt |
| TASK_MAX_INFLIGHT_CALLS | 1024 | >= 1 |
| TASK_INITIAL_INFLIGHT_CALLS | 64 | >= 1; the window doubles from here |
| MAX_COLLECTED_OUTPUT_BYTES | 67108864 (64 MiB) | >= 1 |
| CALL_RETRY_MAX_ATTEMPTS | 3 | >= 1 (1 = no retry) |
| CALL_RETRY_BACKOFF_MS | 100 | >= 0; doubles per attempt |
| CALL_RETRY_BACKOFF_MAX_MS | 2000 | >= CALL_RETRY_BACKOFF_MS |
| CALL_RETRY_ON | EXECUTOR_LOST | comma-separated failure kinds that are retried |
| EXECUTOR_HEARTBEAT_INTERVAL_MS | 200 | >= 1 |
| EXECUTOR_HEARTBEAT_TIMEOUT_MS | 3000 | > EXECUTOR_HEARTBEAT_INTERVAL_MS |
| EXECUTOR_MEMORY_LIMIT_BYTES | 0 | >= 0; RLIMIT_AS per executor, 0 = none |
| EXECUTOR_MAX_OPEN_FILES | 256 | >= 16 |
| EXECUTOR_SANDBOX | true | refuse network, processes and file writes in functions |
| FUNCTIONS_DIR | functions | a directory of .py modules |
| FUNCTIONS_POLL_INTERVAL_MS | 1000 | >= 1; how often FUNCTIONS_DIR is re-read |
| IO_MEMORY_SEED_FILE | unset | a JSON object file seeding io.memory |
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from blockx_core.dispatch import CallFailureKind, CallRetryPolicy, DispatchConfig
from blockx_server.calls.engine import CallEngineConfig
from blockx_server.calls.executor_pool import ExecutorPoolConfig
from blockx_server.runtime.env import (
    ConfigError,
    Environ,
    env_bool,
    env_int_at_least,
    env_list,
    env_optional,
    env_str,
)


class CallSettings(msgspec.Struct, frozen=True, kw_only=True):
    engine: CallEngineConfig
    functions_dir: Path
    functions_poll_interval_ms: int
    memory_seed_file: Path | None


def load_call_settings(environ: Environ) -> CallSettings:
    """Read and validate the variables above; raise ConfigError naming the first bad one."""
    retry_kinds = env_list(environ, "CALL_RETRY_ON", (CallFailureKind.EXECUTOR_LOST.value,))
    retry_on: set[CallFailureKind] = set()
    for kind in retry_kinds:
        try:
            retry_on.add(CallFailureKind(kind.upper()))
        except ValueError:
            known = ", ".join(k.value for k in CallFailureKind)
            raise ConfigError("CALL_RETRY_ON", f"has {kind!r}, not one of {known}") from None
    backoff = env_int_at_least(environ, "CALL_RETRY_BACKOFF_MS", 100, 0)
    backoff_max = env_int_at_least(environ, "CALL_RETRY_BACKOFF_MAX_MS", 2000, 0)
    if backoff_max < backoff:
        raise ConfigError(
            "CALL_RETRY_BACKOFF_MAX_MS",
            f"must be >= CALL_RETRY_BACKOFF_MS ({backoff_max} < {backoff})",
        )
    heartbeat = env_int_at_least(environ, "EXECUTOR_HEARTBEAT_INTERVAL_MS", 200, 1)
    heartbeat_timeout = env_int_at_least(environ, "EXECUTOR_HEARTBEAT_TIMEOUT_MS", 3000, 1)
    if heartbeat_timeout <= heartbeat:
        raise ConfigError(
            "EXECUTOR_HEARTBEAT_TIMEOUT_MS",
            f"must be > EXECUTOR_HEARTBEAT_INTERVAL_MS ({heartbeat_timeout} <= {heartbeat})",
        )
    dispatch = DispatchConfig(
        task_max_inflight_calls=env_int_at_least(environ, "TASK_MAX_INFLIGHT_CALLS", 1024, 1),
        initial_window=env_int_at_least(environ, "TASK_INITIAL_INFLIGHT_CALLS", 64, 1),
        call_deadline_ms=env_int_at_least(environ, "CALL_DEADLINE_MS", 5000, 1),
        max_collected_output_bytes=env_int_at_least(
            environ, "MAX_COLLECTED_OUTPUT_BYTES", 64 * 1024 * 1024, 1
        ),
        executor_heartbeat_timeout_ms=heartbeat_timeout,
        retry=CallRetryPolicy(
            max_attempts=env_int_at_least(environ, "CALL_RETRY_MAX_ATTEMPTS", 3, 1),
            backoff_ms=backoff,
            backoff_max_ms=backoff_max,
            retry_on=frozenset(retry_on),
        ),
    )
    pool = ExecutorPoolConfig(
        count=env_int_at_least(environ, "EXECUTOR_COUNT", 8, 1),
        heartbeat_interval_ms=heartbeat,
        memory_limit_bytes=env_int_at_least(environ, "EXECUTOR_MEMORY_LIMIT_BYTES", 0, 0),
        max_open_files=env_int_at_least(environ, "EXECUTOR_MAX_OPEN_FILES", 256, 16),
        sandbox=env_bool(environ, "EXECUTOR_SANDBOX", True),
    )
    functions_dir = Path(env_str(environ, "FUNCTIONS_DIR", "functions"))
    if not functions_dir.is_dir():
        raise ConfigError(
            "FUNCTIONS_DIR", f"must be a directory of .py function modules ({functions_dir})"
        )
    seed = env_optional(environ, "IO_MEMORY_SEED_FILE")
    if seed is not None and not Path(seed).is_file():
        raise ConfigError("IO_MEMORY_SEED_FILE", f"must be a JSON object file ({seed})")
    return CallSettings(
        engine=CallEngineConfig(dispatch=dispatch, pool=pool),
        functions_dir=functions_dir,
        functions_poll_interval_ms=env_int_at_least(environ, "FUNCTIONS_POLL_INTERVAL_MS", 1000, 1),
        memory_seed_file=Path(seed) if seed is not None else None,
    )
