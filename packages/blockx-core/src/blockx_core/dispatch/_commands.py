"""What the DispatcherCore asks its adapter to do."""

from __future__ import annotations

from typing import Any

import msgspec

from blockx_core.errors import FailureCode


class SendCalls(msgspec.Struct, frozen=True, kw_only=True):
    """Run these calls (all of one function) on one executor."""

    executor_id: str
    task_id: str
    code: str
    function: str
    budget_ms: int
    call_ids: list[int]
    args: list[list[Any]]


class CancelCalls(msgspec.Struct, frozen=True, kw_only=True):
    """Drop these calls on that executor; their results are no longer wanted."""

    executor_id: str
    call_ids: list[int]


class ResumeWithResult(msgspec.Struct, frozen=True, kw_only=True):
    """A sub-call ended: resume its parent with the value (JSON) or the failure."""

    executor_id: str
    call_id: int
    ok: bool
    value_json: bytes = b"null"
    error_kind: str = ""
    error: str = ""


class KillExecutor(msgspec.Struct, frozen=True, kw_only=True):
    """Kill this executor process (its calls have already been rescheduled)."""

    executor_id: str
    reason: str


class ConvergeTaskCalls(msgspec.Struct, frozen=True, kw_only=True):
    """The Calls phase of a task ended. ``outputs`` are the root calls' JSON results
    in root order (empty unless ``success``)."""

    task_id: str
    success: bool
    failure_code: FailureCode | None = None
    failure_message: str = ""
    outputs: list[bytes] = msgspec.field(default_factory=list)


DispatchCommand = SendCalls | CancelCalls | ResumeWithResult | KillExecutor | ConvergeTaskCalls
