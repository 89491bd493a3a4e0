"""Each call is charged its own CPU: the runner reads the thread's CPU clock once
per call (a call's end is the next one's start), and neither a neighbour's work nor
a flush is charged to another call."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from blockx_executor.protocol import (
    CallFailed,
    CallsCompleted,
    ExecuteCalls,
    FrameDecoder,
    FromExecutor,
    LoadCode,
)
from blockx_executor.runner import Runner

SOURCE = """
import time

def burn(ms):
    # CPU work: until this thread's CPU clock has advanced by ``ms``.
    end = time.thread_time_ns() + ms * 1_000_000
    while time.thread_time_ns() < end:
        pass
    return ms

def fails(ms):
    burn(ms)
    raise ValueError("no")
"""

BUDGET_US = 100_000


@pytest.fixture
def runner() -> Iterator[tuple[Runner, socket.socket]]:
    ours, theirs = socket.socketpair()
    r = Runner(ours, "x-test", 1.0)
    r._handle(LoadCode("d1", "fns", SOURCE))
    yield r, theirs
    ours.close()
    theirs.close()


def run(
    pair: tuple[Runner, socket.socket], function: str, args: list[int]
) -> dict[int, tuple[str, int]]:
    """Each call's ending ("ok" or its failure kind) and charged CPU (µs)."""
    r, theirs = pair
    ids = list(range(len(args)))
    r._handle(ExecuteCalls("t", "d1", function, BUDGET_US, ids, [[a] for a in args]))
    r._flush()
    theirs.setblocking(False)
    decoder: FrameDecoder[FromExecutor] = FrameDecoder(FromExecutor)
    endings: dict[int, tuple[str, int]] = {}
    while len(endings) < len(ids):
        for message in decoder.feed(theirs.recv(1 << 20)):
            if isinstance(message, CallsCompleted):
                for call_id, cpu in zip(message.call_ids, message.cpu_us, strict=True):
                    endings[call_id] = ("ok", cpu)
            elif isinstance(message, CallFailed):
                endings[message.call_id] = (message.kind, message.cpu_us)
    return endings


def test_a_call_is_charged_its_own_work_not_its_neighbours(
    runner: tuple[Runner, socket.socket],
) -> None:
    endings = run(runner, "burn", [0, 60, 0, 60, 0])
    assert [endings[i][0] for i in sorted(endings)] == ["ok"] * 5
    for heavy in (1, 3):
        assert endings[heavy][1] >= 60_000
    for light in (0, 2, 4):
        assert endings[light][1] < 60_000


def test_over_budget_fails_that_call_only(runner: tuple[Runner, socket.socket]) -> None:
    """Two calls of 60 ms each stay within a 100 ms budget; one of 120 ms fails, and
    the call after it does not inherit its CPU."""
    endings = run(runner, "burn", [60, 60, 120, 0])
    assert [endings[i][0] for i in sorted(endings)] == ["ok", "ok", "BUDGET_EXCEEDED", "ok"]
    assert endings[2][1] >= 120_000
    assert endings[3][1] < 60_000


def test_a_failing_call_is_charged_and_the_next_is_not(
    runner: tuple[Runner, socket.socket],
) -> None:
    endings = run(runner, "fails", [60, 0])
    assert [endings[i][0] for i in sorted(endings)] == ["USER_ERROR", "USER_ERROR"]
    assert endings[0][1] >= 60_000
    assert endings[1][1] < 60_000
