"""Task end-to-end benchmark: one Coordinator and one Worker on loopback.

Run: uv run python bench/worker_bench.py [--serial 300] [--clients 64] [--seconds 10]

Prints one JSON line:

* ``task_serial``: single-call tasks (``echo(i)`` with ReturnValueResultHandler), one
  client: ReserveWorkerSlot → SubmitTask(slot_id) → WatchTasks to the terminal update;
  p50/p99 latency.
* ``task_concurrent``: the same with ``--clients`` concurrent clients; tasks/s.
* Baselines measured in the same run with the same client: a grpclib unary echo
  (one hop), and an echo relayed through a second grpclib server (two hops), serial
  and at the same concurrency. A task is three RPCs (one of them a stream), two of
  which hop twice inside the system (coordinator → worker, worker → executor), so
  the ratios say what the machinery costs over bare gRPC.

The worker runs with TASK_SLOTS=256 so that 64 clients measure throughput, not
NoSlot back-off, and 2 executors (2 cores here). The coordinator's CPU red line is
lifted to 1.0: everything shares one saturated host, and at the default 0.90 the
coordinator would (correctly) stop routing to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from closed_loop import free_port, measure
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from blockx_proto import coordinator_v1, worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = "def echo(x):\n    return x\n"


class Echo(coordinator_v1.CoordinatorServiceBase):
    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        return coordinator_v1.ReserveWorkerSlotResponse(task_id=message.task_id)


class Relay(coordinator_v1.CoordinatorServiceBase):
    def __init__(self, port: int) -> None:
        self._stub = coordinator_v1.CoordinatorServiceStub(Channel("127.0.0.1", port))

    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        return await self._stub.reserve_worker_slot(message)


async def echo_baselines(serial: int, clients: int, seconds: float) -> dict[str, Any]:
    echo_port, relay_port = free_port(), free_port()
    echo, relay = Server([Echo()]), Server([Relay(echo_port)])
    await echo.start("127.0.0.1", echo_port)
    await relay.start("127.0.0.1", relay_port)
    out: dict[str, Any] = {}
    try:
        for name, port in (("one_hop", echo_port), ("two_hops", relay_port)):
            channel = Channel("127.0.0.1", port)
            stub = coordinator_v1.CoordinatorServiceStub(channel)

            async def call(i: int, stub: Any = stub) -> object:
                return await stub.reserve_worker_slot(
                    coordinator_v1.ReserveWorkerSlotRequest(task_id=str(i))
                )

            await measure(call, 8, count=500)
            out[f"echo_{name}_serial"] = await measure(call, 1, count=serial)
            out[f"echo_{name}_concurrent"] = await measure(call, clients, seconds=seconds)
            channel.close()
    finally:
        echo.close()
        relay.close()
    return out


async def run_task(coordinator: Channel, workers: dict[str, Channel], task_id: str) -> None:
    stub = coordinator_v1.CoordinatorServiceStub(coordinator)
    while True:
        try:
            slot = await stub.reserve_worker_slot(
                coordinator_v1.ReserveWorkerSlotRequest(task_id=task_id)
            )
            break
        except GRPCError:  # NoSlot or not ready: back off a little
            await asyncio.sleep(0.005)
    channel = workers.get(slot.worker_addr)
    if channel is None:
        host, port = slot.worker_addr.rsplit(":", 1)
        channel = workers[slot.worker_addr] = Channel(host, int(port))
    worker = worker_v1.WorkerServiceStub(channel)
    task = worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type="CallListCallConfig", config=json.dumps({"function": "echo", "callList": [[1]]})
        ),
        result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
    )
    await worker.submit_task(worker_v1.SubmitTaskRequest(task=task, slot_id=slot.slot_id))
    final = None
    async for update in worker.watch_tasks(worker_v1.WatchTasksRequest(task_ids=[task_id])):
        final = update
    if final is None or final.state is not worker_v1.TaskState.SUCCEEDED:
        raise RuntimeError(f"task {task_id} ended {final}")


async def bench_tasks(serial: int, clients: int, seconds: float) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="worker-bench-"))
    (workdir / "functions").mkdir()
    (workdir / "functions" / "bench.py").write_text(FUNCTIONS)
    async with EtcdServer() as etcd:
        coord_port, worker_port = free_port(), free_port()
        env = {**os.environ, "ETCD_ENDPOINTS": etcd.endpoint, "BLOCKX_LOG_LEVEL": "WARNING"}
        log = (workdir / "processes.log").open("wb")
        procs = [
            await asyncio.create_subprocess_exec(
                shutil.which("blockx-coordinator") or "blockx-coordinator",
                env={
                    **env,
                    "COORDINATOR_LISTEN": f"127.0.0.1:{coord_port}",
                    # Client, coordinator and worker share this 2-core host: its CPU is
                    # saturated by design here, which would shed the worker at 0.90.
                    "COORDINATOR_CPU_RED_LINE": "1.0",
                },
                stdout=log,
                stderr=log,
            ),
            await asyncio.create_subprocess_exec(
                shutil.which("blockx-worker") or "blockx-worker",
                env={
                    **env,
                    "WORKER_LISTEN": f"127.0.0.1:{worker_port}",
                    "FUNCTIONS_DIR": str(workdir / "functions"),
                    "EXECUTOR_COUNT": "2",
                    "TASK_SLOTS": "256",
                },
                stdout=log,
                stderr=log,
            ),
        ]
        coordinator = Channel("127.0.0.1", coord_port)
        workers: dict[str, Channel] = {}
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    await run_task(coordinator, workers, "warm-up-0")
                    break
                except (GRPCError, OSError, RuntimeError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)

            async def task(i: int, tag: str = "") -> object:
                await run_task(coordinator, workers, f"{tag}{i}")
                return None

            await measure(lambda i: task(i, "warm-"), 8, count=200)
            return {
                "task_serial": await measure(lambda i: task(i, "s-"), 1, count=serial),
                "task_concurrent": await measure(lambda i: task(i, "c-"), clients, seconds=seconds),
            }
        finally:
            coordinator.close()
            for channel in workers.values():
                channel.close()
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                await asyncio.wait_for(proc.wait(), 30)
            log.close()
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial", type=int, default=300)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    tasks = asyncio.run(bench_tasks(args.serial, args.clients, args.seconds))
    echo = asyncio.run(echo_baselines(args.serial, args.clients, args.seconds))
    serial, concurrent = tasks["task_serial"], tasks["task_concurrent"]
    out = {
        "bench": "worker",
        **tasks,
        **echo,
        "ratios": {
            "task_p50_vs_one_hop_p50": round(
                serial["p50_ms"] / echo["echo_one_hop_serial"]["p50_ms"], 1
            ),
            "task_p50_vs_two_hops_p50": round(
                serial["p50_ms"] / echo["echo_two_hops_serial"]["p50_ms"], 1
            ),
            "tasks_per_s_vs_one_hop_per_s": round(
                concurrent["per_s"] / echo["echo_one_hop_concurrent"]["per_s"], 3
            ),
            "tasks_per_s_vs_two_hops_per_s": round(
                concurrent["per_s"] / echo["echo_two_hops_concurrent"]["per_s"], 3
            ),
        },
    }
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
