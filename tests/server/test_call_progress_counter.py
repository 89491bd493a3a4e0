"""ProgressCounter on a real CallEngine with real executors: the counts a Calls phase
reports as its calls finish, for a list known up front (the total known from the
start) and for a streamed feed (the total so far grows with each chunk, and is known
once the feed is done); the last counts when the run converges, a failure's failed
attempts included."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import pytest
from engines import windowed_engine

from blockx_core.calls import RootCall
from blockx_core.code_view import CodeSnapshot, build_snapshot
from blockx_core.dispatch import CallsConverged, CallsFailed
from blockx_core.worker import CallProgress
from blockx_server.calls.engine import CallEngine
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.pipeline.builders import feed_calls
from blockx_server.worker.call_progress import ProgressCounter

FUNCTIONS = """
import time

def nap(x):
    time.sleep(0.005)
    return x

def boom(x):
    raise ValueError(f"bad input {x}")
"""
WINDOW = 4


class Chunks:
    """``sizes`` chunks of consecutive roots, read one by one."""

    function = "nap"

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    async def chunks(self) -> AsyncGenerator[Sequence[RootCall]]:
        start = 0
        for size in self.sizes:
            yield [RootCall([start + i]) for i in range(size)]
            start += size


@pytest.fixture
async def engine() -> AsyncIterator[tuple[CallEngine, IoRouter]]:
    async with windowed_engine(WINDOW) as started:
        yield started


@pytest.fixture
def snapshot() -> CodeSnapshot:
    return build_snapshot(1, {"fns": FUNCTIONS})


def rising(reported: list[CallProgress]) -> None:
    done = [p.calls_done for p in reported]
    totals = [p.calls_total for p in reported]
    assert done == sorted(done), reported
    assert totals == sorted(totals), reported
    assert all(p.calls_done <= p.calls_total for p in reported), reported


async def test_a_listed_run_reports_its_total_at_once_then_its_calls_as_they_finish(
    engine: tuple[CallEngine, IoRouter], snapshot: CodeSnapshot
) -> None:
    eng, io = engine
    reported: list[CallProgress] = []
    counter = ProgressCounter(eng, lambda task_id, p: reported.append(p))
    observer = counter.observer("listed", None)
    run = eng.open_calls("listed", snapshot, TaskIoScope(io, "listed"), "nap", observer=observer)
    run.add([[i] for i in range(20)])
    run.done()
    counter.count("listed")
    assert reported == [CallProgress(calls_total=20, total_known=True)]
    async with asyncio.timeout(30):
        converged = await run.result()
    counter.converged("listed", converged)
    assert isinstance(converged, CallsConverged)
    rising(reported)
    assert any(0 < p.calls_done < 20 for p in reported), reported  # counted along the way
    assert reported[-1] == CallProgress(calls_done=20, calls_total=20, total_known=True)
    assert len(set(map(repr, reported))) == len(reported)  # each count once


async def test_a_streamed_feed_reports_the_total_so_far_until_it_is_done(
    engine: tuple[CallEngine, IoRouter], snapshot: CodeSnapshot
) -> None:
    eng, io = engine
    reported: list[CallProgress] = []
    counter = ProgressCounter(eng, lambda task_id, p: reported.append(p))
    observer = counter.observer("streamed", None)
    run = eng.open_calls(
        "streamed", snapshot, TaskIoScope(io, "streamed"), "nap", observer=observer
    )
    counter.count("streamed")
    async with asyncio.timeout(30):
        await feed_calls(Chunks([4, 4, 4, 4]), counter.sink(run))
        converged = await run.result()
    counter.converged("streamed", converged)
    assert isinstance(converged, CallsConverged)
    assert [json.loads(o.value_json) for o in converged.outputs] == list(range(16))
    rising(reported)
    so_far = [p for p in reported if not p.total_known]
    assert so_far[0] == CallProgress()  # the phase opened, nothing added yet
    assert any(0 < p.calls_total < 16 for p in so_far), reported  # a total so far grew
    assert reported[-1] == CallProgress(calls_done=16, calls_total=16, total_known=True)


async def test_a_failed_run_keeps_its_counts_and_counts_its_failed_attempts(
    engine: tuple[CallEngine, IoRouter], snapshot: CodeSnapshot
) -> None:
    eng, io = engine
    reported: list[CallProgress] = []
    counter = ProgressCounter(eng, lambda task_id, p: reported.append(p))
    observer = counter.observer("fails", None)
    run = eng.open_calls("fails", snapshot, TaskIoScope(io, "fails"), "boom", observer=observer)
    run.add([[1], [2]])
    run.done()
    counter.count("fails")
    async with asyncio.timeout(30):
        converged = await run.result()
    counter.converged("fails", converged)
    assert isinstance(converged, CallsFailed)
    last = reported[-1]
    assert (last.calls_done, last.calls_total, last.total_known) == (0, 2, True)
    assert last.calls_failed == len(converged.call_failures) + converged.call_failures_omitted
    assert last.calls_failed >= 1
