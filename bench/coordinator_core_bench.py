"""Benchmark of the CoordinatorCore alone (no IO): selection latency and ingest rate.

Run: uv run python bench/coordinator_core_bench.py [--workers 100,1000,10000]

Prints one JSON line. Baseline, measured in the same run: a linear scan of every
worker per request with the seeds' filters and comparator (what select_candidate
would be without the index); ``speedup_vs_linear_p50`` is their ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence

from blockx_core.coordinator import Candidate, CoordinatorConfig, CoordinatorCore, WorkerView
from blockx_core.heartbeat import WorkerHeartbeat, decode_heartbeat, encode_heartbeat

NOW_MS = 1_700_000_000_000
SLOTS = 50


def make_heartbeat(rng: random.Random, addr: str, now_ms: int) -> WorkerHeartbeat:
    used = rng.randint(0, SLOTS)
    return WorkerHeartbeat(
        worker_addr=addr,
        task_slots=SLOTS,
        reserved_slots=used // 3,
        running_tasks=used - used // 3,
        cpu_percent=rng.random() * 0.95,
        memory_percent=rng.random() * 0.95,
        error_rate=rng.random() * 0.1,
        last_heartbeat_ms=now_ms - rng.randint(0, 2000),
    )


def percentile(sorted_ns: Sequence[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000


def linear_select(core: CoordinatorCore, exclude: frozenset[str], now_ms: int) -> str | None:
    """Baseline: the seeds' SelectCandidate as a scan of every worker."""
    cfg = core.config
    best: WorkerView | None = None
    best_key: tuple[int, int, float, str] | None = None
    for v in core.workers():
        hb = v.heartbeat
        if (
            hb.worker_addr in exclude
            or now_ms - hb.last_heartbeat_ms > cfg.heartbeat_timeout_ms
            or hb.cpu_percent > cfg.cpu_red_line
            or hb.memory_percent > cfg.memory_red_line
            or hb.error_rate > cfg.error_rate_red_line
            or v.breaker_open(now_ms)
            or hb.free_capacity <= 0
        ):
            continue
        key = (-hb.free_capacity, -hb.last_heartbeat_ms, v.penalty, hb.worker_addr)
        if best_key is None or key < best_key:
            best, best_key = v, key
    return None if best is None else best.worker_addr


def bench(n: int, rng: random.Random) -> dict[str, float | int]:
    core = CoordinatorCore(CoordinatorConfig())
    addrs = [f"10.0.{i // 250}.{i % 250}:7000" for i in range(n)]
    core.apply_full_worker_list([make_heartbeat(rng, a, NOW_MS) for a in addrs], NOW_MS)

    # Ingest: a stream of fresh heartbeats, as the watcher delivers them.
    updates = [make_heartbeat(rng, rng.choice(addrs), NOW_MS + i // n) for i in range(200_000)]
    t0 = time.perf_counter()
    for i, hb in enumerate(updates):
        core.apply_worker_update(hb, NOW_MS + i // n)
    ingest_s = time.perf_counter() - t0
    raw = [encode_heartbeat(hb) for hb in updates[:50_000]]
    t0 = time.perf_counter()
    for i, body in enumerate(raw):
        core.apply_worker_update(decode_heartbeat(body), NOW_MS + i // n)
    ingest_decode_s = time.perf_counter() - t0

    # Selection, interleaved with heartbeats and feedback so the index keeps moving.
    now = NOW_MS + 1000
    indexed: list[int] = []
    for i in range(20_000):
        if i % 4 == 0:
            core.apply_worker_update(make_heartbeat(rng, rng.choice(addrs), now), now)
        exclude = frozenset(rng.sample(addrs, 2)) if i % 10 == 0 else frozenset()
        t = time.perf_counter_ns()
        result = core.select_candidate("task", exclude, now)
        indexed.append(time.perf_counter_ns() - t)
        if i % 50 == 0 and isinstance(result, Candidate):
            core.record_slot_rejection(result.worker_addr, now)
    indexed.sort()

    linear: list[int] = []
    for _ in range(max(50, 200_000 // n)):
        t = time.perf_counter_ns()
        linear_select(core, frozenset(), now)
        linear.append(time.perf_counter_ns() - t)
    linear.sort()

    return {
        "workers": n,
        "select_p50_us": round(percentile(indexed, 0.50), 2),
        "select_p99_us": round(percentile(indexed, 0.99), 2),
        "select_max_us": round(indexed[-1] / 1000, 2),
        "linear_scan_p50_us": round(percentile(linear, 0.50), 2),
        "linear_scan_p99_us": round(percentile(linear, 0.99), 2),
        "speedup_vs_linear_p50": round(percentile(linear, 0.5) / percentile(indexed, 0.5), 1),
        "ingest_updates_per_s": round(len(updates) / ingest_s),
        "ingest_with_json_decode_per_s": round(len(raw) / ingest_decode_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="CoordinatorCore benchmark")
    parser.add_argument("--workers", default="100,1000,10000")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results = [bench(int(n), rng) for n in args.workers.split(",")]
    print(json.dumps({"bench": "coordinator_core", "results": results}))


if __name__ == "__main__":
    main()
