"""The executor protocol's side of the CallEngine: the dispatcher's commands as
executor messages, and the executor's messages as what the engine records."""

from __future__ import annotations

from typing import assert_never

from blockx_core.dispatch import ResumeWithResult, SendCalls, SubCallFailed, SubCallReturned
from blockx_core.failures import call_failure_kind
from blockx_executor import protocol as wire
from blockx_server.calls.call_spans import CallSpans
from blockx_server.io.errors import IoFailed, IoOk, IoOutcome


def execute_calls(
    command: SendCalls, debug: bool, traces: list[str | None] | None
) -> wire.ExecuteCalls:
    """The ExecuteCalls of a SendCalls; ``traces`` as ``CallSpans.traces`` gave them."""
    return wire.ExecuteCalls(
        command.task_id,
        command.code,
        command.function,
        command.budget_ms * 1000,
        command.call_ids,
        command.args,
        debug,
        command.kwargs,
        None
        if command.contexts is None
        else [
            None if c is None else wire.CallContext(c.block_number, c.block_hash)
            for c in command.contexts
        ],
        traces,
    )


def resume_with_result(command: ResumeWithResult) -> wire.ResumeCall:
    """A sub-call ended: its parent resumes with the value or the failure."""
    match command.result:
        case SubCallReturned(value_json=value_json):
            return wire.ResumeCall(command.call_id, True, value_json)
        case SubCallFailed(failure=failure):
            return wire.ResumeCall(
                command.call_id,
                False,
                b"null",
                failure.kind.value,
                failure.message,
                retryable=failure.retryable,
            )
        case _:
            assert_never(command.result)


def resume_with_io(call_id: int, outcome: IoOutcome) -> wire.ResumeCall:
    """An IO request was answered: the call resumes with the answer."""
    match outcome:
        case IoOk():
            return wire.ResumeCall(call_id, True, outcome.value_json, io_us=outcome.io_us)
        case IoFailed():
            return wire.ResumeCall(
                call_id,
                False,
                error_kind=outcome.kind.value,
                error=outcome.message,
                io_us=outcome.io_us,
                retryable=outcome.retryable,
            )
        case _:
            assert_never(outcome)


def trace_message(spans: CallSpans, message: wire.FromExecutor) -> None:
    """What an executor's message tells the open call spans."""
    match message:
        case wire.CallsCompleted():
            spans.completed(message.call_ids)
        case wire.CallFailed():
            spans.failed(message.call_id, call_failure_kind(message.kind).value, message.message)
        case wire.IoRequested():
            spans.waiting(
                message.call_id, "io", {"blockx.backend": message.backend, "blockx.op": message.op}
            )
        case wire.SubCallRequested():
            spans.waiting(message.call_id, "sub-call", {"blockx.function": message.function})
        case wire.Hello() | wire.ExecutorHeartbeat() | wire.CallOutput() | wire.CallTraced():
            pass
        case _:
            assert_never(message)
