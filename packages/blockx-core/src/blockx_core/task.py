"""A task as clients see it: its input, its states, its result."""

from __future__ import annotations

import enum
from typing import Final

import msgspec

from blockx_core.errors import FailureCode


class TaskState(enum.Enum):
    """The states a client can see; internal phases all fold into RUNNING."""

    ALLOCATED = "ALLOCATED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    # What a client reads for a task the Worker does not know (never submitted there,
    # its result expired, or a slot that expired before SubmitTask); the wire spells
    # it UNSPECIFIED and the update's ``error`` says which. No Worker core ever holds
    # a task in it; clients and the CLI call it NOT_FOUND, like the gRPC status.
    NOT_FOUND = "NOT_FOUND"

    @property
    def is_terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.NOT_FOUND)


class PluginSpec(msgspec.Struct, frozen=True, kw_only=True):
    """``{type, config}`` of a Call Builder or a Writer Plugin; ``config`` is JSON text."""

    type: str
    config: str = "{}"


class TaskInput(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    function_call_config: PluginSpec
    # At most one Writer Plugin per task; None = none.
    result_handler: PluginSpec | None = None
    # 0 = the Worker default (TASK_DEADLINE_MS).
    task_timeout_ms: int = 0


class PluginResult(msgspec.Struct, frozen=True, kw_only=True):
    plugin_name: str
    success: bool
    failure_code: FailureCode | None = None
    # JSON bytes; for ReturnValueResultHandler the array of the call outputs.
    result: bytes = b""
    failure_message: str = ""


class TaskResult(msgspec.Struct, frozen=True, kw_only=True):
    """The terminal result (``TaskResult{success, executeResult}`` on the wire)."""

    success: bool
    failure_code: FailureCode | None = None
    retryable: bool = False
    failure_message: str = ""
    plugin_results: tuple[PluginResult, ...] = ()


# Whether resubmitting may help, for the codes whose answer does not depend on the
# failure itself. BUILDER_FAILED and PLUGIN_FAILED take it from the error.
RETRYABLE: Final[dict[FailureCode, bool]] = {
    FailureCode.ACTIVATION_FAILED: True,
    FailureCode.IO_SCOPE_FAILED: True,
    FailureCode.SLOT_LOST: True,
    FailureCode.BUILDER_NOT_FOUND: False,
    FailureCode.CALL_FAILED: False,
    FailureCode.OUTPUT_BYTES_EXCEEDED: False,
    FailureCode.PLUGIN_NOT_FOUND: False,
    FailureCode.CANCELLED: True,
    FailureCode.TIMED_OUT: True,
    FailureCode.WATCH_DISCONNECTED: False,
}
