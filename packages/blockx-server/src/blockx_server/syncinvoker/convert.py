"""The Sync Invoker's only protobuf conversion: request arguments in, answers out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, assert_never

import msgspec

from blockx_core.signature import PrecheckResult
from blockx_proto import syncinvoker_v1 as pb
from blockx_server.runtime.json_bounds import decode_json
from blockx_server.syncinvoker.outcome import (
    InvokeFailed,
    InvokeOutcome,
    InvokeSucceeded,
    IoTraceRecord,
)

_JSON_TYPES: Final[Mapping[type, str]] = {
    dict: "object",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def decode_args(text: str) -> list[Any] | str:
    """The positional arguments of a JSON array text, or why they are refused."""
    try:
        args = decode_json(text)
    except msgspec.DecodeError as exc:
        return f'args must be JSON array text, e.g. ["ct2", 1]: {exc}'
    if not isinstance(args, list):
        return (
            f'args must be a JSON array of the positional arguments, e.g. ["ct2", 1] '
            f"(got a JSON {_JSON_TYPES.get(type(args), type(args).__name__)})"
        )
    try:
        # Arguments travel to the executor as msgpack, which has no room for huge ints.
        msgspec.msgpack.encode(args)
    except (OverflowError, TypeError, ValueError) as exc:
        return f"args cannot be passed to a function: {exc}"
    return args


def invoke_response(outcome: InvokeOutcome) -> pb.InvokeResponse:
    match outcome:
        case InvokeSucceeded(result=result):
            success, failure_code, failure_message, retryable = True, "", "", False
        case InvokeFailed(failure=failure):
            result, success = b"", False
            failure_code, failure_message = failure.kind.value, failure.message
            retryable = failure.retryable
        case _:
            assert_never(outcome)
    return pb.InvokeResponse(
        call_id=outcome.call_id,
        success=success,
        result=result,
        failure_code=failure_code,
        failure_message=failure_message,
        retryable=retryable,
        durations=pb.CallDurations(
            queue_us=outcome.queue_us, cpu_us=outcome.cpu_us, io_us=outcome.io_us
        ),
        code_epoch=outcome.code_epoch,
    )


def debug_invoke_response(
    outcome: InvokeOutcome, output: str, trace: list[IoTraceRecord], record: bytes = b""
) -> pb.DebugInvokeResponse:
    return pb.DebugInvokeResponse(
        response=invoke_response(outcome),
        output=output,
        call_record=record,
        io_trace=[
            pb.IoTraceEntry(
                backend=r.backend,
                op=r.op,
                request=r.request,
                duration_us=r.duration_us,
                success=r.success,
                error=r.error,
                cached=r.cached,
                shared=r.shared,
                queue_us=r.queue_us,
            )
            for r in trace
        ],
    )


def precheck_response(result: PrecheckResult) -> pb.PrecheckResponse:
    return pb.PrecheckResponse(
        ok=result.ok,
        failure_code="" if result.failure is None else result.failure.value,
        message=result.message,
        signature=result.signature,
        is_async=result.is_async,
        code_epoch=result.epoch,
    )
