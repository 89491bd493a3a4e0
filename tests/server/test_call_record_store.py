"""The Worker's store of failed calls' records: kept for the retention of their
tasks' results, bounded per task and in bytes (oldest first), and each missing
record explained."""

from __future__ import annotations

import pytest

from blockx_server.worker.call_records import CallRecordStore


def store(**bounds: int) -> CallRecordStore:
    return CallRecordStore(4096, retention_ms=1000, **bounds)


def test_a_record_is_found_by_task_and_index_or_first() -> None:
    records = store()
    records.keep("t", 3, b"three", 0)
    records.keep("t", 1, b"one", 0)
    assert records.get("t", None, 10) == (1, b"one")
    assert records.get("t", 3, 10) == (3, b"three")
    assert records.get("t", 2, 10) == (
        "call 2 of task 't' did not fail it: only failed calls are recorded (the failed call: 1, 3)"
    )


@pytest.mark.parametrize(("now_ms", "kept"), [(999, True), (1000, False), (5000, False)])
def test_records_expire_with_their_task_s_result(now_ms: int, kept: bool) -> None:
    records = store()
    records.keep("t", 0, b"r", 0)
    assert isinstance(records.get("t", 0, now_ms), tuple) is kept
    assert (records.size, len(records)) == ((1, 1) if kept else (0, 0))


def test_the_oldest_records_go_first_past_the_byte_bound() -> None:
    records = store(max_bytes=10)
    records.keep("a", 0, b"aaaa", 0)
    records.keep("b", 0, b"bbbb", 1)
    records.keep("c", 0, b"cccc", 2)
    assert records.size == 8
    assert "dropped to keep this Worker's records within 10 bytes" in str(records.get("a", 0, 3))
    assert records.get("b", 0, 3) == (0, b"bbbb")
    records.keep("d", 0, b"x" * 11, 3)  # larger than the whole bound: not kept
    assert records.size == 8
    assert isinstance(records.get("d", None, 3), str)


def test_a_task_keeps_at_most_per_task_records_and_the_first_of_each() -> None:
    records = store(per_task=2)
    for index in range(4):
        records.keep("t", index, f"r{index}".encode(), 0)
    records.keep("t", 0, b"again", 0)
    assert [records.get("t", i, 1) for i in (0, 1)] == [(0, b"r0"), (1, b"r1")]
    assert isinstance(records.get("t", 2, 1), str)
    assert len(records) == 2


def test_forget_and_recording_off() -> None:
    records = store()
    records.keep("t", 0, b"r", 0)
    records.forget("t")
    records.forget("never")
    assert (records.size, len(records)) == (0, 0)
    off = CallRecordStore(0, retention_ms=1000)
    assert off.get("t", None, 0) == "this Worker records no calls (CALL_RECORD_MAX_BYTES=0)"
