"""``engine``: a started CallEngine with one executor, for the tests that run
function code through real executor processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from blockx_core.dispatch import DispatchConfig
from blockx_server.calls.engine import CallEngine, CallEngineConfig
from blockx_server.calls.executor_pool import ExecutorPoolConfig


@pytest.fixture
async def engine() -> AsyncIterator[CallEngine]:
    config = CallEngineConfig(
        dispatch=DispatchConfig(call_deadline_ms=5000, call_wall_limit_ms=60_000),
        pool=ExecutorPoolConfig(count=1, heartbeat_interval_ms=50),
    )
    eng = CallEngine(config)
    await eng.start()
    async with asyncio.timeout(20):
        await eng.wait_ready()
    yield eng
    await eng.close()
