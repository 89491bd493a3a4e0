"""Placement benchmark: ReserveWorkerSlot through a real Coordinator and a real Worker.

Run: uv run python bench/placement_bench.py [--slots 1000000,5000] [--seconds 10]
     [--rounds 5] [--concurrency 64] [--skip-core] [--stalls]

A real etcd, a real ``blockx-coordinator`` (``COORDINATOR_SLOT_TTL_MS=1000``: every
reservation it makes asks the Worker for a 1 s slot TTL) and a real ``blockx-worker``
with ``TASK_SLOTS`` from ``--slots`` (one run per value). Reservations are never
submitted, so they expire after 1 s and the Worker's slot table turns over under load.
A closed loop of ``--concurrency`` callers sends ReserveWorkerSlot: throughput, p50,
p99 and max latency.

Baseline, measured in the same run with the same client and concurrency: a two-hop
grpclib echo. The client calls echo server A (its own process), which forwards each
request to echo server B (another process) over a warm channel and then answers; the
request and response are ReserveWorkerSlot messages of the same size as the real ones.
Placement and echo alternate in ``--rounds`` windows that add up to ``--seconds`` each,
so other load on the host weighs on both alike. Printed ratios:
``throughput_vs_two_hop`` (goal ≥ 0.7), ``p50_vs_two_hop`` (goal ≤ 1.5) and
``p99_vs_two_hop``.

``--stalls`` adds, per run, what stalled the coordinator's and the worker's event
loops inside the measuring windows: asyncio callbacks that ran over 2 ms (by callback)
and cyclic GC passes over 1 ms (a probe installed as their sitecustomize). Wall time:
on a loaded host a callback that was descheduled counts too.

Unless ``--skip-core``, the output also carries bench/worker_core_bench.py's table at
10,000 and 1,000,000 slots with 100 in use (50 ALLOCATED + 50 RUNNING), and at 50 slots
with 49 in use (the most it can hold with one slot free), which shows
that tick and heartbeat derivation do not grow with TASK_SLOTS.

On a 2-core machine the client, the coordinator, the worker and the echo servers share
the CPU: absolute figures are a floor; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO

from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from blockx_proto import coordinator_v1
from blockx_server.etcd.local import EtcdServer

SLOT_TTL_MS = 1000
# A realistic slot handle and worker address, so the echo's response is as large as
# a real ReserveWorkerSlotResponse.
_ECHO_SLOT_ID = "s" * 32
_ECHO_WORKER_ADDR = "127.0.0.1:65535"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def percentile_ms(sorted_ns: Sequence[int], q: float) -> float:
    if not sorted_ns:
        return 0.0
    return round(sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e6, 3)


class Samples:
    """Latencies, time spent and errors of one or more measuring windows."""

    def __init__(self) -> None:
        self.latencies_ns: list[int] = []
        self.elapsed_s = 0.0
        self.errors = 0

    def summary(self) -> dict[str, float]:
        latencies = sorted(self.latencies_ns)
        return {
            "calls_per_s": round(len(latencies) / self.elapsed_s, 1),
            "p50_ms": percentile_ms(latencies, 0.5),
            "p99_ms": percentile_ms(latencies, 0.99),
            "max_ms": percentile_ms(latencies, 1.0),
            "errors": self.errors,
        }


async def closed_loop(
    call: Callable[[], Awaitable[object]], concurrency: int, seconds: float, into: Samples
) -> None:
    """``concurrency`` callers in a loop for ``seconds``, recorded ``into``."""
    stop_at = time.perf_counter() + seconds

    async def caller() -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter_ns()
            try:
                await call()
            except GRPCError:
                into.errors += 1
                continue
            into.latencies_ns.append(time.perf_counter_ns() - started)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    into.elapsed_s += time.perf_counter() - started


# ---- the two-hop echo baseline (each server runs as its own process) ------------------


class _EchoB(coordinator_v1.CoordinatorServiceBase):
    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        return coordinator_v1.ReserveWorkerSlotResponse(
            task_id=message.task_id, worker_addr=_ECHO_WORKER_ADDR, slot_id=_ECHO_SLOT_ID
        )


class _EchoA(coordinator_v1.CoordinatorServiceBase):
    def __init__(self, next_port: int) -> None:
        self._next = coordinator_v1.CoordinatorServiceStub(Channel("127.0.0.1", next_port))

    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        return await self._next.reserve_worker_slot(message)


async def _serve_echo(port: int, next_port: int | None) -> None:
    server = Server([_EchoB() if next_port is None else _EchoA(next_port)])
    await server.start("127.0.0.1", port)
    await server.wait_closed()


def _spawn(argv: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


async def _wait_ready(call: Callable[[], Awaitable[object]], what: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            await call()
            return
        except (GRPCError, OSError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer: {exc}") from None
            await asyncio.sleep(0.1)


def _reserve_call(
    stub: coordinator_v1.CoordinatorServiceStub,
) -> Callable[[], Awaitable[object]]:
    async def reserve() -> object:
        return await stub.reserve_worker_slot(
            coordinator_v1.ReserveWorkerSlotRequest(task_id=uuid.uuid4().hex), timeout=10
        )

    return reserve


@contextlib.asynccontextmanager
async def _reserving(
    procs: list[subprocess.Popen[bytes]], port: int, what: str, *, ready_s: float, stop_s: float
) -> AsyncIterator[Callable[[], Awaitable[object]]]:
    """ReserveWorkerSlot at ``port`` once ``what`` answers; afterwards the channel is
    closed and ``procs`` are stopped."""
    channel = Channel("127.0.0.1", port)
    try:
        call = _reserve_call(coordinator_v1.CoordinatorServiceStub(channel))
        await _wait_ready(call, what, ready_s)
        yield call
    finally:
        channel.close()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(stop_s)


@contextlib.asynccontextmanager
async def two_hop_echo(log: IO[bytes]) -> AsyncIterator[Callable[[], Awaitable[object]]]:
    """Echo servers A and B in their own processes; yields the call to A."""
    port_a, port_b = free_port(), free_port()
    me = [sys.executable, __file__, "--echo-server"]
    procs = [
        _spawn([*me, str(port_b)], dict(os.environ), log),
        _spawn([*me, str(port_a), str(port_b)], dict(os.environ), log),
    ]
    async with _reserving(procs, port_a, "the echo servers", ready_s=30, stop_s=10) as call:
        yield call


# ---- the event-loop stall probe (--stalls) --------------------------------------------

# Installed as sitecustomize.py in the coordinator and worker only. It times every
# asyncio callback and every cyclic GC pass, and at exit writes the ones over
# 2 ms (callbacks) and 1 ms (GC) with their CLOCK_MONOTONIC time, which every process
# on the host shares, so the bench can keep those inside its measuring windows.
_PROBE_SOURCE = """
import atexit, gc, json, os, sys, time
import asyncio.events

_out = os.environ.get("BLOCKX_BENCH_STALLS_DIR")
if _out:
    _name = os.path.basename(sys.argv[0])
    _stalls, _gcs, _gc_started = [], [], [0, 0.0]
    _run = asyncio.events.Handle._run

    def _label(handle):
        task = getattr(handle._callback, "__self__", None)
        if task is not None and hasattr(task, "get_coro"):
            coro = task.get_coro()
            return "task " + str(getattr(coro, "__qualname__", coro))
        return str(getattr(handle._callback, "__qualname__", handle._callback))[:100]

    def _timed_run(self):
        started = time.perf_counter_ns()
        _run(self)
        took = time.perf_counter_ns() - started
        if took > 2_000_000:
            _stalls.append((time.monotonic(), took / 1e6, _label(self)))

    def _on_gc(phase, info):
        if phase == "start":
            _gc_started[:] = [time.perf_counter_ns(), time.monotonic()]
        else:
            took = time.perf_counter_ns() - _gc_started[0]
            if took > 1_000_000:
                _gcs.append((_gc_started[1], took / 1e6, info["generation"]))

    def _dump():
        path = os.path.join(_out, f"{_name}-{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump({"process": _name, "stalls": _stalls, "gc": _gcs}, f)

    asyncio.events.Handle._run = _timed_run
    gc.callbacks.append(_on_gc)
    atexit.register(_dump)
"""


class StallProbe:
    """Loop stalls and GC pauses of the coordinator and worker inside the windows."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        (directory / "site").mkdir(parents=True, exist_ok=True)
        (directory / "site" / "sitecustomize.py").write_text(_PROBE_SOURCE)
        self.windows: list[tuple[float, float]] = []

    def env(self) -> dict[str, str]:
        path = os.pathsep.join(
            filter(None, [str(self._dir / "site"), os.environ.get("PYTHONPATH")])
        )
        return {"PYTHONPATH": path, "BLOCKX_BENCH_STALLS_DIR": str(self._dir)}

    def _inside(self, at: float) -> bool:
        return any(start <= at <= end for start, end in self.windows)

    def collect(self) -> dict[str, object]:
        """Per process: stalls over 2 ms by callback (count, max), GC passes over 1 ms."""
        out: dict[str, object] = {}
        for path in sorted(self._dir.glob("*.json")):
            data = json.loads(path.read_text())
            by_callback: dict[str, list[float]] = {}
            for at, took_ms, label in data["stalls"]:
                if self._inside(at):
                    by_callback.setdefault(label, []).append(took_ms)
            gcs = [(took, gen) for at, took, gen in data["gc"] if self._inside(at)]
            out[data["process"]] = {
                "stalls_over_2ms": {
                    label: {"count": len(t), "max_ms": round(max(t), 2)}
                    for label, t in sorted(by_callback.items(), key=lambda kv: -sum(kv[1]))[:6]
                },
                "gc_over_1ms": len(gcs),
                "gc_max_ms": round(max((t for t, _ in gcs), default=0.0), 2),
                "gc_full_collections_over_1ms": sum(1 for _, gen in gcs if gen == 2),
            }
            path.unlink()
        self.windows.clear()
        return out


# ---- the real Coordinator and Worker --------------------------------------------------


@contextlib.asynccontextmanager
async def placement(
    task_slots: int, workdir: Path, log: IO[bytes], probe: StallProbe | None
) -> AsyncIterator[Callable[[], Awaitable[object]]]:
    """etcd, a coordinator and a worker with ``task_slots``; yields ReserveWorkerSlot."""
    functions = workdir / "functions"
    functions.mkdir(exist_ok=True)
    (functions / "bench.py").write_text("def echo(x):\n    return x\n")
    async with EtcdServer() as etcd:
        coord_port, worker_port = free_port(), free_port()
        env = {**os.environ, "ETCD_ENDPOINTS": etcd.endpoint, "BLOCKX_LOG_LEVEL": "WARNING"}
        if probe is not None:
            env.update(probe.env())
        procs = [
            _spawn(
                [shutil.which("blockx-coordinator") or "blockx-coordinator"],
                {
                    **env,
                    "COORDINATOR_LISTEN": f"127.0.0.1:{coord_port}",
                    "COORDINATOR_SLOT_TTL_MS": str(SLOT_TTL_MS),
                    # Everything shares this 2-core host: its CPU is saturated by design,
                    # which would (correctly) shed the Worker at the default 0.90.
                    "COORDINATOR_CPU_RED_LINE": "1.0",
                },
                log,
            ),
            _spawn(
                [shutil.which("blockx-worker") or "blockx-worker"],
                {
                    **env,
                    "WORKER_LISTEN": f"127.0.0.1:{worker_port}",
                    "FUNCTIONS_DIR": str(functions),
                    "EXECUTOR_COUNT": "1",
                    "TASK_SLOTS": str(task_slots),
                },
                log,
            ),
        ]
        what = "the coordinator and worker"
        async with _reserving(procs, coord_port, what, ready_s=60, stop_s=30) as call:
            yield call


async def bench(
    slot_counts: list[int],
    concurrency: int,
    seconds: float,
    rounds: int,
    workdir: Path,
    log: IO[bytes],
    probe: StallProbe | None,
) -> list[dict[str, object]]:
    """Per TASK_SLOTS value: placement and echo measured in alternating windows, so a
    change in the load other processes put on the host affects both alike."""
    runs: list[dict[str, object]] = []
    async with two_hop_echo(log) as echo:
        for slots in slot_counts:
            async with placement(slots, workdir, log, probe) as reserve:
                warm_up = Samples()
                await closed_loop(echo, concurrency, 1.0, warm_up)
                await closed_loop(reserve, concurrency, 1.0, warm_up)
                ours, theirs = Samples(), Samples()
                for _ in range(rounds):
                    started = time.monotonic()
                    await closed_loop(reserve, concurrency, seconds / rounds, ours)
                    if probe is not None:
                        probe.windows.append((started, time.monotonic()))
                    await closed_loop(echo, concurrency, seconds / rounds, theirs)
            mine, base = ours.summary(), theirs.summary()
            stalls = {} if probe is None else {"stalls": probe.collect()}
            runs.append(
                {
                    "task_slots": slots,
                    "reserve_worker_slot": mine,
                    "two_hop_echo": base,
                    "throughput_vs_two_hop": round(mine["calls_per_s"] / base["calls_per_s"], 2),
                    "p50_vs_two_hop": round(mine["p50_ms"] / base["p50_ms"], 2),
                    "p99_vs_two_hop": round(mine["p99_ms"] / base["p99_ms"], 2),
                    **stalls,
                }
            )
    return runs


def worker_core_table() -> str:
    """worker_core_bench.py's table: 100 slots in use at 10,000 and 1,000,000 slots, and
    49 (the most 50 slots hold with one left free) at 50."""
    bench = Path(__file__).with_name("worker_core_bench.py")
    out = []
    for slots, reserved, running in (("50", "25", "24"), ("10000,1000000", "50", "50")):
        argv = [sys.executable, str(bench), "--slots", slots]
        argv += ["--reserved", reserved, "--running", running]
        out.append(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
    return "".join(out)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--echo-server":
        ports = [int(p) for p in sys.argv[2:]]
        asyncio.run(_serve_echo(ports[0], ports[1] if len(ports) > 1 else None))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1000000,5000")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-core", action="store_true")
    parser.add_argument(
        "--stalls",
        action="store_true",
        help="time every asyncio callback and GC pass in the coordinator and worker",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="placement-bench-"))
    slot_counts = [int(s) for s in args.slots.split(",")]
    with (workdir / "processes.log").open("wb") as log:
        try:
            probe = StallProbe(workdir / "stalls") if args.stalls else None
            runs = asyncio.run(
                bench(slot_counts, args.concurrency, args.seconds, args.rounds, workdir, log, probe)
            )
        except Exception:
            log.flush()
            print((workdir / "processes.log").read_text()[-4000:], file=sys.stderr)
            raise
    shutil.rmtree(workdir, ignore_errors=True)
    out: dict[str, object] = {
        "bench": "placement",
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "slot_ttl_ms": SLOT_TTL_MS,
        "rounds": args.rounds,
        "runs": runs,
        "goals": {"throughput_vs_two_hop": ">= 0.7", "p50_vs_two_hop": "<= 1.5"},
    }
    print(json.dumps(out))
    if not args.skip_core:
        print(worker_core_table(), end="")


if __name__ == "__main__":
    main()
