"""CPU lanes with real executor processes: calls that keep a CPU busy end up on
``cpu_lanes`` executors, calls that sleep keep every executor working, as the
kernel's accounting of the executors (time on a CPU, waiting for one) says."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from blockx_core.code_view import CodeSnapshot, build_snapshot
from blockx_core.dispatch import CallsConverged, DispatchConfig
from blockx_server.calls.engine import CallEngine, CallEngineConfig
from blockx_server.calls.executor_pool import ExecutorPoolConfig
from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope

FUNCTIONS = """
import os
import time

def spin(ms):
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass
    return os.getpid()

def nap(ms):
    time.sleep(ms / 1000)
    return os.getpid()
"""

EXECUTORS = 4
LANES = 2


@pytest.fixture
async def engine() -> AsyncIterator[CallEngine]:
    eng = CallEngine(
        CallEngineConfig(
            dispatch=DispatchConfig(cpu_lanes=LANES),
            pool=ExecutorPoolConfig(count=EXECUTORS, heartbeat_interval_ms=50),
        )
    )
    await eng.start()
    async with asyncio.timeout(20):
        await eng.wait_ready()
    yield eng
    await eng.close()


@pytest.fixture
def snapshot() -> CodeSnapshot:
    return build_snapshot(1, {"fns": FUNCTIONS})


async def pids(engine: CallEngine, snapshot: CodeSnapshot, function: str, n: int) -> list[int]:
    """The process each of ``n`` calls ran in, in root order."""
    task_id = f"task-{function}"
    io = TaskIoScope(IoRouter([MemoryBackend()]), task_id)
    async with asyncio.timeout(60):
        result = await engine.run_calls(task_id, snapshot, io, function, [[2]] * n)
    assert isinstance(result, CallsConverged), result
    return [json.loads(o.value_json) for o in result.outputs]


async def test_calls_that_keep_a_cpu_busy_end_up_on_the_lanes(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    ran = await pids(engine, snapshot, "spin", 400)
    # The first window goes everywhere; once the calls have shown they keep their
    # executors busy, the rest go to the task's two lanes.
    assert len(set(ran[:64])) == EXECUTORS
    assert len(set(ran[-150:])) == LANES


async def test_calls_that_sleep_keep_every_executor_working(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    ran = await pids(engine, snapshot, "nap", 120)
    assert len(set(ran[-40:])) == EXECUTORS
