"""What functions print, as the Worker logs it: tagged per call, escaped, bounded,
one note per call that went over."""

from __future__ import annotations

import logging

import pytest

from blockx_server.calls.call_logs import CallLogs


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "blockx.output"]


def test_each_line_is_tagged_escaped_and_bounded_with_one_note(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    logs = CallLogs(limit=20)
    logs.output("x0.1", 7, "t1", "hello\n\x1b[31mred\rX\n", dropped=0)
    logs.output("x0.1", 7, "t1", "0123456789abcdef\nmore\n", dropped=100)
    logs.ended([7])
    assert not logs.open
    assert lines(caplog) == [
        "task t1 call 7: hello",
        "task t1 call 7: \\x1b[31mred\\x0dX",
        "task t1 call 7: 01",  # 6 + 11 bytes logged: room for 2 characters and a newline
        "task t1 call 7: 119 more bytes of output dropped (over CALL_MAX_LOG_BYTES, 20)",
    ]


def test_raw_bytes_are_split_into_lines_and_tagged_with_the_call_holding_the_executor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    logs = CallLogs(limit=1_000)
    logs.raw("x0.1", b"top level of a mod", 0, None)
    logs.raw("x0.1", b"ule\nfrom C: ", 0, None)
    logs.raw("x0.1", b"\xff ok\n", 3, "t2")
    logs.raw("x0.1", b"Fatal Python error", 0, None)
    logs.raw("x0.1", b"", 0, None)  # the pipe closed
    assert lines(caplog) == [
        "executor x0.1: top level of a module",
        "task t2 call 3: from C: \ufffd ok",
        "executor x0.1: Fatal Python error",
    ]


def test_calls_of_a_lost_executor_get_their_note(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    logs = CallLogs(limit=0)
    logs.output("x0.1", 1, None, "a\n", dropped=0)
    logs.output("x0.2", 2, "t", "b\n", dropped=0)
    logs.executor_gone("x0.1")
    assert lines(caplog) == [
        "task (ended) call 1: 2 more bytes of output dropped (over CALL_MAX_LOG_BYTES, 0)"
    ]
    assert logs.open
