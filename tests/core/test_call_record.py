"""Call records: one readable JSON document that reads back equal, bounded as it
grows, refused with a reason when it is no record, and answered from in replay."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx_core.call_record import (
    CALL_RECORD_FORMAT,
    CallRecord,
    InvalidRecord,
    RecordBuilder,
    RecordedAnswers,
    RecordedError,
    RecordedFailure,
    RecordedIo,
    decode_record,
    encode_record,
)
from blockx_core.failures import CallFailureKind, IoErrorKind

GET = RecordedIo(backend="memory", op="get", args=["k"], answer={"v": 1})
FAILED = RecordedIo(
    backend="rpc",
    op="call",
    args=[1],
    kwargs={"block": "latest"},
    error=RecordedError(kind=IoErrorKind.UNAVAILABLE, message="slow"),
)

RECORDS = [
    CallRecord(function="f", args=[]),
    CallRecord(function="f", args=[1, "x"], kwargs={"y": None}, result=[1, 2]),
    CallRecord(
        function="g",
        args=[{"a": [1.5, True]}],
        chain="main",
        code_epoch=7,
        code_digest="ab" * 32,
        code={"fns": "def g(x):\n    return x\n"},
        io=[GET, FAILED],
        truncated=True,
        failure=RecordedFailure(kind=CallFailureKind.USER_ERROR, message="Traceback ..."),
    ),
]


@pytest.mark.parametrize("record", RECORDS)
def test_a_record_reads_back_equal_with_its_format_first(record: CallRecord) -> None:
    document = encode_record(record)
    assert document.startswith(b'{\n  "format": "' + CALL_RECORD_FORMAT.encode() + b'",\n')
    assert document.endswith(b"}\n")
    assert decode_record(document) == record
    assert decode_record(document.decode()) == record
    compact = encode_record(record, indent=0)
    assert compact.startswith(b'{"format":"' + CALL_RECORD_FORMAT.encode() + b'",')
    assert b"\n" not in compact
    assert decode_record(compact) == record


def test_answers_kept_as_raw_json_encode_as_the_values_they_are() -> None:
    raw = RecordedIo(backend="memory", op="get", args=["k"], answer=msgspec.Raw(b'{"v":1}'))
    record = CallRecord(function="f", args=[], io=[raw], result=msgspec.Raw(b"[1,2]"))
    assert decode_record(encode_record(record)) == CallRecord(
        function="f", args=[], io=[GET], result=[1, 2]
    )


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (b"[]", "not a call record"),
        (b"{", "not a call record"),
        (b'{"args": []}', "not a call record"),
        (b'{"function": "f", "args": [], "format": "x/2"}', "format 'x/2' is not"),
        (b'{"function": "f", "args": [], "io": [{"backend": "b"}]}', "not a call record"),
    ],
)
def test_what_is_no_record_is_refused_saying_why(document: bytes, reason: str) -> None:
    with pytest.raises(InvalidRecord, match=reason):
        decode_record(document)


@pytest.mark.parametrize(
    ("max_bytes", "kept", "truncated"),
    [(0, 0, True), (len(msgspec.json.encode(GET)), 1, True), (10_000, 3, False)],
)
def test_a_builder_keeps_entries_up_to_its_bytes(
    max_bytes: int, kept: int, truncated: bool
) -> None:
    builder = RecordBuilder(max_bytes)
    added = [builder.add(GET) for _ in range(3)]
    assert (len(builder.io), builder.truncated) == (kept, truncated)
    assert added == [True] * kept + [False] * (3 - kept)
    assert builder.size <= max_bytes


def test_a_builder_stops_at_the_first_entry_that_does_not_fit() -> None:
    builder = RecordBuilder(len(msgspec.json.encode(GET)) + 10)
    assert builder.add(GET)
    assert not builder.add(FAILED)  # too big for what is left
    assert not builder.add(RecordedIo(backend="m", op="o", args=[]))  # small, but later
    assert builder.io == [GET]


def test_answers_come_in_order_then_the_last_again() -> None:
    first = RecordedIo(backend="memory", op="get", args=["k"], answer=1)
    second = RecordedIo(backend="memory", op="get", args=["k"], answer=2)
    answers = RecordedAnswers([first, FAILED, second])
    assert [answers.answer("memory", "get", ["k"], {}) for _ in range(3)] == [
        first,
        second,
        second,
    ]
    # Keyword order does not matter; a request not recorded gets None.
    assert answers.answer("rpc", "call", [1], {"block": "latest"}) == FAILED
    assert answers.answer("memory", "get", ["other"], {}) is None


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
ARGS = st.lists(JSON, max_size=4)
KWARGS = st.dictionaries(st.text(min_size=1, max_size=8), JSON, max_size=3)
IO = st.builds(
    RecordedIo,
    backend=st.text(min_size=1, max_size=10),
    op=st.text(min_size=1, max_size=10),
    args=ARGS,
    kwargs=KWARGS,
    answer=JSON,
    error=st.none()
    | st.builds(RecordedError, kind=st.sampled_from(IoErrorKind), message=st.text(max_size=20)),
)
RECORD = st.builds(
    CallRecord,
    function=st.text(min_size=1, max_size=20),
    args=ARGS,
    kwargs=KWARGS,
    chain=st.text(max_size=10),
    code_epoch=st.integers(min_value=0, max_value=2**40),
    code=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=40), max_size=2),
    io=st.lists(IO, max_size=4),
    truncated=st.booleans(),
    result=JSON,
    failure=st.none()
    | st.builds(
        RecordedFailure, kind=st.sampled_from(CallFailureKind), message=st.text(max_size=40)
    ),
)


@given(RECORD)
def test_any_record_reads_back_equal(record: CallRecord) -> None:
    assert decode_record(encode_record(record)) == record


@given(st.lists(IO, max_size=6), st.integers(min_value=0, max_value=600))
def test_a_builder_never_holds_more_than_its_bytes(entries: list[Any], max_bytes: int) -> None:
    builder = RecordBuilder(max_bytes)
    for entry in entries:
        builder.add(entry)
    assert builder.size == sum(len(msgspec.json.encode(e)) for e in builder.io) <= max_bytes
    assert builder.io == entries[: len(builder.io)]
    assert builder.truncated is (len(builder.io) < len(entries))
