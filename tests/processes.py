"""Real BlockX processes started from their console scripts, for process-level tests."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from support import free_port, wait_until

from blockx_proto import coordinator_v1, syncinvoker_v1, worker_v1

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class ConsoleProcess:
    """A console script with its own environment; its output goes to ``log``.
    ``wrapper`` comes before the program on the command line (e.g. ``ip netns exec
    NS``, which execs the program: ``proc.pid`` stays the program's)."""

    def __init__(
        self,
        program: str,
        env: dict[str, str],
        log: Path,
        wrapper: Sequence[str] = (),
        args: Sequence[str] = (),
    ) -> None:
        binary = shutil.which(program)
        assert binary is not None, f"{program} is not installed (uv sync)"
        self.program = program
        self.log = log
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen(
            [*wrapper, binary, *args],
            env={**os.environ, **env},
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def assert_alive(self) -> None:
        assert self.alive(), f"{self.program} exited:\n{self.output()}"

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; SIGKILL if it does not stop in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()
        return self.proc.returncode

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._log_file.close()


class CoordinatorProcess(ConsoleProcess):
    def __init__(
        self,
        env: dict[str, str],
        log: Path,
        program: str = "blockx-coordinator",
        *,
        host: str = "127.0.0.1",
        wrapper: Sequence[str] = (),
    ) -> None:
        self.host = host
        self.port = free_port()
        self.metrics_port = free_port()
        super().__init__(
            program,
            {
                "COORDINATOR_LISTEN": f"{host}:{self.port}",
                "BLOCKX_PROMETHEUS_LISTEN_ADDR": f"{host}:{self.metrics_port}",
                "COORDINATOR_ETCD_WATCH_RETRY_DELAY_MS": "100",
                "COORDINATOR_ETCD_DIAL_TIMEOUT_MS": "1000",
                "COORDINATOR_WORKER_RPC_TIMEOUT_MS": "500",
                # Real workers here share a 2-core host with the whole test run, whose CPU
                # is often saturated: at the default 0.90 red line the coordinator would
                # (correctly) shed them. Tests of the red lines set their own values.
                "COORDINATOR_CPU_RED_LINE": "1.0",
                "COORDINATOR_MEMORY_RED_LINE": "1.0",
                **env,
            },
            log,
            wrapper,
        )
        self._channel: Channel | None = None

    @property
    def channel(self) -> Channel:
        """A channel made on first use, in the event loop running then."""
        if self._channel is None:
            self._channel = Channel(self.host, self.port)
        return self._channel

    @property
    def stub(self) -> coordinator_v1.CoordinatorServiceStub:
        return coordinator_v1.CoordinatorServiceStub(self.channel)

    async def wait_serving(self) -> None:
        """Until the port answers gRPC (any status, UNAVAILABLE included). The probe is
        the read-only ExplainPlacement (UNIMPLEMENTED where a program lacks it): a
        reservation would take a one-slot worker's only slot."""

        async def answers() -> bool:
            self.assert_alive()
            try:
                await self.stub.explain_placement(
                    coordinator_v1.ExplainPlacementRequest(), timeout=10
                )
            except GRPCError:
                return True
            except OSError:
                return False
            return True

        await wait_until(answers, f"{self.program} serving", timeout=20)

    async def reserve(self, task_id: str) -> coordinator_v1.ReserveWorkerSlotResponse:
        return await self.stub.reserve_worker_slot(
            coordinator_v1.ReserveWorkerSlotRequest(task_id=task_id), timeout=10
        )

    async def status_of(self, task_id: str) -> Status:
        try:
            await self.reserve(task_id)
        except GRPCError as exc:
            return exc.status
        return Status.OK

    def metrics(self) -> str:
        return _get(f"http://{self.host}:{self.metrics_port}/metrics")

    def stop(self, timeout: float = 30) -> int:
        if self._channel is not None:
            self._channel.close()
        return super().stop(timeout)


class CallsProcess(ConsoleProcess):
    """A process with executors running the example functions, a gRPC port checked
    through grpc.health.v1 for ``service``, and a metrics endpoint."""

    service = ""

    def __init__(
        self,
        program: str,
        listen_var: str,
        env: dict[str, str],
        log: Path,
        port: int | None,
        host: str = "127.0.0.1",
        wrapper: Sequence[str] = (),
        args: Sequence[str] = (),
    ) -> None:
        self.host = host
        self.port = port or free_port()
        self.addr = f"{host}:{self.port}"
        self.metrics_port = free_port()
        super().__init__(
            program,
            {
                listen_var: self.addr,
                "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
                "IO_MEMORY_SEED_FILE": str(EXAMPLES / "memory_seed.json"),
                "EXECUTOR_COUNT": "2",
                "EXECUTOR_HEARTBEAT_INTERVAL_MS": "100",
                "BLOCKX_PROMETHEUS_LISTEN_ADDR": f"{host}:{self.metrics_port}",
                **env,
            },
            log,
            wrapper,
            args,
        )

    def metrics(self) -> str:
        return _get(f"http://{self.host}:{self.metrics_port}/metrics")

    def channel(self) -> Channel:
        """A new channel to the process (bound to the running event loop; close it)."""
        return Channel(self.host, self.port)

    async def health(self) -> int:
        channel = self.channel()
        try:
            response = await HealthStub(channel).Check(
                HealthCheckRequest(service=self.service), timeout=5
            )
        finally:
            channel.close()
        status: int = response.status
        return status

    async def wait_ready(self) -> None:
        """Until grpc.health.v1 says SERVING (executors up, code loaded)."""

        async def serving() -> bool:
            self.assert_alive()
            try:
                return await self.health() == HealthCheckResponse.SERVING
            except (TimeoutError, GRPCError, OSError):
                return False

        await wait_until(serving, f"{self.program} ready", timeout=30)


class WorkerProcess(CallsProcess):
    service = "worker.v1.WorkerService"

    def __init__(
        self,
        env: dict[str, str],
        log: Path,
        program: str = "blockx-worker",
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        wrapper: Sequence[str] = (),
        args: Sequence[str] = (),
    ) -> None:
        super().__init__(program, "WORKER_LISTEN", env, log, port, host, wrapper, args)


class SyncInvokerProcess(CallsProcess):
    service = "syncinvoker.v1.SyncInvokerService"

    def __init__(self, env: dict[str, str], log: Path, args: Sequence[str] = ()) -> None:
        super().__init__("blockx-syncinvoker", "SYNC_INVOKER_LISTEN", env, log, None, args=args)

    async def invoke(self, function: str, args: list[Any]) -> Any:
        """The result of an invoke that must succeed, decoded."""
        channel = self.channel()
        try:
            stub = syncinvoker_v1.SyncInvokerServiceStub(channel)
            reply = await stub.invoke(
                syncinvoker_v1.InvokeRequest(function=function, args=json.dumps(args)), timeout=20
            )
        finally:
            channel.close()
        assert reply.success, reply.failure_message
        return json.loads(reply.result)


@asynccontextmanager
async def serving(*workers: WorkerProcess) -> AsyncIterator[list[worker_v1.WorkerServiceStub]]:
    """Wait until each Worker serves and yield a stub for each; afterwards stop them,
    each exiting 0, and check that none logged a traceback."""
    channels: list[Channel] = []
    try:
        for worker in workers:
            await worker.wait_ready()
        channels = [Channel(worker.host, worker.port) for worker in workers]
        yield [worker_v1.WorkerServiceStub(channel) for channel in channels]
    finally:
        for channel in channels:
            channel.close()
        codes = [worker.stop() for worker in workers]
        assert codes == [0] * len(workers), codes
    for worker in workers:
        assert "Traceback" not in worker.output()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


def call_list_task(task_id: str, function: str, calls: list[list[Any]]) -> worker_v1.TaskInput:
    """A worker.v1 task: ``function`` once per argument list, outputs returned."""
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type="CallListCallConfig",
            config=json.dumps({"function": function, "callList": calls}),
        ),
        result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
    )


async def run_to_end(
    stub: worker_v1.WorkerServiceStub, task: worker_v1.TaskInput, timeout: float = 60
) -> worker_v1.TaskUpdate:
    """Submit ``task`` without a slot and watch it to its terminal update."""
    await stub.submit_task(worker_v1.SubmitTaskRequest(task=task))
    async with asyncio.timeout(timeout):
        updates = [
            u async for u in stub.watch_tasks(worker_v1.WatchTasksRequest(task_ids=[task.task_id]))
        ]
    final = updates[-1]
    assert final.is_terminal, final
    return final


def execute_result(update: worker_v1.TaskUpdate) -> worker_v1.ExecuteResult:
    """The ExecuteResult of a terminal update (which always carries one)."""
    assert update.result is not None, update
    assert update.result.execute_result is not None, update
    return update.result.execute_result
