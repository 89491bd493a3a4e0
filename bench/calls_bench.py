"""Calls-phase benchmark: the CallEngine against ProcessPoolExecutor(2).

Run: uv run python bench/calls_bench.py [--rounds 5] [--executors 2] [--trivial 100000]
[--sha 20000] [--io 20000] [--pool-submits 20000]

Prints one JSON line. The goals, as ``ratios`` (median of the rounds; ``ratios_best``
the best round):

* ``trivial_vs_pool_submit``: ``x * 2`` calls against one ``submit`` per call to
  ``concurrent.futures.ProcessPoolExecutor(2)`` (goal >= 10);
* ``sha3_vs_pool_map``: calls of ten ``hashlib.sha3_256`` digests of 1 KiB against
  ``ProcessPoolExecutor(2).map(..., chunksize=256)`` (goal >= 0.9).

Each round runs ours and then the pool's, so the machine's noise falls on both
alike. Ours runs as a Worker builds its CallEngine from the environment with every
setting at its default (``defaults``: EXECUTOR_COUNT is 8, and a CPU-bound task's
calls go to as many of them as the machine has CPUs, EXECUTOR_CPUS), and again with
EXECUTOR_COUNT=N (``executors_N``, 2 by default: the pool's size).

A ratio of wall times depends on who else uses the machine. The CPU each
side spends per sha3 call (``sha3_cpu_us_per_call``: the parent process, the Worker
or the pool's submitter, and its workers, from the kernel's count) does not: on a
quiet machine, where both are CPU-bound, the pool's total over ours is the ratio
(``sha3_vs_pool_map_by_cpu``, per round, its median and best).

Besides (the defaults only): ``io`` calls that each await one ``io.memory.get``
answered by the Worker, and ``io_recorded``, the same recorded as a Worker records
them (CALL_RECORD_MAX_BYTES, 4 MiB: each request and answer kept while its call
runs, dropped when it succeeds), alternated three times, the best of each kept;
``kwargs_context``: the trivial call with a keyword argument and a block context on
every call (what the extra columns cost).

Every BlockX call is individually tracked, budgeted, retried and cancellable, and
its result is a JSON text; the pool's are not. What that costs is in
docs/call-execution.md (Benchmark).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from blockx_core.call_record import DEFAULT_CALL_RECORD_MAX_BYTES
from blockx_core.calls import CallContext, RootCall
from blockx_core.code_view import build_snapshot
from blockx_core.dispatch import CallsConverged
from blockx_server.calls.config import load_call_settings
from blockx_server.calls.engine import CallEngine, CallEngineConfig
from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope

FUNCTIONS = """
import hashlib
from blockx_executor import io

def double(x):
    return x * 2

def scaled(x, *, scale):
    return x * scale

def sha3(i):
    data = b"x" * 1024
    for _ in range(10):
        data = hashlib.sha3_256(data).digest() * 32
    return i

async def fetch(key):
    return await io.memory.get(key)
"""


def double(x: int) -> int:
    return x * 2


def sha3(i: int) -> int:
    data = b"x" * 1024
    for _ in range(10):
        data = hashlib.sha3_256(data).digest() * 32
    return i


def cpu_s(pids: Iterable[int]) -> float:
    """CPU seconds the processes ``pids`` have used (the kernel's count)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # gone (an executor replaced meanwhile): its share is not counted
    return total / 1e9


class CpuMeter:
    """CPU microseconds per call: this process (the Worker, or the pool's parent)
    and its workers (the executors, or the pool's processes)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[tuple[float, float]]] = {}

    def measure(self, name: str, pids: list[int], calls: int) -> Callable[[], None]:
        own, theirs = time.process_time(), cpu_s(pids)

        def done() -> None:
            sample = (
                (time.process_time() - own) / calls * 1e6,
                (cpu_s(pids) - theirs) / calls * 1e6,
            )
            self.samples.setdefault(name, []).append(sample)

        return done

    def ratios(self, peer: str, names: Iterable[str]) -> dict[str, dict[str, float]]:
        """Per round, the peer's CPU per call (parent and workers) over ours: the
        median and the best of the rounds."""
        total = {name: [sum(s) for s in self.samples.get(name, [])] for name in [peer, *names]}
        out: dict[str, dict[str, float]] = {}
        for name in names:
            rounds = [p / o for p, o in zip(total[peer], total[name], strict=False) if o]
            if rounds:
                out[name] = {"median": _median(rounds), "best": round(max(rounds), 2)}
        return out

    def report(self) -> dict[str, dict[str, float]]:
        return {
            name: {
                "parent": round(statistics.median(s[0] for s in samples), 2),
                "workers": round(statistics.median(s[1] for s in samples), 2),
            }
            for name, samples in self.samples.items()
        }


def pool_submit_rate(pool: ProcessPoolExecutor, fn: Callable[[int], int], n: int) -> float:
    started = time.perf_counter()
    futures = [pool.submit(fn, i) for i in range(n)]
    for future in futures:
        future.result()
    return n / (time.perf_counter() - started)


def pool_map_rate(
    pool: ProcessPoolExecutor, fn: Callable[[int], int], n: int, meter: CpuMeter
) -> float:
    measured = meter.measure("pool_map_sha3", [p.pid for p in pool_processes(pool)], n)
    started = time.perf_counter()
    list(pool.map(fn, range(n), chunksize=256))
    rate = n / (time.perf_counter() - started)
    measured()
    return rate


def pool_processes(pool: ProcessPoolExecutor) -> list[Any]:
    return list(getattr(pool, "_processes", {}).values())


def engine_config(environ: dict[str, str]) -> CallEngineConfig:
    """The CallEngine a Worker builds from ``environ`` (every other setting its default)."""
    return load_call_settings({"FUNCTIONS_DIR": tempfile.gettempdir(), **environ}).engine


async def run_case(
    engine: CallEngine,
    registry: IoRouter,
    task_id: str,
    function: str,
    calls: list[RootCall] | list[list[Any]],
    record_bytes: int = 0,
    meter: tuple[CpuMeter, str] | None = None,
) -> float:
    """Calls per second of one Calls phase (all of ``calls``), checked complete."""
    snapshot = build_snapshot(1, {"fns": FUNCTIONS})
    pool = engine.pool
    pids = [p for p in map(pool.pid, pool.executor_ids()) if p is not None]
    measured = None if meter is None else meter[0].measure(meter[1], pids, len(calls))
    started = time.perf_counter()
    io = TaskIoScope(registry, task_id)
    result = await engine.run_calls(
        task_id, snapshot, io, function, calls, record_bytes=record_bytes
    )
    elapsed = time.perf_counter() - started
    if measured is not None:
        measured()
    if not isinstance(result, CallsConverged):
        raise RuntimeError(f"{task_id}: {result.failure_message}")
    if len(result.outputs) != len(calls):
        raise RuntimeError(f"{task_id}: {len(result.outputs)} outputs for {len(calls)} calls")
    return len(calls) / elapsed


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    registry = IoRouter([MemoryBackend({"k": {"balance": 42}})])
    setups = {"defaults": engine_config({})}
    if args.executors:
        setups[f"executors_{args.executors}"] = engine_config(
            {"EXECUTOR_COUNT": str(args.executors)}
        )
    engines = {label: CallEngine(config) for label, config in setups.items()}
    pool = ProcessPoolExecutor(2)
    try:
        for engine in engines.values():
            await engine.start()
            await asyncio.wait_for(engine.wait_ready(), 60)
            await run_case(engine, registry, "warm-up", "double", [[i] for i in range(5000)])
        list(pool.map(sha3, range(2000), chunksize=256))  # start the pool's processes
        trivial: list[list[Any]] = [[i] for i in range(args.trivial)]
        sha: list[list[Any]] = [[i] for i in range(args.sha)]
        rates: dict[str, dict[str, list[float]]] = {
            label: {"trivial": [], "sha3": []} for label in engines
        }
        pool_rates: dict[str, list[float]] = {"submit_trivial": [], "map_sha3": []}
        ratios: dict[str, dict[str, list[float]]] = {
            label: {"trivial_vs_pool_submit": [], "sha3_vs_pool_map": []} for label in engines
        }
        meter = CpuMeter()
        # Each round measures the peer right after our runs, so the machine's noise
        # falls on both alike; the ratios are per round, their median reported.
        for run in range(args.rounds):
            ours = {
                label: await run_case(engine, registry, f"trivial-{label}-{run}", "double", trivial)
                for label, engine in engines.items()
            }
            submit = pool_submit_rate(pool, double, args.pool_submits)
            pool_rates["submit_trivial"].append(submit)
            for label, rate in ours.items():
                rates[label]["trivial"].append(rate)
                ratios[label]["trivial_vs_pool_submit"].append(rate / submit)
            ours = {
                label: await run_case(
                    engine, registry, f"sha3-{label}-{run}", "sha3", sha, meter=(meter, label)
                )
                for label, engine in engines.items()
            }
            mapped = pool_map_rate(pool, sha3, args.sha, meter)
            pool_rates["map_sha3"].append(mapped)
            for label, rate in ours.items():
                rates[label]["sha3"].append(rate)
                ratios[label]["sha3_vs_pool_map"].append(rate / mapped)
        extras = await other_cases(engines["defaults"], registry, args)
    finally:
        pool.shutdown()
        for engine in engines.values():
            await engine.close()
    return {
        "bench": "calls",
        "rounds": args.rounds,
        "statistic": "median of the rounds (each round: ours, then the pool)",
        "goals": {"trivial_vs_pool_submit": ">= 10", "sha3_vs_pool_map": ">= 0.9"},
        "ratios": {
            label: {name: _median(values) for name, values in by_name.items()}
            for label, by_name in ratios.items()
        },
        "ratios_best": {
            label: {name: round(max(values), 2) for name, values in by_name.items()}
            for label, by_name in ratios.items()
        },
        "executors": {label: config.pool.count for label, config in setups.items()},
        "blockx_calls_per_s": {
            label: {name: round(statistics.median(v)) for name, v in by_name.items()}
            for label, by_name in rates.items()
        },
        "pool_calls_per_s": {name: round(statistics.median(v)) for name, v in pool_rates.items()},
        # The sha3 calls' CPU (median of the rounds): what each side spends per call in
        # its parent process (the Worker; the pool's submitter) and its workers.
        "sha3_cpu_us_per_call": meter.report(),
        # The pool's CPU per sha3 call over ours, per round: the ratio a quiet machine
        # would give when both sides are CPU-bound (the wall ratios move with the load).
        "sha3_vs_pool_map_by_cpu": meter.ratios("pool_map_sha3", engines),
        "defaults_other_calls_per_s": extras,
        "io_recorded_vs_io": round(extras["io_recorded"] / extras["io"], 2),
    }


async def other_cases(
    engine: CallEngine, registry: IoRouter, args: argparse.Namespace
) -> dict[str, float]:
    """The IO calls with and without records (alternated three times, the best of
    each kept: their ratio is the cost of recording) and the trivial call with a
    keyword argument and a block context (what the extra columns cost)."""
    with_extras = [
        RootCall([i], {"scale": 2}, CallContext(block_number=i)) for i in range(args.trivial)
    ]
    rates: dict[str, float] = {}
    for run in range(3):
        for name, record_bytes in (("io", 0), ("io_recorded", DEFAULT_CALL_RECORD_MAX_BYTES)):
            calls: list[list[Any]] = [["k"]] * args.io
            rate = await run_case(engine, registry, f"{name}-{run}", "fetch", calls, record_bytes)
            rates[name] = max(rates.get(name, 0), round(rate))
    rate = await run_case(engine, registry, "kwargs-context", "scaled", with_extras)
    rates["kwargs_context"] = round(rate)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description="Calls-phase benchmark")
    parser.add_argument("--trivial", type=int, default=100_000)
    parser.add_argument("--sha", type=int, default=20_000)
    parser.add_argument("--io", type=int, default=20_000)
    parser.add_argument("--pool-submits", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--executors",
        type=int,
        default=2,
        help="also measure a Worker with EXECUTOR_COUNT=N (0: only the defaults)",
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args))))


if __name__ == "__main__":
    main()
