"""blockx_core: the pure, sans-IO part of BlockX.

Nothing here reads a clock, sleeps, or touches a socket or a file: every
decision method takes ``now_ms`` and returns values. Adapters in
``blockx_server`` perform the IO.
"""

from blockx_core.errors import BlockxUsageError, ErrorCode, InvalidConfig
from blockx_core.failures import FailureCode
from blockx_core.heartbeat import (
    InvalidHeartbeat,
    WorkerHeartbeat,
    decode_heartbeat,
    encode_heartbeat,
)
from blockx_core.ids import SlotId, TaskId, WorkerAddr
from blockx_core.registry import (
    InvalidRegistryPrefix,
    RegistryFormat,
    RegistryKind,
    RegistryPrefix,
    parse_registry_prefix,
)
from blockx_core.task import TaskState

__all__ = [
    "BlockxUsageError",
    "ErrorCode",
    "FailureCode",
    "InvalidConfig",
    "InvalidHeartbeat",
    "InvalidRegistryPrefix",
    "RegistryFormat",
    "RegistryKind",
    "RegistryPrefix",
    "SlotId",
    "TaskId",
    "TaskState",
    "WorkerAddr",
    "WorkerHeartbeat",
    "decode_heartbeat",
    "encode_heartbeat",
    "parse_registry_prefix",
]
