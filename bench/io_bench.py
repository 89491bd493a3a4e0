"""IO subsystem benchmark: the read cache, singleflight and adaptive admission.

Run: uv run python bench/io_bench.py [--calls 2000] [--requests 4000]

Prints one JSON line. Every request goes through the one door a task uses
(``TaskIoScope.request`` on an ``IoRouter``), against scripted backends (the chain
backends are separate; these isolate the subsystem's own effect):

* ``cache``: one task whose ``--calls`` calls (64 at a time, the IO window) each
  re-read 4 of 16 finalized blocks from a backend that answers in 2 ms
  (``asyncio.sleep``); with the read cache on and off (IO_CACHE_MAX_BYTES=0).
  Reports wall time, backend requests, hit rate and the speed-up.
* ``singleflight``: 1,000 concurrent identical reads in one task; reports how many
  reached the backend.
* ``admission``: a backend whose latency is ``2 ms x max(1, in_flight / 8)^2`` (it
  queues internally beyond 8), driven by 256 concurrent requesters in separate tasks
  for ``--requests`` requests; throughput with the adaptive (AIMD) limit, with a
  fixed limit of 64, and with every fixed limit of a sweep. Goals: adaptive >= 0.8x
  the best fixed limit and >= 1.5x the fixed 64.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

from blockx_core.io import ConcurrencyLimit, FixedLimit
from blockx_server.io.errors import IoOk
from blockx_server.io.finality import StaticFinality
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.io.settings import IoSettings


class FixedLatencyChain:
    """``block(n)``: answers after ``latency_s``; final at or below ``finalized``."""

    name = "chain"
    read_ops = frozenset({"block"})
    write_ops: frozenset[str] = frozenset()

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.requests = 0

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        return finalized is not None and int(args[0]) <= finalized

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        self.requests += 1
        await asyncio.sleep(self.latency_s)
        return {"number": args[0], "hash": f"0x{int(args[0]):064x}", "logs": list(range(20))}


class QueueingBackend:
    """Latency ``base x max(1, in_flight / 8)^2``, fixed when the request arrives."""

    name = "queueing"
    read_ops = frozenset({"read"})
    write_ops: frozenset[str] = frozenset()

    def __init__(self, base_s: float = 0.002) -> None:
        self.base_s = base_s
        self.in_flight = 0
        self.requests = 0

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        return False

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        self.in_flight += 1
        self.requests += 1
        try:
            await asyncio.sleep(self.base_s * max(1.0, self.in_flight / 8) ** 2)
        finally:
            self.in_flight -= 1
        return args[0]


async def bench_cache(calls: int, cache_bytes: int) -> dict[str, Any]:
    backend = FixedLatencyChain(0.002)
    router = IoRouter(
        [backend],
        settings=IoSettings(cache_max_bytes=cache_bytes),
        finality=StaticFinality(finalized=1_000),
    )
    scope = TaskIoScope(router, "task")
    pending = iter(range(calls))

    async def worker() -> None:
        for call in pending:
            for step in range(4):
                outcome = await scope.request("chain", "block", [(call * 7 + step) % 16])
                assert isinstance(outcome, IoOk), outcome

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(64):
            group.create_task(worker())
    seconds = time.perf_counter() - started
    reads = calls * 4
    return {
        "seconds": round(seconds, 3),
        "reads": reads,
        "backend_requests": backend.requests,
        "hit_rate": round(scope.stats.cache_hits / reads, 4),
        "shared": scope.stats.shared,
    }


async def bench_singleflight(reads: int) -> dict[str, Any]:
    backend = FixedLatencyChain(0.002)
    router = IoRouter([backend])  # no finality view: nothing is cached
    scope = TaskIoScope(router, "task")
    outcomes = await asyncio.gather(*(scope.request("chain", "block", [5]) for _ in range(reads)))
    assert all(isinstance(o, IoOk) for o in outcomes)
    return {"reads": reads, "backend_requests": backend.requests, "shared": scope.stats.shared}


async def bench_admission(
    requests: int, limits: Callable[[str], ConcurrencyLimit] | None
) -> dict[str, Any]:
    backend = QueueingBackend()
    router = IoRouter([backend], settings=IoSettings(queue_timeout_ms=600_000), limits=limits)
    tickets = itertools.count()
    scopes = [TaskIoScope(router, f"t{i}") for i in range(256)]

    async def requester(scope: TaskIoScope) -> None:
        while (n := next(tickets)) < requests:
            outcome = await scope.request("queueing", "read", [n])
            assert isinstance(outcome, IoOk), outcome

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for scope in scopes:
            group.create_task(requester(scope))
    seconds = time.perf_counter() - started
    (gate,) = router.gates()
    return {"per_s": round(requests / seconds, 1), "final_limit": gate.limit}


def fixed(limit: int) -> Callable[[str], ConcurrencyLimit]:
    return lambda name: FixedLimit(limit)


async def main(calls: int, requests: int) -> dict[str, Any]:
    cache_on = await bench_cache(calls, 256 * 1024 * 1024)
    cache_off = await bench_cache(calls, 0)
    single = await bench_singleflight(1_000)
    # Warm the event loop and allocator once, then measure.
    await bench_admission(requests // 4, None)
    adaptive = await bench_admission(requests, None)
    sweep = {n: await bench_admission(requests, fixed(n)) for n in (2, 4, 6, 8, 10, 12, 16, 32)}
    sweep[64] = await bench_admission(requests, fixed(64))
    best_limit, best = max(sweep.items(), key=lambda item: item[1]["per_s"])
    vs_best = adaptive["per_s"] / best["per_s"]
    vs_64 = adaptive["per_s"] / sweep[64]["per_s"]
    return {
        "cache": {
            "on": cache_on,
            "off": cache_off,
            "speedup": round(cache_off["seconds"] / cache_on["seconds"], 2),
        },
        "singleflight": single,
        "admission": {
            "adaptive": adaptive,
            "fixed": {str(n): r["per_s"] for n, r in sweep.items()},
            "best_fixed_limit": best_limit,
            "adaptive_vs_best_fixed": round(vs_best, 3),
            "adaptive_vs_fixed_64": round(vs_64, 3),
            "goal_vs_best_0_8": vs_best >= 0.8,
            "goal_vs_64_1_5": vs_64 >= 1.5,
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=4000)
    ns = parser.parse_args()
    print(json.dumps(asyncio.run(main(ns.calls, ns.requests))))
