"""Single-call task latency against a one-hop grpclib echo, in one run.

Run: uv run python bench/task_latency_bench.py [--serial 400] [--clients 64] [--seconds 8]
     [--event-loop asyncio|uvloop]  (the client, coordinator and worker's loop;
     the echo baseline always runs on asyncio's, the stack it is the baseline of)
     [--ray-python /tmp/ray-venv/bin/python]  (or BLOCKX_BENCH_RAY_PYTHON: an
     interpreter with ``ray``, made with ``python3 -m venv /tmp/ray-venv &&
     /tmp/ray-venv/bin/pip install ray``; ``ray`` is no project dependency. Without
     one the Ray figures are left out and the output says so.)

Prints one JSON line:

* ``task_serial``: ``double(1)`` tasks one at a time through the client SDK
  (``Client.run``: ReserveWorkerSlot at a real Coordinator, which calls the Worker's
  RequestTaskSlot; SubmitTask to the Worker; WatchTasks to the terminal update),
  against a real etcd, ``blockx-coordinator`` and ``blockx-worker`` (2 warm
  executors); p50/p99 in ms.
* ``task_concurrent``: the same with ``--clients`` concurrent clients; tasks/s.
* ``proxy_serial`` / ``proxy_concurrent``: the same tasks through ``blockx-proxy``'s
  Unix socket (the path a client of ``blockx dev up`` takes), beside the direct one.
* ``echo_serial`` / ``echo_concurrent``: a grpclib unary echo served by a separate
  process of this interpreter and event loop, over one warm channel, whose request
  and answer are each the size of the bench's SubmitTask request; at 1 and at
  ``--clients`` in flight.
* ``cpu_us_per_task`` / ``cpu_us_per_echo``: CPU time each process spent per serial
  task (client, coordinator, worker, its executors) and per serial echo (client,
  server), from the scheduler's per-thread figures: where a task's time goes by
  hop, and a figure the machine's other load barely moves.
* ``ray_serial`` / ``ray_concurrent``: Ray's trivial task ``double(1)`` in the same
  closed loop (``bench/ray_peer.py``, run with ``--ray-python``), local Ray with 2 CPUs.
* ``ratios``: task p50 / echo p50 (a task's critical path is six one-way messages,
  three echoes, and one executor round trip: about 4 adds little beyond them) and
  tasks/s at ``--clients`` against the echo's and Ray's.
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
        sys.executable,
        __file__,
        "--echo-server",
        str(port),
        stdout=asyncio.subprocess.PIPE,
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


async def wait_ready(client: Client) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await run_double(client, 0)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def run_double(client: Client, i: int) -> None:
    result = await client.run(Task.call_list("double", [[1]]))
    if not result.ok or result.outputs() != [2]:
        raise RuntimeError(f"task {i} ended {result}")


async def task_figures(
    client: Client, serial: int, clients: int, seconds: float, pids: dict[str, int] | None
) -> dict[str, Any]:
    """Serial p50/p99 (and CPU per task of ``pids``), then tasks/s at ``clients``."""

    async def task(i: int) -> object:
        await run_double(client, i)
        return None

    await wait_ready(client)
    await measure(task, 8, count=200)
    before = {name: cpu_ns(pid) for name, pid in (pids or {}).items()}
    out: dict[str, Any] = {"serial": await measure(task, 1, count=serial)}
    if pids:
        out["cpu_us_per_task"] = cpu_per_op(pids, before, serial)
    out["concurrent"] = await measure(task, clients, seconds=seconds)
    return out


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
        proxy_socket = workdir / "proxy.sock"
        proxy = await start(
            "blockx-proxy",
            {
                **env,
                "PROXY_SOCKET_PATH": str(proxy_socket),
                "PROXY_COORDINATOR_ADDR": f"127.0.0.1:{coord_port}",
            },
            log,
        )
        print(
            f"coordinator pid {coordinator.pid}, worker pid {worker.pid}, proxy pid {proxy.pid}",
            file=sys.stderr,
        )
        client = Client(coordinator=f"127.0.0.1:{coord_port}", direct=True)
        proxied = Client(proxy_socket=str(proxy_socket))
        try:
            await wait_ready(client)
            pids = {"client": os.getpid(), "coordinator": coordinator.pid, "worker": worker.pid}
            pids.update({f"executor {n}": pid for n, pid in enumerate(children(worker.pid))})
            direct = await task_figures(client, serial, clients, seconds, pids)
            phased = await phases(client, serial)
            via_proxy = await task_figures(proxied, serial, clients, seconds, None)
            return {
                "task_serial": direct["serial"],
                "cpu_us_per_task": direct["cpu_us_per_task"],
                "task_concurrent": direct["concurrent"],
                "phases_serial_p50_ms": phased,
                "proxy_serial": via_proxy["serial"],
                "proxy_concurrent": via_proxy["concurrent"],
            }
        finally:
            await client.close()
            await proxied.close()
            for proc in (proxy, coordinator, worker):
                proc.send_signal(signal.SIGTERM)
            for proc in (proxy, coordinator, worker):
                await asyncio.wait_for(proc.wait(), 30)
            log.close()
            shutil.rmtree(workdir, ignore_errors=True)


async def ray_peer(python: str, serial: int, clients: int, seconds: float) -> dict[str, Any]:
    """Ray's figures from ``bench/ray_peer.py`` under ``python``."""
    peer = await asyncio.create_subprocess_exec(
        python,
        str(Path(__file__).with_name("ray_peer.py")),
        "--serial",
        str(serial),
        "--clients",
        str(clients),
        "--seconds",
        str(seconds),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(peer.communicate(), 600)
    except TimeoutError:
        peer.kill()
        await peer.wait()
        return {"ray_error": f"{python} bench/ray_peer.py did not finish in 600 s"}
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    if peer.returncode != 0 or not lines:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        return {"ray_error": f"{python} bench/ray_peer.py exited {peer.returncode}: {tail}"}
    figures: dict[str, Any] = json.loads(lines[-1])
    return figures


def ratio(a: float, b: float, digits: int = 2) -> float | None:
    return round(a / b, digits) if b else None


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--serial", type=int, default=400)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--event-loop", choices=[loop.value for loop in EventLoop], default="asyncio"
    )
    parser.add_argument(
        "--ray-python",
        default=os.environ.get("BLOCKX_BENCH_RAY_PYTHON", "/tmp/ray-venv/bin/python"),
        help="an interpreter with ray installed (env BLOCKX_BENCH_RAY_PYTHON)",
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
    if Path(args.ray_python).exists():
        ray = asyncio.run(ray_peer(args.ray_python, args.serial, args.clients, args.seconds))
    else:
        ray = {
            "ray_error": f"no {args.ray_python}: make it with `python3 -m venv /tmp/ray-venv "
            "&& /tmp/ray-venv/bin/pip install ray`, or name one with --ray-python"
        }
    serial, concurrent = tasks["task_serial"], tasks["task_concurrent"]
    echo_serial = echo["echo_serial"]
    ratios: dict[str, Any] = {
        "task_p50_vs_echo_p50": ratio(serial["p50_ms"], echo_serial["p50_ms"]),
        "task_p99_vs_echo_p99": ratio(serial["p99_ms"], echo_serial["p99_ms"]),
        "proxy_p50_vs_echo_p50": ratio(tasks["proxy_serial"]["p50_ms"], echo_serial["p50_ms"]),
        "tasks_per_s_vs_echo_per_s": ratio(
            concurrent["per_s"], echo["echo_concurrent"]["per_s"], 3
        ),
        "goal_task_p50_vs_echo_p50": 4.0,
    }
    if "ray_concurrent" in ray:
        ray_per_s = ray["ray_concurrent"]["per_s"]
        ratios["tasks_per_s_vs_ray"] = ratio(concurrent["per_s"], ray_per_s, 3)
        ratios["proxy_tasks_per_s_vs_ray"] = ratio(tasks["proxy_concurrent"]["per_s"], ray_per_s, 3)
        ratios["goal_tasks_per_s_vs_ray"] = 1.0
    out = {
        "bench": "task_latency",
        "event_loop": args.event_loop,
        "clients": args.clients,
        **tasks,
        **echo,
        **ray,
        "ratios": ratios,
    }
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
