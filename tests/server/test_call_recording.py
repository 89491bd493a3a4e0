"""A run's call records as the engine feeds them: requests and answers kept per root
call while it runs, dropped when the call succeeds (a Worker's run) or runs again,
kept for the call that fails the run, and bounded exactly when the record is made."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from blockx_core.call_record import (
    CallRecord,
    RecordedError,
    RecordedFailure,
    RecordedIo,
    decode_record,
    encode_record,
)
from blockx_core.code_view import build_snapshot
from blockx_core.dispatch import CallFailure
from blockx_core.failures import CallFailureKind, IoErrorKind
from blockx_executor import protocol as wire
from blockx_server.calls.recording import RunRecords, failure_ending
from blockx_server.io.errors import IoFailed, IoOk

SNAPSHOT = build_snapshot(
    3,
    {
        "fns": "from helpers import twice\n\ndef f(x):\n    return twice(x)\n",
        "helpers": "def twice(x):\n    return 2 * x\n",
        "other": "def g(x):\n    return x\n",
        "unrelated": "def h(x):\n    return x\n",
    },
)
FAILURE = CallFailure(index=1, kind=CallFailureKind.USER_ERROR, message="boom", args=[7])


def read(record: CallRecord | None) -> CallRecord:
    """The record as a reader gets it (its answers are the backends' bytes until then)."""
    assert record is not None
    return decode_record(encode_record(record))


def root(call_id: int, index: int, args: list[Any]) -> tuple[int, int, list[Any], None]:
    return call_id, index, args, None


def get(key: str) -> wire.IoRequested:
    return wire.IoRequested(call_id=0, backend="memory", op="get", args=[key], kwargs={})


def ok(value: bytes) -> IoOk:
    return IoOk(value_json=value)


def test_the_failed_call_keeps_its_io_in_order_with_its_failure() -> None:
    records = RunRecords(4096, keep_successes=False)
    records.io(root(10, 0, [6]), get("a"), ok(b"1"))
    records.io(root(11, 1, [7]), get("b"), ok(b'{"v":2}'))
    records.io(root(11, 1, [7]), get("c"), IoFailed(kind=IoErrorKind.NOT_FOUND, message="no c"))
    records.succeeded(10, b"12")
    records.failed(FAILURE)
    assert records.open == {}
    record = records.record(
        1, function="f", snapshot=SNAPSHOT, chain="main", ending=failure_ending(FAILURE)
    )
    assert record is not None
    assert (record.function, record.args, record.chain, record.code_epoch) == ("f", [7], "main", 3)
    assert record.code_digest == SNAPSHOT.digest
    assert list(record.code) == ["fns", "helpers"]  # its module and what it imports
    assert record.failure == RecordedFailure(kind=CallFailureKind.USER_ERROR, message="boom")
    assert read(record).io == [
        RecordedIo(backend="memory", op="get", args=["b"], answer={"v": 2}),
        RecordedIo(
            backend="memory",
            op="get",
            args=["c"],
            error=RecordedError(kind=IoErrorKind.NOT_FOUND, message="no c"),
        ),
    ]
    # A Worker's run kept nothing of the call that succeeded.
    assert records.record(0, function="f", snapshot=SNAPSHOT, chain="", ending=b"12") is None


def test_a_call_sent_again_records_only_its_new_attempt() -> None:
    records = RunRecords(4096, keep_successes=False)
    records.io(root(11, 1, [7]), get("first"), ok(b"1"))
    records.resent(11)
    records.io(root(11, 1, [7]), get("second"), ok(b"2"))
    records.failed(FAILURE)
    record = records.record(
        1, function="f", snapshot=SNAPSHOT, chain="", ending=failure_ending(FAILURE)
    )
    assert record is not None
    assert [entry.args for entry in record.io] == [["second"]]


def test_a_failed_call_without_io_is_recorded_from_its_failure() -> None:
    records = RunRecords(4096, keep_successes=False)
    records.failed(FAILURE)
    record = records.record(
        1, function="f", snapshot=SNAPSHOT, chain="", ending=failure_ending(FAILURE)
    )
    assert record is not None
    assert (record.args, record.io, record.truncated) == ([7], [], False)


def test_sub_calls_modules_are_part_of_the_code() -> None:
    records = RunRecords(4096, keep_successes=True)
    records.modules.add("other")
    record = read(
        records.record(0, function="f", snapshot=SNAPSHOT, chain="", ending=b"2", args=[1])
    )
    assert list(record.code) == ["fns", "helpers", "other"]
    assert (record.args, record.result, record.failure) == ([1], 2, None)


def test_successes_are_kept_when_asked() -> None:
    records = RunRecords(4096, keep_successes=True)
    records.io(root(10, 0, [6]), get("a"), ok(b"1"))
    records.succeeded(10, b"12")
    record = read(records.record(0, function="f", snapshot=SNAPSHOT, chain="", ending=b"12"))
    assert (record.io, record.result) == (
        [RecordedIo(backend="memory", op="get", args=["a"], answer=1)],
        12,
    )


@pytest.mark.parametrize("answers", [1, 5, 40])
def test_the_record_is_bounded_exactly_by_its_bytes(answers: int) -> None:
    value = b'"' + b"x" * 100 + b'"'
    one = len(msgspec.json.encode(RecordedIo(backend="memory", op="get", args=["k"], answer=0)))
    bound = 5 * (one + len(value) - 1)  # five entries fit, to the byte
    records = RunRecords(bound, keep_successes=False)
    for _ in range(answers):
        records.io(root(11, 1, [7]), get("k"), ok(value))
    records.failed(FAILURE)
    record = records.record(
        1, function="f", snapshot=SNAPSHOT, chain="", ending=failure_ending(FAILURE)
    )
    assert record is not None
    assert len(record.io) == min(answers, 5)
    assert record.truncated is (answers > 5)
    assert sum(len(msgspec.json.encode(entry)) for entry in record.io) <= bound
    assert records.kept_bytes(1) <= bound


def test_a_function_that_does_not_exist_has_no_record() -> None:
    records = RunRecords(4096, keep_successes=False)
    missing = CallFailure(index=0, kind=CallFailureKind.FUNCTION_NOT_FOUND, message="no f")
    records.failed(missing)
    ending = failure_ending(missing)
    assert records.record(0, function="f", snapshot=SNAPSHOT, chain="", ending=ending) is None
