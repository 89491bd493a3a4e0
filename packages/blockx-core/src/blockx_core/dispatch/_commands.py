"""What the DispatcherCore asks its adapter to do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from blockx_core.calls import CallContext, RootOutput
from blockx_core.dispatch._failures import CallFailure
from blockx_core.failures import Failure, FailureCode
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


class SubCallReturned(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A sub-call's value, as JSON."""

    value_json: bytes


class SubCallFailed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A sub-call failed for good: its kind (a ``CallFailureKind``), its message, and
    whether running it again might succeed."""

    failure: Failure


SubCallResult = SubCallReturned | SubCallFailed


class ResumeWithResult(msgspec.Struct, frozen=True, kw_only=True):
    """A sub-call ended: resume its parent with what it returned or how it failed."""

    executor_id: str
    call_id: int
    result: SubCallResult


class ResumeWithIo(msgspec.Struct, frozen=True, kw_only=True):
    """Send the call its IO answer (the one the adapter has for it): it resumes."""

    executor_id: str
    call_id: int


class AbortCall(msgspec.Struct, frozen=True, kw_only=True):
    """The Worker failed this call's attempt itself (its IO request was a write): the
    executor drops the suspended call; ``failure`` is how the attempt ended."""

    executor_id: str
    call_id: int
    failure: Failure


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


class CallsConverged(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The Calls phase of a task ended with every root call done: ``outputs`` are
    their results in root order, each tagged with its index and context."""

    task_id: str
    outputs: Sequence[RootOutput] = ()


class CallsFailed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The Calls phase of a task failed.

    ``failure_code`` says why (CALL_FAILED: a root call failed for good, and
    ``failed_call`` says which and how; OUTPUT_BYTES_EXCEEDED: the outputs grew too
    large); ``failure_message`` is the whole text for people. ``call_failures`` lists
    every failed call attempt so far (bounded; ``call_failures_omitted`` counts the
    rest), the retried ones and failed sub-calls included.
    """

    task_id: str
    failure_code: FailureCode
    failure_message: str
    failed_call: CallFailure | None = None
    call_failures: tuple[CallFailureSummary, ...] = ()
    call_failures_omitted: int = 0

    @property
    def failure(self) -> Failure:
        return Failure.of(self.failure_code, self.failure_message)


ConvergeTaskCalls = CallsConverged | CallsFailed
"""How the Calls phase of a task ended; match it (``assert_never`` the rest)."""

DispatchCommand = (
    SendCalls
    | CancelCalls
    | ResumeWithResult
    | ResumeWithIo
    | AbortCall
    | KillExecutor
    | RetireExecutor
    | CallsConverged
    | CallsFailed
)
