"""A Worker's bounds under a hostile task: ten million calls, and large retained results.

Run: uv run python bench/task_bounds.py [--calls 10000000] [--results 12]
     [--result-bytes 50000000] [--small-budget 134217728] [--scenarios calls,retention]

``blockx-worker`` is the one on PATH, so running this from another worktree's
environment (``cd ../other && uv run python /path/to/bench/task_bounds.py``)
measures that worktree's Worker; figures its Worker does not export show as None.

* calls: a fresh Worker (2 executors, default settings) gets one
  CallListCallConfig task of ``--calls`` calls of a function returning 1,000
  characters (about 40 MB of config). A grpc.health.v1 Check runs in a loop on
  its own channel from before SubmitTask until the terminal update; measured:
  the Checks' latency (p50, p99, max; a Check unanswered in 30 s counts as 30 s),
  the Worker's peak RSS (VmHWM), the wall time and how the task ended.
* retention: a fresh Worker per budget runs ``--results`` tasks one after
  another, each returning one string of ``--result-bytes`` (ReturnValue), and
  keeps them for the default RESULT_RETENTION_MS; measured: the Worker's RSS after
  the last (and its peak), the retained results and tombstones it reports.
  Budgets: the default RESULT_RETENTION_MAX_BYTES (1 GiB) and ``--small-budget``.

Prints a table per scenario, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from grpclib.client import Channel
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest
from proc_status import status_kb
from processes import WorkerProcess, execute_result, run_to_end

from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
def wide(x):
    return "x" * 1000

def big(n):
    return "x" * n
"""
PROBE_TIMEOUT_S = 30.0


def _metric(page: str, name: str) -> float | None:
    match = re.search(rf"^{name} (\S+)$", page, re.MULTILINE)
    return float(match.group(1)) if match else None


def _task(task_id: str, function: str, calls_json: str) -> worker_v1.TaskInput:
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type="CallListCallConfig",
            config=f'{{"function": "{function}", "callList": {calls_json}}}',
        ),
        result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
    )


def _worker(workdir: Path, etcd: EtcdServer, name: str, **env: str) -> WorkerProcess:
    return WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd.endpoint,
            "WORKER_REGISTRY_PREFIX": f"/blockx/bench/lanes/{name}/workers/",
            "FUNCTIONS_DIR": str(workdir / "functions"),
            "BLOCKX_LOG_LEVEL": "WARNING",
            "TASK_DEADLINE_MS": "3600000",
            # Room for the ~40 MB SubmitTask, should the Worker bound what it receives.
            "GRPC_MAX_RECEIVE_BYTES": str(64 * 1024 * 1024),
            **env,
        },
        workdir / f"worker-{name}.log",
    )


async def _probe(port: int, latencies: list[float], stop: asyncio.Event) -> None:
    channel = Channel("127.0.0.1", port)
    try:
        stub = HealthStub(channel)
        while not stop.is_set():
            started = time.perf_counter()
            try:
                await stub.Check(
                    HealthCheckRequest(service="worker.v1.WorkerService"), timeout=PROBE_TIMEOUT_S
                )
                latencies.append(time.perf_counter() - started)
            except (TimeoutError, OSError, Exception):
                latencies.append(max(PROBE_TIMEOUT_S, time.perf_counter() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.01)
    finally:
        channel.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_calls(workdir: Path, etcd: EtcdServer, calls: int) -> dict[str, Any]:
    worker = _worker(workdir, etcd, "calls")
    try:
        await worker.wait_ready()
        pid = worker.proc.pid
        idle_kb = status_kb(pid, "VmRSS")
        calls_json = "[" + ",".join(["[1]"] * calls) + "]"
        task = _task("ten-million", "wide", calls_json)
        latencies: list[float] = []
        stop = asyncio.Event()
        prober = asyncio.create_task(_probe(worker.port, latencies, stop))
        await asyncio.sleep(0.2)  # a few probes of the idle Worker first
        channel = Channel("127.0.0.1", worker.port)
        try:
            started = time.perf_counter()
            final = await run_to_end(worker_v1.WorkerServiceStub(channel), task, timeout=3600)
            seconds = time.perf_counter() - started
        finally:
            channel.close()
            stop.set()
            await prober
        result = execute_result(final)
        return {
            "calls": calls,
            "config_mb": round(len(calls_json) / 1e6, 1),
            "state": final.state.name,
            "failure_code": result.failure_code,
            "failure_message": result.failure_message[:160],
            "seconds": round(seconds, 2),
            "idle_rss_mb": round(idle_kb / 1024, 1),
            "worker_peak_rss_mb": round(status_kb(pid, "VmHWM") / 1024, 1),
            "probes": len(latencies),
            "probe_p50_ms": round(statistics.median(latencies) * 1000, 1),
            "probe_p99_ms": round(_percentile(latencies, 0.99) * 1000, 1),
            "probe_max_ms": round(max(latencies) * 1000, 1),
        }
    finally:
        worker.stop()


async def run_retention(
    workdir: Path, etcd: EtcdServer, results: int, size: int, budget: int | None
) -> dict[str, Any]:
    name = "default" if budget is None else f"budget-{budget}"
    env = {} if budget is None else {"RESULT_RETENTION_MAX_BYTES": str(budget)}
    worker = _worker(workdir, etcd, name, **env)
    try:
        await worker.wait_ready()
        pid = worker.proc.pid
        idle_kb = status_kb(pid, "VmRSS")
        channel = Channel("127.0.0.1", worker.port)
        try:
            stub = worker_v1.WorkerServiceStub(channel)
            started = time.perf_counter()
            for i in range(results):
                final = await run_to_end(stub, _task(f"big-{i}", "big", f"[[{size}]]"), 600)
                assert final.state is worker_v1.TaskState.SUCCEEDED, execute_result(final)
            seconds = time.perf_counter() - started
        finally:
            channel.close()
        page = worker.metrics()
        return {
            "budget": "default" if budget is None else budget,
            "results": results,
            "result_mb": round(size / 1e6, 1),
            "seconds": round(seconds, 2),
            "idle_rss_mb": round(idle_kb / 1024, 1),
            "rss_after_mb": round(status_kb(pid, "VmRSS") / 1024, 1),
            "worker_peak_rss_mb": round(status_kb(pid, "VmHWM") / 1024, 1),
            "retained_results": _metric(page, "blockx_worker_retained_results"),
            "retained_mb": _mb(_metric(page, "blockx_worker_retained_result_bytes")),
            "tombstones": _metric(page, "blockx_worker_result_tombstones"),
        }
    finally:
        worker.stop()


def _mb(value: float | None) -> float | None:
    return None if value is None else round(value / 1e6, 1)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="task-bounds-bench-"))
    out: dict[str, Any] = {"bench": "task_bounds", "worker": shutil.which("blockx-worker")}
    try:
        (workdir / "functions").mkdir()
        (workdir / "functions" / "bench.py").write_text(FUNCTIONS)
        async with EtcdServer() as etcd:
            if "calls" in args.scenarios:
                out["calls"] = await run_calls(workdir, etcd, args.calls)
            if "retention" in args.scenarios:
                out["retention"] = [
                    await run_retention(workdir, etcd, args.results, args.result_bytes, budget)
                    for budget in (None, args.small_budget)
                ]
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _table(rows: list[dict[str, Any]]) -> str:
    head = list(rows[0])
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    lines += [" | ".join(str(row[k]) for k in head) for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000_000)
    parser.add_argument("--results", type=int, default=12)
    parser.add_argument("--result-bytes", type=int, default=50_000_000)
    parser.add_argument("--small-budget", type=int, default=128 * 1024 * 1024)
    parser.add_argument("--scenarios", default="calls,retention")
    args = parser.parse_args()
    args.scenarios = args.scenarios.split(",")
    out = asyncio.run(bench(args))
    print(f"worker: {out['worker']}")
    if "calls" in out:
        print(_table([out["calls"]]))
    if "retention" in out:
        print(_table(out["retention"]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
