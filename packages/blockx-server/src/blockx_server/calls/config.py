"""Configuration of the Calls phase (executors, dispatch, retries, function code).

Read by every process that runs calls: the Worker and the Sync Invoker. Each
variable is declared once below with its default, rule and help.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any, Final

import msgspec

from blockx_core.call_record import DEFAULT_CALL_RECORD_MAX_BYTES
from blockx_core.dispatch import CallRetryPolicy, DispatchConfig
from blockx_core.failures import CallFailureKind
from blockx_server.calls.engine import CallEngineConfig
from blockx_server.calls.executor_pool import ExecutorPoolConfig
from blockx_server.calls.executor_runtime import DEFAULT_RUNTIME_DIR
from blockx_server.calls.isolation import IsolationConfig
from blockx_server.runtime.cpus import usable_cpus
from blockx_server.runtime.env import ConfigReader, Environ, EnvironSource
from blockx_server.runtime.settings import (
    InvalidValue,
    Setting,
    flag,
    integer,
    items,
    optional_text,
    text,
)


class CallSettings(msgspec.Struct, frozen=True, kw_only=True):
    engine: CallEngineConfig
    functions_dir: Path
    functions_poll_interval_ms: int
    memory_seed_file: Path | None
    # CALL_RECORD_MAX_BYTES: the IO a call's record keeps (0: calls are not recorded).
    record_max_bytes: int = DEFAULT_CALL_RECORD_MAX_BYTES


# Each is a process the Worker starts at once: a mistyped count must not fork the
# host to its knees.
MAX_EXECUTOR_COUNT: Final = 1024
EXECUTOR_COUNT: Final = Setting(
    name="EXECUTOR_COUNT",
    default=8,
    parse=integer(at_least=1, at_most=MAX_EXECUTOR_COUNT),
    help=f"Python Executor processes, at most {MAX_EXECUTOR_COUNT}",
)
EXECUTOR_CPUS: Final[Setting[int | None]] = Setting(
    name="EXECUTOR_CPUS",
    default=None,
    parse=integer(at_least=0, at_most=MAX_EXECUTOR_COUNT),
    shown_default="the CPUs the process may use",
    help="executors a task whose calls keep them busy spreads over; 0 = all of them",
)
CALL_DEADLINE_MS: Final = Setting(
    name="CALL_DEADLINE_MS",
    default=5000,
    parse=integer(at_least=1),
    help="CPU + IO budget of one call attempt",
)
TASK_MAX_INFLIGHT_CALLS: Final = Setting(
    name="TASK_MAX_INFLIGHT_CALLS",
    default=1024,
    parse=integer(at_least=1),
    help="calls of one task in flight",
)
TASK_INITIAL_INFLIGHT_CALLS: Final = Setting(
    name="TASK_INITIAL_INFLIGHT_CALLS",
    default=64,
    parse=integer(at_least=1),
    help="the first window; it doubles up to TASK_MAX_INFLIGHT_CALLS",
)
MAX_COLLECTED_OUTPUT_BYTES: Final = Setting(
    name="MAX_COLLECTED_OUTPUT_BYTES",
    default=64 * 1024 * 1024,
    parse=integer(at_least=1),
    help="total output a task may collect",
)
CALL_RETRY_MAX_ATTEMPTS: Final = Setting(
    name="CALL_RETRY_MAX_ATTEMPTS",
    default=3,
    parse=integer(at_least=1),
    help="attempts per call (1 = no retry)",
)
CALL_RETRY_BACKOFF_MS: Final = Setting(
    name="CALL_RETRY_BACKOFF_MS",
    default=100,
    parse=integer(at_least=0),
    help="back-off before the first retry; doubles per attempt",
)
CALL_RETRY_BACKOFF_MAX_MS: Final = Setting(
    name="CALL_RETRY_BACKOFF_MAX_MS",
    default=2000,
    parse=integer(at_least=0),
    help="the largest back-off; >= CALL_RETRY_BACKOFF_MS",
)


def _failure_kinds(raw: str) -> frozenset[CallFailureKind]:
    kinds: set[CallFailureKind] = set()
    for kind in items(raw):
        try:
            kinds.add(CallFailureKind(kind.upper()))
        except ValueError:
            known = ", ".join(k.value for k in CallFailureKind)
            raise InvalidValue(f"has {kind!r}, not one of {known}") from None
    return frozenset(kinds)


CALL_RETRY_ON: Final = Setting(
    name="CALL_RETRY_ON",
    default=frozenset({CallFailureKind.EXECUTOR_LOST}),
    parse=_failure_kinds,
    shown_default=CallFailureKind.EXECUTOR_LOST.value,
    help="comma-separated failure kinds that are retried (e.g. add IO_ERROR)",
)
EXECUTOR_HEARTBEAT_INTERVAL_MS: Final = Setting(
    name="EXECUTOR_HEARTBEAT_INTERVAL_MS",
    default=200,
    parse=integer(at_least=1),
    help="executor heartbeats",
)
EXECUTOR_HEARTBEAT_TIMEOUT_MS: Final = Setting(
    name="EXECUTOR_HEARTBEAT_TIMEOUT_MS",
    default=3000,
    parse=integer(at_least=1),
    help="an executor with no heartbeat and no CPU progress this long is killed; "
    "> EXECUTOR_HEARTBEAT_INTERVAL_MS",
)
EXECUTOR_MAX_OPEN_FILES: Final = Setting(
    name="EXECUTOR_MAX_OPEN_FILES",
    default=256,
    parse=integer(at_least=16),
    help="RLIMIT_NOFILE per executor, >= 16",
)
CALL_MAX_LOG_BYTES: Final = Setting(
    name="CALL_MAX_LOG_BYTES",
    default=64 * 1024,
    parse=integer(at_least=0),
    help="what one call may print into the log (bytes); the rest is counted and dropped",
)
CALL_RECORD_MAX_BYTES: Final = Setting(
    name="CALL_RECORD_MAX_BYTES",
    default=DEFAULT_CALL_RECORD_MAX_BYTES,
    parse=integer(at_least=0),
    help=(
        "the IO one call's record keeps while it runs (bytes of JSON; a Worker keeps "
        "failed calls' records, DebugInvoke returns it); 0 = calls are not recorded"
    ),
)
EXECUTOR_SANDBOX: Final = Setting(
    name="EXECUTOR_SANDBOX",
    default=True,
    parse=flag,
    help="refuse network, processes and file writes in functions",
)
# ---- executor confinement (calls/isolation.py) ------------------------------------
EXECUTOR_MEMORY_LIMIT_BYTES: Final = Setting(
    name="EXECUTOR_MEMORY_LIMIT_BYTES",
    default=4 << 30,
    parse=integer(at_least=0),
    help="RLIMIT_AS per executor, 0 = none",
)
EXECUTOR_MAX_FILE_BYTES: Final = Setting(
    name="EXECUTOR_MAX_FILE_BYTES",
    default=1 << 30,
    parse=integer(at_least=0),
    help="RLIMIT_FSIZE per executor, 0 = none",
)
# A blank variable is unset (the default): "-" is how to say "the Worker's own user".
SAME_USER: Final = "-"
EXECUTOR_USER: Final = Setting(
    name="EXECUTOR_USER",
    default="nobody",
    parse=text,
    help=f"the user executors run as when the Worker is root; {SAME_USER} = the Worker's user",
)

EXECUTOR_RUNTIME_DIR: Final = Setting(
    name="EXECUTOR_RUNTIME_DIR",
    default=DEFAULT_RUNTIME_DIR,
    parse=text,
    help="where a root Worker copies the executors' code for EXECUTOR_USER to read",
)


def _read_isolation(reader: ConfigReader) -> IsolationConfig:
    user = reader.get(EXECUTOR_USER)
    if user == SAME_USER:
        user = ""
    # Only a root Worker switches users: for any other, the variable is not used.
    if user and os.geteuid() == 0:
        try:
            pwd.getpwnam(user)
        except KeyError:
            reader.report(EXECUTOR_USER.name, f"names no user on this host ({user!r})")
    runtime_dir = reader.get(EXECUTOR_RUNTIME_DIR)
    if not os.path.isabs(runtime_dir):
        reader.report(EXECUTOR_RUNTIME_DIR.name, f"must be an absolute path ({runtime_dir!r})")
    return IsolationConfig(
        user=user, max_file_bytes=reader.get(EXECUTOR_MAX_FILE_BYTES), runtime_dir=runtime_dir
    )


# ---- the executor watchdog: wall time, recycling ----------------------------------

CALL_WALL_LIMIT_MS: Final[Setting[int | None]] = Setting(
    name="CALL_WALL_LIMIT_MS",
    default=None,
    parse=integer(at_least=1),
    shown_default="3 x CALL_DEADLINE_MS",
    help="wall time one call attempt may hold its executor (time.sleep counts)",
)
EXECUTOR_MAX_CALLS: Final = Setting(
    name="EXECUTOR_MAX_CALLS",
    default=100_000,
    parse=integer(at_least=1),
    help="an executor is replaced after this many calls",
)
EXECUTOR_MAX_RSS_BYTES: Final = Setting(
    name="EXECUTOR_MAX_RSS_BYTES",
    default=1 << 30,
    parse=integer(at_least=1),
    help="an executor is replaced when its RSS stays above this between calls",
)


# ---- function code -----------------------------------------------------------------
FUNCTIONS_DIR: Final = Setting(
    name="FUNCTIONS_DIR",
    default="functions",
    parse=text,
    help="the directory of function modules (.py)",
)
FUNCTIONS_POLL_INTERVAL_MS: Final = Setting(
    name="FUNCTIONS_POLL_INTERVAL_MS",
    default=1000,
    parse=integer(at_least=1),
    help="how often FUNCTIONS_DIR is re-read",
)
IO_MEMORY_SEED_FILE: Final[Setting[str | None]] = Setting(
    name="IO_MEMORY_SEED_FILE",
    default=None,
    parse=optional_text,
    help="a JSON object file seeding io.memory",
)

# ---- traces (calls/call_spans.py) ---------------------------------------------------
BLOCKX_TRACE_CALLS_PER_TASK: Final = Setting(
    name="BLOCKX_TRACE_CALLS_PER_TASK",
    default=10,
    parse=integer(at_least=0),
    help="calls traced per task (the first dispatched) when tracing is on; 0 = none",
)

CALL_SETTINGS: Final[tuple[Setting[Any], ...]] = (
    EXECUTOR_COUNT,
    EXECUTOR_CPUS,
    CALL_DEADLINE_MS,
    TASK_MAX_INFLIGHT_CALLS,
    TASK_INITIAL_INFLIGHT_CALLS,
    MAX_COLLECTED_OUTPUT_BYTES,
    CALL_RETRY_MAX_ATTEMPTS,
    CALL_RETRY_BACKOFF_MS,
    CALL_RETRY_BACKOFF_MAX_MS,
    CALL_RETRY_ON,
    EXECUTOR_HEARTBEAT_INTERVAL_MS,
    EXECUTOR_HEARTBEAT_TIMEOUT_MS,
    EXECUTOR_MAX_OPEN_FILES,
    CALL_MAX_LOG_BYTES,
    CALL_RECORD_MAX_BYTES,
    EXECUTOR_SANDBOX,
    EXECUTOR_MEMORY_LIMIT_BYTES,
    EXECUTOR_MAX_FILE_BYTES,
    EXECUTOR_USER,
    EXECUTOR_RUNTIME_DIR,
    CALL_WALL_LIMIT_MS,
    EXECUTOR_MAX_CALLS,
    EXECUTOR_MAX_RSS_BYTES,
    FUNCTIONS_DIR,
    FUNCTIONS_POLL_INTERVAL_MS,
    IO_MEMORY_SEED_FILE,
    BLOCKX_TRACE_CALLS_PER_TASK,
)


def _cpu_lanes(configured: int | None) -> int:
    """EXECUTOR_CPUS, or the CPUs this process can keep busy (its executors inherit
    its affinity and its cgroup)."""
    return usable_cpus() if configured is None else configured


def load_call_settings(environ: Environ) -> CallSettings:
    """Read and validate the variables above; raise ConfigErrors naming every bad one."""
    reader = ConfigReader(EnvironSource(environ))
    settings = read_call_settings(reader)
    reader.finish()
    return settings


def read_call_settings(reader: ConfigReader) -> CallSettings:
    """The settings above, read through ``reader`` (which collects the bad ones)."""
    retry_on = reader.get(CALL_RETRY_ON)
    backoff = reader.get(CALL_RETRY_BACKOFF_MS)
    backoff_max = reader.get(CALL_RETRY_BACKOFF_MAX_MS)
    if reader.valid(CALL_RETRY_BACKOFF_MS.name, CALL_RETRY_BACKOFF_MAX_MS.name) and (
        backoff_max < backoff
    ):
        reader.report(
            CALL_RETRY_BACKOFF_MAX_MS.name,
            f"must be >= CALL_RETRY_BACKOFF_MS ({backoff_max} < {backoff})",
        )
    heartbeat = reader.get(EXECUTOR_HEARTBEAT_INTERVAL_MS)
    heartbeat_timeout = reader.get(EXECUTOR_HEARTBEAT_TIMEOUT_MS)
    if reader.valid(EXECUTOR_HEARTBEAT_INTERVAL_MS.name, EXECUTOR_HEARTBEAT_TIMEOUT_MS.name) and (
        heartbeat_timeout <= heartbeat
    ):
        reader.report(
            EXECUTOR_HEARTBEAT_TIMEOUT_MS.name,
            f"must be > EXECUTOR_HEARTBEAT_INTERVAL_MS ({heartbeat_timeout} <= {heartbeat})",
        )
    dispatch = DispatchConfig(
        task_max_inflight_calls=reader.get(TASK_MAX_INFLIGHT_CALLS),
        initial_window=reader.get(TASK_INITIAL_INFLIGHT_CALLS),
        call_deadline_ms=reader.get(CALL_DEADLINE_MS),
        max_collected_output_bytes=reader.get(MAX_COLLECTED_OUTPUT_BYTES),
        executor_heartbeat_timeout_ms=heartbeat_timeout,
        retry=CallRetryPolicy(
            max_attempts=reader.get(CALL_RETRY_MAX_ATTEMPTS),
            backoff_ms=backoff,
            backoff_max_ms=backoff_max,
            retry_on=retry_on,
        ),
        call_wall_limit_ms=reader.get(CALL_WALL_LIMIT_MS),
        executor_max_calls=reader.get(EXECUTOR_MAX_CALLS),
        executor_max_rss_bytes=reader.get(EXECUTOR_MAX_RSS_BYTES),
        cpu_lanes=_cpu_lanes(reader.get(EXECUTOR_CPUS)),
    )
    pool = ExecutorPoolConfig(
        count=reader.get(EXECUTOR_COUNT),
        heartbeat_interval_ms=heartbeat,
        memory_limit_bytes=reader.get(EXECUTOR_MEMORY_LIMIT_BYTES),
        max_open_files=reader.get(EXECUTOR_MAX_OPEN_FILES),
        max_log_bytes=reader.get(CALL_MAX_LOG_BYTES),
        sandbox=reader.get(EXECUTOR_SANDBOX),
        isolation=_read_isolation(reader),
    )
    functions_dir = Path(reader.get(FUNCTIONS_DIR))
    if not functions_dir.is_dir():
        reader.report(
            FUNCTIONS_DIR.name, f"must be a directory of .py function modules ({functions_dir})"
        )
    seed = reader.get(IO_MEMORY_SEED_FILE)
    if seed is not None and not Path(seed).is_file():
        reader.report(IO_MEMORY_SEED_FILE.name, f"must be a JSON object file ({seed})")
    return CallSettings(
        engine=CallEngineConfig(
            dispatch=dispatch,
            pool=pool,
            trace_calls_per_task=reader.get(BLOCKX_TRACE_CALLS_PER_TASK),
        ),
        functions_dir=functions_dir,
        functions_poll_interval_ms=reader.get(FUNCTIONS_POLL_INTERVAL_MS),
        memory_seed_file=Path(seed) if seed is not None else None,
        record_max_bytes=reader.get(CALL_RECORD_MAX_BYTES),
    )
