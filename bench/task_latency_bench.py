"""Single-call task latency against a one-hop grpclib echo, in one run.

Run: uv run python bench/task_latency_bench.py [--serial 400] [--clients 64] [--seconds 8]
     [--event-loop asyncio|uvloop]  (the client, coordinator and worker's loop;
     the echo baseline always runs on asyncio's, the stack it is the baseline of)

Prints one JSON line:

* ``task_serial``: ``double(1)`` tasks one at a time through the client SDK
  (``Client.run``: ReserveWorkerSlot at a real Coordinator, which calls the Worker's
  RequestTaskSlot; SubmitTask to the Worker; WatchTasks to the terminal update),
  against a real etcd, ``blockx-coordinator`` and ``blockx-worker`` (2 warm
  executors); p50/p99 in ms.
* ``task_concurrent``: the same with ``--clients`` concurrent clients; tasks/s.
* ``echo_serial`` / ``echo_concurrent``: a grpclib unary echo served by a separate
  process of this interpreter and event loop, over one warm channel, whose request
  and answer are each the size of the bench's SubmitTask request; at 1 and at
  ``--clients`` in flight.
* ``cpu_us_per_task`` / ``cpu_us_per_echo``: CPU time each process spent per serial
  task (client, coordinator, worker, its executors) and per serial echo (client,
  server), from the scheduler's per-thread figures: where a task's time goes by
  hop, and a figure the machine's other load barely moves.
* ``ratios``: task p50 / echo p50 (a task's critical path is four such hops, so
  about 4 is what adds little beyond its messages) and tasks/s / echoes/s.
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

from closed_loop import free_port, measure, stats
from grpclib.client import Channel
from grpclib.server import Server
from proc_status import children, cpu_ns

from blockx_client import Client, Task
from blockx_proto import coordinator_v1, worker_v1
from blockx_server.etcd.local import EtcdServer
from blockx_server.runtime.event_loop import EventLoop, run_on

FUNCTIONS = "def double(x):\n    return x * 2\n"


def submit_request_size() -> int:
    """The encoded size of the SubmitTask request the bench's tasks send."""
    task = worker_v1.TaskInput(
        task_id="00000000-0000-0000-0000-000000000000",
        function_call_config=worker_v1.FunctionCallConfig(
            type="CallListCallConfig", config=json.dumps({"function": "double", "callList": [[1]]})
        ),
        result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
    )
    request = worker_v1.SubmitTaskRequest(task=task, slot_id="0" * 36)
    return len(bytes(request))


class Echo(coordinator_v1.CoordinatorServiceBase):
    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        return coordinator_v1.ReserveWorkerSlotResponse(task_id=message.task_id)


async def serve_echo(port: int) -> None:
    server = Server([Echo()])
    await server.start("127.0.0.1", port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("serving", flush=True)
    await stop.wait()
    server.close()
    await server.wait_closed()


async def echo_baseline(serial: int, clients: int, seconds: float) -> dict[str, Any]:
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--echo-server", str(port), stdout=asyncio.subprocess.PIPE
    )
    assert server.stdout is not None
    try:
        await server.stdout.readline()
        channel = Channel("127.0.0.1", port)
        stub = coordinator_v1.CoordinatorServiceStub(channel)
        payload = "x" * submit_request_size()

        async def call(i: int) -> object:
            return await stub.reserve_worker_slot(
                coordinator_v1.ReserveWorkerSlotRequest(task_id=payload)
            )

        await measure(call, 8, count=1000)
        pids = {"client": os.getpid(), "server": server.pid}
        before = {name: cpu_ns(pid) for name, pid in pids.items()}
        echo_serial = await measure(call, 1, count=serial * 4)
        out = {
            "echo_payload_bytes": len(payload),
            "echo_serial": echo_serial,
            "cpu_us_per_echo": cpu_per_op(pids, before, serial * 4),
            "echo_concurrent": await measure(call, clients, seconds=seconds),
        }
        channel.close()
        return out
    finally:
        server.send_signal(signal.SIGTERM)
        await asyncio.wait_for(server.wait(), 30)


async def start(program: str, env: dict[str, str], log: Any) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        shutil.which(program) or program, env=env, stdout=log, stderr=log
    )


def cpu_per_op(pids: dict[str, int], before: dict[str, int], ops: int) -> dict[str, float]:
    """Microseconds of CPU per operation for each named process since ``before``."""
    return {name: round((cpu_ns(pid) - before[name]) / ops / 1e3, 1) for name, pid in pids.items()}


async def phases(client: Client, count: int) -> dict[str, float]:
    """The serial task's critical path by its RPCs, as the client sees each: p50 of
    ReserveWorkerSlot (two hops: client → Coordinator → Worker), SubmitTask, and
    WatchTasks from its opening to the terminal update (the call runs meanwhile)."""
    times: dict[str, list[int]] = {"reserve": [], "submit": [], "watch": []}
    for _ in range(count):
        task = Task.call_list("double", [[1]]).with_id()
        t0 = time.perf_counter_ns()
        slot = await client.reserve_worker_slot(task.task_id)
        t1 = time.perf_counter_ns()
        await client.submit_task(task, worker_addr=slot.worker_addr, slot_id=slot.slot_id)
        t2 = time.perf_counter_ns()
        async for update in client.watch_tasks([task.task_id], worker_addr=slot.worker_addr):
            if update.is_terminal:
                break
        t3 = time.perf_counter_ns()
        for name, took in (("reserve", t1 - t0), ("submit", t2 - t1), ("watch", t3 - t2)):
            times[name].append(took)
    return {name: stats(values, 1.0)["p50_ms"] for name, values in times.items()}


async def bench_tasks(serial: int, clients: int, seconds: float, event_loop: str) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="task-latency-bench-"))
    (workdir / "functions").mkdir()
    (workdir / "functions" / "bench.py").write_text(FUNCTIONS)
    async with EtcdServer() as etcd:
        coord_port, worker_port = free_port(), free_port()
        env = {
            **os.environ,
            "ETCD_ENDPOINTS": etcd.endpoint,
            "BLOCKX_LOG_LEVEL": "WARNING",
            "BLOCKX_EVENT_LOOP": event_loop,
        }
        log = (workdir / "processes.log").open("wb")
        coordinator = await start(
            "blockx-coordinator",
            {
                **env,
                "COORDINATOR_LISTEN": f"127.0.0.1:{coord_port}",
                # Client, coordinator and worker share one small host whose CPU is
                # saturated by design here, which would shed the worker at 0.90.
                "COORDINATOR_CPU_RED_LINE": "1.0",
                "COORDINATOR_MEMORY_RED_LINE": "1.0",
            },
            log,
        )
        worker = await start(
            "blockx-worker",
            {
                **env,
                "WORKER_LISTEN": f"127.0.0.1:{worker_port}",
                "FUNCTIONS_DIR": str(workdir / "functions"),
                "EXECUTOR_COUNT": "2",
                # 64 clients measure throughput, not NoSlot back-off.
                "TASK_SLOTS": "256",
            },
            log,
        )
        print(f"coordinator pid {coordinator.pid}, worker pid {worker.pid}", file=sys.stderr)
        client = Client(coordinator=f"127.0.0.1:{coord_port}")
        try:

            async def task(i: int) -> object:
                result = await client.run(Task.call_list("double", [[1]]))
                if not result.ok or result.outputs() != [2]:
                    raise RuntimeError(f"task {i} ended {result}")
                return None

            deadline = time.monotonic() + 60
            while True:
                try:
                    await task(0)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            await measure(task, 8, count=200)
            pids = {"client": os.getpid(), "coordinator": coordinator.pid, "worker": worker.pid}
            pids.update({f"executor {n}": pid for n, pid in enumerate(children(worker.pid))})
            before = {name: cpu_ns(pid) for name, pid in pids.items()}
            task_serial = await measure(task, 1, count=serial)
            return {
                "task_serial": task_serial,
                "cpu_us_per_task": cpu_per_op(pids, before, serial),
                "task_concurrent": await measure(task, clients, seconds=seconds),
                "phases_serial_p50_ms": await phases(client, serial),
            }
        finally:
            await client.close()
            for proc in (coordinator, worker):
                proc.send_signal(signal.SIGTERM)
            for proc in (coordinator, worker):
                await asyncio.wait_for(proc.wait(), 30)
            log.close()
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--serial", type=int, default=400)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--event-loop", choices=[loop.value for loop in EventLoop], default="asyncio"
    )
    parser.add_argument("--echo-server", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server:
        asyncio.run(serve_echo(args.echo_server))
        return
    tasks = run_on(
        EventLoop(args.event_loop),
        bench_tasks(args.serial, args.clients, args.seconds, args.event_loop),
    )
    echo = asyncio.run(echo_baseline(args.serial, args.clients, args.seconds))
    serial, concurrent = tasks["task_serial"], tasks["task_concurrent"]
    out = {
        "bench": "task_latency",
        "event_loop": args.event_loop,
        **tasks,
        **echo,
        "ratios": {
            "task_p50_vs_echo_p50": round(serial["p50_ms"] / echo["echo_serial"]["p50_ms"], 2),
            "task_p99_vs_echo_p99": round(serial["p99_ms"] / echo["echo_serial"]["p99_ms"], 2),
            "tasks_per_s_vs_echo_per_s": round(
                concurrent["per_s"] / echo["echo_concurrent"]["per_s"], 3
            ),
            "goal_task_p50_vs_echo_p50": 4.0,
        },
    }
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
