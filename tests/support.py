"""Helpers shared by the test modules: fake clock, heartbeat builder, polling."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

from blockx_core.heartbeat import WorkerHeartbeat

NOW_MS = 1_700_000_000_000


class FakeClock:
    """A Clock whose time moves only when a test moves it."""

    def __init__(self, now_ms: int = NOW_MS) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def heartbeat(
    addr: str, *, slots: int = 10, used: int = 0, at_ms: int = NOW_MS, **fields: float
) -> WorkerHeartbeat:
    """A heartbeat with ``slots`` task slots of which ``used`` are reserved."""
    return WorkerHeartbeat(
        worker_addr=addr,
        task_slots=slots,
        reserved_slots=used,
        last_heartbeat_ms=at_ms,
        **fields,  # type: ignore[arg-type]
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    what: str = "the condition",
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
) -> None:
    """Poll ``condition`` until true; fail the test naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)
