"""Backpressure of a streaming scan: ``feed_calls`` against a model of the
dispatcher (hypothesis), and ``CallRun.wait_room`` on a real CallEngine with real
executors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import pytest
from engines import windowed_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx_core.calls import RootCall
from blockx_core.code_view import CodeSnapshot, build_snapshot
from blockx_core.dispatch import CallsConverged, CallsFailed
from blockx_server.calls.engine import CallEngine
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.pipeline.builders import PluginError, feed_calls


class ScriptedStream:
    """Chunks of consecutive integer roots; a read fails at ``fail_at`` if given."""

    function = "f"

    def __init__(self, sizes: list[int], fail_at: int | None = None) -> None:
        self.sizes = sizes
        self.fail_at = fail_at
        self.read = 0  # chunks handed out

    async def chunks(self) -> AsyncGenerator[Sequence[RootCall]]:
        next_root = 0
        for i, size in enumerate(self.sizes):
            if i == self.fail_at:
                raise PluginError.of("scripted read failure", retryable=True)
            self.read += 1
            yield [RootCall([next_root + j]) for j in range(size)]
            next_root += size


class ModelRun:
    """The dispatcher as a producer sees it: a call window of ``window`` roots;
    waiting for room finishes the oldest roots until the rest fit. The run may end
    by itself (a call failed) after ``end_after`` adds."""

    def __init__(self, window: int, end_after: int | None = None) -> None:
        self.window = window
        self.end_after = end_after
        self.roots: list[int] = []
        self.finished = 0
        self.adds = 0
        self.most_pending = 0
        self.done_calls = 0
        self.closed = False

    @property
    def pending(self) -> int:
        return len(self.roots) - self.finished

    @property
    def ended(self) -> bool:
        return self.end_after is not None and self.adds >= self.end_after

    async def wait_room(self) -> None:
        if not self.ended:
            # The dispatcher finishes the oldest roots meanwhile.
            self.finished = max(self.finished, len(self.roots) - self.window)

    def add(self, roots: Sequence[RootCall]) -> None:
        assert not self.ended
        assert self.pending <= self.window, "a chunk was added before the window had room"
        self.roots.extend(r.args[0] for r in roots)
        self.adds += 1
        self.most_pending = max(self.most_pending, self.pending)

    def done(self) -> None:
        self.done_calls += 1

    def close(self) -> None:
        self.closed = True


sizes = st.lists(st.integers(min_value=0, max_value=300), max_size=30)


@settings(max_examples=60, deadline=None)
@given(sizes=sizes, window=st.integers(min_value=1, max_value=128))
def test_every_root_is_added_once_in_order_within_one_window_and_a_chunk(
    sizes: list[int], window: int
) -> None:
    stream, run = ScriptedStream(sizes), ModelRun(window)
    assert asyncio.run(feed_calls(stream, run)) == sum(sizes)
    assert run.roots == list(range(sum(sizes)))
    assert run.done_calls == 1
    assert not run.closed
    assert run.most_pending <= window + max(sizes, default=0)


@settings(max_examples=60, deadline=None)
@given(sizes=sizes, window=st.integers(min_value=1, max_value=64), data=st.data())
def test_a_run_that_ended_stops_the_scan(
    sizes: list[int], window: int, data: st.DataObject
) -> None:
    end_after = data.draw(st.integers(min_value=0, max_value=len(sizes)))
    stream, run = ScriptedStream(sizes), ModelRun(window, end_after=end_after)
    asyncio.run(feed_calls(stream, run))
    assert run.adds == end_after
    # At most the chunk that found the run ended was read beyond what was added.
    assert stream.read <= end_after + 1
    assert run.done_calls == (1 if end_after == len(sizes) else 0)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=20), data=st.data()
)
def test_a_failed_read_closes_the_run_after_the_chunks_before_it(
    sizes: list[int], data: st.DataObject
) -> None:
    fail_at = data.draw(st.integers(min_value=0, max_value=len(sizes) - 1))
    stream, run = ScriptedStream(sizes, fail_at=fail_at), ModelRun(window=8)
    with pytest.raises(PluginError, match="scripted read failure"):
        asyncio.run(feed_calls(stream, run))
    assert run.roots == list(range(sum(sizes[:fail_at])))
    assert run.closed
    assert run.done_calls == 0


# ---- CallRun.wait_room on a real engine ------------------------------------------------

FUNCTIONS = """
def double(x):
    return x * 2

def boom(x):
    raise ValueError(f"bad input {x}")
"""
WINDOW = 8


@pytest.fixture
async def engine() -> AsyncIterator[tuple[CallEngine, IoRouter]]:
    async with windowed_engine(WINDOW) as started:
        yield started


@pytest.fixture
def snapshot() -> CodeSnapshot:
    return build_snapshot(1, {"fns": FUNCTIONS})


async def test_wait_room_returns_once_the_added_roots_fit_the_window(
    engine: tuple[CallEngine, IoRouter], snapshot: CodeSnapshot
) -> None:
    eng, io = engine
    run = eng.open_calls("room", snapshot, TaskIoScope(io, "room"), "double")
    for chunk in range(5):
        run.add([[chunk * 100 + i] for i in range(100)])
        assert eng.core.task_pending("room") > WINDOW
        async with asyncio.timeout(20):
            await run.wait_room()
        assert eng.core.task_pending("room") <= eng.core.task_window("room")
    run.done()
    async with asyncio.timeout(20):
        result = await run.result()
    assert isinstance(result, CallsConverged)
    assert [json.loads(o.value_json) for o in result.outputs] == [2 * i for i in range(500)]


async def test_wait_room_returns_when_the_run_fails_or_is_closed(
    engine: tuple[CallEngine, IoRouter], snapshot: CodeSnapshot
) -> None:
    eng, io = engine
    failing = eng.open_calls("fails", snapshot, TaskIoScope(io, "fails"), "boom")
    failing.add([[i] for i in range(100)])
    async with asyncio.timeout(20):
        await failing.wait_room()
    assert failing.ended
    assert isinstance(await failing.result(), CallsFailed)

    closed = eng.open_calls("closed", snapshot, TaskIoScope(io, "closed"), "double")
    closed.add([[i] for i in range(10_000)])
    waiting = asyncio.ensure_future(closed.wait_room())
    await asyncio.sleep(0)
    assert not waiting.done()
    closed.close()
    async with asyncio.timeout(20):
        await waiting
    assert not eng.core.has_task("closed")
