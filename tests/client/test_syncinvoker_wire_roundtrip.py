"""The Sync Invoker encodes and the client decodes an invoke's and a precheck's
failure into the core's enums: the call's ``CallFailureKind``, the run's
``FailureCode`` where no call is to blame, a ``PrecheckFailure``; None where there
is none, and where a newer server sends a code this client does not know (its
message kept)."""

from __future__ import annotations

import pytest

from blockx_client._convert import debug_invocation_from_pb, invocation_from_pb, precheck_from_pb
from blockx_client.errors import BlockxError
from blockx_client.models import Invocation, Precheck
from blockx_core.call_record import CallRecord, RecordedIo, encode_record
from blockx_core.failures import CallFailureKind, Failure, FailureCode, PrecheckFailure
from blockx_core.signature import PrecheckResult
from blockx_server.syncinvoker.convert import (
    debug_invoke_response,
    invoke_response,
    precheck_response,
)
from blockx_server.syncinvoker.outcome import InvokeFailed, InvokeOutcome, InvokeSucceeded

INVOKES = [
    # (the server's outcome, what the client reads: success, value, code, message, retryable)
    (InvokeSucceeded(call_id="c", result=b"[1]"), (True, [1], None, "", False)),
    (
        InvokeFailed(call_id="c", failure=Failure.of(CallFailureKind.USER_ERROR, "boom")),
        (False, None, CallFailureKind.USER_ERROR, "boom", False),
    ),
    (
        InvokeFailed(call_id="c", failure=Failure.of(CallFailureKind.EXECUTOR_LOST, "gone")),
        (False, None, CallFailureKind.EXECUTOR_LOST, "gone", True),
    ),
    (
        InvokeFailed(
            call_id="c", failure=Failure(FailureCode.OUTPUT_BYTES_EXCEEDED, "too much", False)
        ),
        (False, None, FailureCode.OUTPUT_BYTES_EXCEEDED, "too much", False),
    ),
]


@pytest.mark.parametrize(("outcome", "expected"), INVOKES)
def test_an_invoke_reads_back_with_its_kind(
    outcome: InvokeOutcome,
    expected: tuple[bool, object, CallFailureKind | FailureCode | None, str, bool],
) -> None:
    read: Invocation = invocation_from_pb(invoke_response(outcome))
    assert (
        read.success,
        read.value,
        read.failure_code,
        read.failure_message,
        read.retryable,
    ) == expected


def test_an_invoke_code_this_client_does_not_know_reads_as_none() -> None:
    pb = invoke_response(
        InvokeFailed(call_id="c", failure=Failure.of(CallFailureKind.USER_ERROR, "boom"))
    )
    pb.failure_code = "A_NEWER_SERVERS_KIND"
    read = invocation_from_pb(pb)
    assert (read.success, read.failure_code, read.failure_message) == (False, None, "boom")


PRECHECKS = [
    (PrecheckResult(epoch=3, signature="(x)"), (True, None, "")),
    *(
        (
            PrecheckResult(epoch=3, failure=failure, message="why"),
            (False, failure, "why"),
        )
        for failure in PrecheckFailure
    ),
]


@pytest.mark.parametrize(("result", "expected"), PRECHECKS)
def test_a_precheck_reads_back_with_its_failure(
    result: PrecheckResult, expected: tuple[bool, PrecheckFailure | None, str]
) -> None:
    read: Precheck = precheck_from_pb(precheck_response(result))
    assert (read.ok, read.failure_code, read.message) == expected
    assert read.code_epoch == 3


def test_a_precheck_failure_this_client_does_not_know_reads_as_none() -> None:
    pb = precheck_response(
        PrecheckResult(epoch=3, failure=PrecheckFailure.COMPILE_ERROR, message="why")
    )
    pb.failure_code = "A_NEWER_SERVERS_CHECK"
    read = precheck_from_pb(pb)
    assert (read.ok, read.failure_code, read.message) == (False, None, "why")


RECORD = CallRecord(
    function="f",
    args=[1],
    chain="main",
    code_epoch=3,
    code={"fns": "def f(x):\n    return x\n"},
    io=[RecordedIo(backend="memory", op="get", args=["k"], answer={"v": 1})],
    result=2,
)


@pytest.mark.parametrize(
    ("sent", "expected"),
    [(encode_record(RECORD), RECORD), (b"", None)],
)
def test_a_debug_invoke_reads_back_with_its_record(
    sent: bytes, expected: CallRecord | None
) -> None:
    outcome = InvokeSucceeded(call_id="c", result=b"2")
    read = debug_invocation_from_pb(debug_invoke_response(outcome, "out", [], sent))
    assert (read.value, read.output, read.record) == (2, "out", expected)


def test_a_record_this_client_cannot_read_is_a_client_error() -> None:
    outcome = InvokeSucceeded(call_id="c", result=b"2")
    sent = encode_record(RECORD).replace(b"blockx-call-record/1", b"blockx-call-record/9")
    with pytest.raises(BlockxError, match="cannot read: call record format"):
        debug_invocation_from_pb(debug_invoke_response(outcome, "", [], sent))
