"""Coordinator benchmark: the core alone, then ReserveWorkerSlot through the real process.

Run: uv run python bench/coordinator_bench.py [--workers 100,1000,10000] [--skip-process]

Prints one JSON line.

``core``: select_candidate latency (p50/p99) and heartbeat ingest (updates/s) in the
CoordinatorCore at each view size. Baseline, measured in the same run: a linear scan
of every worker per request with the specification's filters and comparator (select_candidate
without the index); ``speedup_vs_linear_p50`` is their ratio.

``process``: a real etcd, a real ``blockx-coordinator`` process, and fake Worker gRPC
servers inside this process that grant every RequestTaskSlot. A closed loop of
concurrent clients calls ReserveWorkerSlot; throughput and p50/p99 latency are
reported. Baseline, measured in the same run with the same client and concurrency:
RequestTaskSlot sent straight to a fake worker (one gRPC hop, where a reservation is
two); ``reserve_vs_direct_*`` are the ratios. On a 2-core machine the client and fake
workers share one core's worth of CPU with the coordinator, so the absolute figures
are a floor, and the ratios are what to compare across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence

import aetcd
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from blockx_core.coordinator import Candidate, CoordinatorConfig, CoordinatorCore, WorkerView
from blockx_core.heartbeat import WorkerHeartbeat, decode_heartbeat, encode_heartbeat
from blockx_proto import coordinator_v1, worker_v1
from blockx_server.etcd.local import EtcdServer
from blockx_server.runtime.clock import SYSTEM_CLOCK

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
    """Baseline: the specification's SelectCandidate as a scan of every worker."""
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


class GrantingWorker(worker_v1.WorkerServiceBase):
    def __init__(self) -> None:
        self.granted = 0

    async def request_task_slot(
        self, message: worker_v1.RequestTaskSlotRequest
    ) -> worker_v1.TaskSnapshot:
        self.granted += 1
        return worker_v1.TaskSnapshot(
            task_id=message.task_id,
            slot_id=f"s{self.granted}",
            state=worker_v1.TaskState.ALLOCATED,
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def closed_loop(
    call: Callable[[], Awaitable[object]], concurrency: int, seconds: float
) -> dict[str, float]:
    """``concurrency`` callers in a loop for ``seconds``: throughput and latency."""
    latencies: list[int] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def caller() -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            t = time.perf_counter_ns()
            try:
                await call()
            except GRPCError:
                errors += 1
                continue
            latencies.append(time.perf_counter_ns() - t)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "calls_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(latencies, 0.5) / 1000, 3),
        "p99_ms": round(percentile(latencies, 0.99) / 1000, 3),
        "errors": errors,
    }


async def bench_process(n_workers: int, concurrency: int, seconds: float) -> dict[str, object]:
    prefix = "/blockx/workers/"
    servers: list[Server] = []
    fakes: list[GrantingWorker] = []
    ports: list[int] = []
    async with EtcdServer() as etcd:
        client = aetcd.Client(etcd.host, etcd.port, timeout=5)
        for _ in range(n_workers):
            fake = GrantingWorker()
            server = Server([fake])
            port = free_port()
            await server.start("127.0.0.1", port)
            servers.append(server)
            fakes.append(fake)
            ports.append(port)
            hb = WorkerHeartbeat(
                worker_addr=f"127.0.0.1:{port}",
                task_slots=1_000_000,
                last_heartbeat_ms=SYSTEM_CLOCK.now_ms() + 3_600_000,  # fresh for the run
            )
            await client.put((prefix + hb.worker_addr).encode(), encode_heartbeat(hb))
        await client.close()

        coord_port = free_port()
        binary = shutil.which("blockx-coordinator")
        assert binary is not None, "blockx-coordinator is not installed: uv sync"
        log_dir = tempfile.mkdtemp(prefix="coordinator-bench-")
        log = await asyncio.to_thread(open, os.path.join(log_dir, "coordinator.log"), "wb+")
        proc = await asyncio.create_subprocess_exec(
            binary,
            env={
                **os.environ,
                "COORDINATOR_LISTEN": f"127.0.0.1:{coord_port}",
                "ETCD_ENDPOINTS": etcd.endpoint,
                "BLOCKX_LOG_LEVEL": "WARNING",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        channel = Channel("127.0.0.1", coord_port)
        worker_channel = Channel("127.0.0.1", ports[0])
        try:
            coordinator = coordinator_v1.CoordinatorServiceStub(channel)
            direct = worker_v1.WorkerServiceStub(worker_channel)

            async def reserve() -> object:
                return await coordinator.reserve_worker_slot(
                    coordinator_v1.ReserveWorkerSlotRequest(task_id=uuid.uuid4().hex), timeout=10
                )

            async def request_slot() -> object:
                return await direct.request_task_slot(
                    worker_v1.RequestTaskSlotRequest(task_id=uuid.uuid4().hex, ttl_ms=5000),
                    timeout=10,
                )

            deadline = time.monotonic() + 30
            while True:
                try:
                    await reserve()
                    break
                except (GRPCError, OSError):
                    if time.monotonic() > deadline or proc.returncode is not None:
                        log.seek(0)
                        raise RuntimeError(log.read().decode()) from None
                    await asyncio.sleep(0.1)
            await closed_loop(reserve, concurrency, 1.0)  # warm-up
            results: dict[str, object] = {
                "workers": n_workers,
                "concurrency": concurrency,
                "seconds": seconds,
            }
            for label, conc in (("serial", 1), ("concurrent", concurrency)):
                res = await closed_loop(reserve, conc, seconds)
                base = await closed_loop(request_slot, conc, seconds)
                results[f"reserve_{label}"] = res
                results[f"direct_request_task_slot_{label}"] = base
                results[f"reserve_vs_direct_{label}_p50"] = round(res["p50_ms"] / base["p50_ms"], 2)
                results[f"reserve_vs_direct_{label}_throughput"] = round(
                    res["calls_per_s"] / base["calls_per_s"], 2
                )
            results["granted_by_worker"] = [f.granted for f in fakes]
            return results
        finally:
            channel.close()
            worker_channel.close()
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), timeout=10)
            log.close()
            shutil.rmtree(log_dir)
            for server in servers:
                server.close()
                await server.wait_closed()


def main() -> None:
    parser = argparse.ArgumentParser(description="Coordinator benchmark")
    parser.add_argument("--workers", default="100,1000,10000")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--skip-process", action="store_true")
    parser.add_argument("--process-workers", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    out: dict[str, object] = {
        "bench": "coordinator",
        "core": [bench(int(n), rng) for n in args.workers.split(",")],
    }
    if not args.skip_process:
        out["process"] = asyncio.run(
            bench_process(args.process_workers, args.concurrency, args.seconds)
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
