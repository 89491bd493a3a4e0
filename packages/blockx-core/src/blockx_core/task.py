"""A task as clients see it: its input, its states, its result."""

from __future__ import annotations

import enum
import json
from typing import Any, Final

import msgspec

from blockx_core.failures import CallFailureKind, FailureCode


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


class PluginConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``{type, config}`` of a Call Builder or a Writer Plugin. ``config`` is any JSON
    value, and a ``str`` is JSON text already: a client writes a value and sends
    ``config_text()``; the Worker keeps the wire's text as it came, and its Builder
    and Writer phases decode it under their own bounds."""

    type: str
    config: Any = "{}"

    def config_text(self) -> str:
        return self.config if isinstance(self.config, str) else json.dumps(self.config)


class TaskInput(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    function_call_config: PluginConfig
    # At most one Writer Plugin per task; None = none.
    result_handler: PluginConfig | None = None
    # 0 = the Worker default (TASK_DEADLINE_MS).
    task_timeout_ms: int = 0
    # The root function the builder's config names (its "function" key), as the
    # Worker's decoder read it: what ListTasks shows and filters on. Not on the wire.
    function: str = ""
    # The chain its Builder config names (its "chain" key), "" when none: what
    # ListTasks shows. Not on the wire.
    chain: str = ""


class PluginResult(msgspec.Struct, frozen=True, kw_only=True):
    plugin_name: str
    success: bool
    failure_code: FailureCode | None = None
    # JSON bytes; for ReturnValueResultHandler the array of the call outputs.
    result: bytes = b""
    failure_message: str = ""


# A failed task keeps a summary of at most this many failed call attempts (the
# first ones); it counts the rest.
MAX_CALL_FAILURES: Final = 100
# Each summary keeps this much of its message (a traceback can be long).
CALL_FAILURE_MESSAGE_CHARS: Final = 1000


class CallFailureSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One failed call attempt of a task: a root call (``root_index >= 0``) or a
    sub-call (-1), its function, kind and message (the first
    ``CALL_FAILURE_MESSAGE_CHARS``), its attempt number and whether it was tried
    again after this attempt (``retried``). Clients read the same type."""

    root_index: int
    function: str
    kind: CallFailureKind
    message: str
    attempt: int = 1
    retried: bool = False


class TaskResult(msgspec.Struct, frozen=True, kw_only=True):
    """The terminal result (``TaskResult{success, executeResult}`` on the wire).

    A task failed in its Calls phase lists its failed call attempts in
    ``call_failures`` (the first ``MAX_CALL_FAILURES``; ``call_failures_omitted``
    counts the others); ``failure_message`` is the one that failed the task."""

    success: bool
    failure_code: FailureCode | None = None
    retryable: bool = False
    failure_message: str = ""
    plugin_results: tuple[PluginResult, ...] = ()
    call_failures: tuple[CallFailureSummary, ...] = ()
    call_failures_omitted: int = 0


# The failure message of a task a client cancelled (CancelTask): FAILED, CANCELLED,
# not retryable, so that no driver resubmits what an operator stopped. A task
# cancelled because its Worker shut down is CANCELLED too, but retryable.
CANCELLED_BY_CLIENT: Final = "cancelled by a client"


def cancelled_by_client(result: TaskResult | None) -> bool:
    """Whether ``result`` is that of a task a client cancelled (a drain's CANCELLED
    is retryable: another Worker may run it)."""
    return (
        result is not None and result.failure_code is FailureCode.CANCELLED and not result.retryable
    )
