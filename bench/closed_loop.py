"""The closed loop the benchmarks share: callers that each await one operation at a
time, for a count or a duration, and the latency figures of what they did."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stats(latencies_ns: list[int], elapsed_s: float) -> dict[str, float]:
    latencies_ns.sort()

    def pct(q: float) -> float:
        return round(latencies_ns[min(len(latencies_ns) - 1, int(q * len(latencies_ns)))] / 1e6, 3)

    return {
        "count": len(latencies_ns),
        "per_s": round(len(latencies_ns) / elapsed_s, 1),
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
    }


async def measure(
    op: Callable[[int], Awaitable[object]], concurrency: int, *, count: int = 0, seconds: float = 0
) -> dict[str, float]:
    latencies: list[int] = []
    next_id = 0
    stop_at = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal next_id
        while (count and next_id < count) or (seconds and time.perf_counter() < stop_at):
            i = next_id
            next_id += 1
            started = time.perf_counter_ns()
            await op(i)
            latencies.append(time.perf_counter_ns() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return stats(latencies, time.perf_counter() - started)
