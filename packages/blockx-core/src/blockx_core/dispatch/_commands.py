"""What the DispatcherCore asks its adapter to do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from blockx_core.calls import CallContext, RootOutput
from blockx_core.dispatch._failures import CallFailure
from blockx_core.failures import FailureCode
from blockx_core.task import CallFailureSummary


class SendCalls(msgspec.Struct, frozen=True, kw_only=True):
    """Run these calls (all of one function) on one executor, as columns.

    ``kwargs`` and ``contexts`` are None when no call of the batch has keyword
    arguments or a context, so the common batch carries nothing per call but its
    id and positional arguments.
    """

    executor_id: str
    task_id: str
    code: str
    function: str
    budget_ms: int
    call_ids: list[int]
    args: list[list[Any]]
    kwargs: list[dict[str, Any]] | None = None
    contexts: list[CallContext | None] | None = None


class CancelCalls(msgspec.Struct, frozen=True, kw_only=True):
    """Drop these calls on that executor; their results are no longer wanted."""

    executor_id: str
    call_ids: list[int]


class ResumeWithResult(msgspec.Struct, frozen=True, kw_only=True):
    """A sub-call ended: resume its parent with the value (JSON) or the failure
    (``retryable``: whether running the sub-call again might succeed)."""

    executor_id: str
    call_id: int
    ok: bool
    value_json: bytes = b"null"
    error_kind: str = ""
    error: str = ""
    retryable: bool = False


class KillExecutor(msgspec.Struct, frozen=True, kw_only=True):
    """Kill this executor process (its calls have already been rescheduled);
    ``over_budget_call_id``: the call it held that failed BUDGET_EXCEEDED, if one did
    (every other call it held failed EXECUTOR_LOST)."""

    executor_id: str
    reason: str
    over_budget_call_id: int | None = None


class RetireExecutor(msgspec.Struct, frozen=True, kw_only=True):
    """Stop this executor and start a fresh one: it has served its calls (too many
    of them, or it grew too large) and holds none now."""

    executor_id: str
    reason: str


class ConvergeTaskCalls(msgspec.Struct, frozen=True, kw_only=True):
    """The Calls phase of a task ended.

    ``outputs`` are the root calls' results in root order, each tagged with its
    index and context (empty unless ``success``). A task that a root call failed
    (CALL_FAILED) says which call and how in ``failed_call``; ``failure_message``
    is the whole text for people. A failed phase also lists every failed call
    attempt so far in ``call_failures`` (bounded; ``call_failures_omitted`` counts
    the rest), the retried ones and failed sub-calls included.
    """

    task_id: str
    success: bool
    failure_code: FailureCode | None = None
    failure_message: str = ""
    failed_call: CallFailure | None = None
    outputs: Sequence[RootOutput] = ()
    call_failures: tuple[CallFailureSummary, ...] = ()
    call_failures_omitted: int = 0


DispatchCommand = (
    SendCalls | CancelCalls | ResumeWithResult | KillExecutor | RetireExecutor | ConvergeTaskCalls
)
