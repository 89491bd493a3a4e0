"""A real CallEngine for server tests: two Python Executor processes and a call
window, with a memory-backed IO router."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from blockx_core.dispatch import DispatchConfig
from blockx_server.calls.engine import CallEngine, CallEngineConfig
from blockx_server.calls.executor_pool import ExecutorPoolConfig
from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.router import IoRouter


@contextlib.asynccontextmanager
async def windowed_engine(window: int) -> AsyncIterator[tuple[CallEngine, IoRouter]]:
    """An engine whose tasks keep at most ``window`` calls in flight, started and
    ready, closed after the block."""
    config = CallEngineConfig(
        dispatch=DispatchConfig(initial_window=window, task_max_inflight_calls=window),
        pool=ExecutorPoolConfig(count=2, heartbeat_interval_ms=50),
    )
    engine = CallEngine(config)
    await engine.start()
    try:
        async with asyncio.timeout(20):
            await engine.wait_ready()
        yield engine, IoRouter([MemoryBackend({})])
    finally:
        await engine.close()
