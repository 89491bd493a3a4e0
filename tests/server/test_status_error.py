"""A status message is bounded: it travels in a header the client limits."""

from __future__ import annotations

import pytest
from grpclib.const import Status

from blockx_server.runtime.status import MAX_STATUS_MESSAGE_CHARS, status_error

CASES = [
    # (message length, what the status carries)
    (0, ""),
    (MAX_STATUS_MESSAGE_CHARS, "x" * MAX_STATUS_MESSAGE_CHARS),
    (
        MAX_STATUS_MESSAGE_CHARS + 1,
        "x" * MAX_STATUS_MESSAGE_CHARS + f"... ({MAX_STATUS_MESSAGE_CHARS + 1} characters)",
    ),
    (70_000, "x" * MAX_STATUS_MESSAGE_CHARS + "... (70000 characters)"),
]


@pytest.mark.parametrize(("length", "expected"), CASES)
def test_a_status_message_is_cut_saying_how_long_it_was(length: int, expected: str) -> None:
    error = status_error(Status.INVALID_ARGUMENT, "x" * length)
    assert (error.status, error.message) == (Status.INVALID_ARGUMENT, expected)
