"""The client learns every task's outcome across kill -9: of the coordinator under
load (placement backs off and recovers), and of a Worker in the middle of running
tasks (WORKER_LOST, retryable, may_have_run), with real processes and etcd."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from processes import EXAMPLES, CoordinatorProcess, WorkerProcess
from support import free_port, wait_until

from blockx_client import (
    Client,
    ClientFailureCode,
    RetryPolicy,
    Task,
    TaskNotFoundError,
    TaskResult,
    TaskState,
)
from blockx_server.etcd.local import EtcdServer

NAP = """
def nap(ms):
    import time
    time.sleep(ms / 1000)
    return ms
"""


class Stack:
    """etcd (the session's), one coordinator and one worker; both restartable on
    their own port, so a client keeps the same addresses across a kill -9."""

    def __init__(self, etcd: EtcdServer, root: Path, prefix: str) -> None:
        self.etcd = etcd
        self.root = root
        self.prefix = prefix
        self.functions = root / "functions"
        self.functions.mkdir()
        shutil.copy(EXAMPLES / "functions" / "hello.py", self.functions / "hello.py")
        (self.functions / "nap.py").write_text(NAP)
        self.coordinator_port = free_port()
        self.worker_port = free_port()
        self.started: list[CoordinatorProcess | WorkerProcess] = []
        self.coordinator = self.start_coordinator()
        self.worker = self.start_worker()

    @property
    def coordinator_addr(self) -> str:
        return f"127.0.0.1:{self.coordinator_port}"

    @property
    def worker_addr(self) -> str:
        return f"127.0.0.1:{self.worker_port}"

    def start_coordinator(self) -> CoordinatorProcess:
        proc = CoordinatorProcess(
            {
                "ETCD_ENDPOINTS": self.etcd.endpoint,
                "COORDINATOR_REGISTRY_PREFIXES": self.prefix,
                "COORDINATOR_LISTEN": self.coordinator_addr,
            },
            self.root / f"coordinator-{len(self.started)}.log",
        )
        proc.port = self.coordinator_port
        self.started.append(proc)
        return proc

    def start_worker(self) -> WorkerProcess:
        proc = WorkerProcess(
            {
                "ETCD_ENDPOINTS": self.etcd.endpoint,
                "WORKER_REGISTRY_PREFIX": self.prefix,
                "WORKER_HEARTBEAT_INTERVAL": "100",
                "FUNCTIONS_DIR": str(self.functions),
                "TASK_SLOTS": "16",
                "CALL_DEADLINE_MS": "60000",
            },
            self.root / f"worker-{len(self.started)}.log",
            port=self.worker_port,
        )
        self.started.append(proc)
        return proc

    async def ready(self) -> None:
        await self.worker.wait_ready()
        await self.coordinator.wait_serving()

        def sees_the_worker() -> bool:
            try:
                metrics = self.coordinator.metrics()
            except OSError:
                return False
            return 'blockx_coordinator_registry_workers{format="v2"} 1.0' in metrics

        await wait_until(sees_the_worker, "the coordinator's view", timeout=30)

    def stop(self) -> None:
        for proc in self.started:
            if proc.alive():
                proc.stop()


@pytest.fixture
async def stack(
    etcd_server: EtcdServer, tmp_path: Path, unique_lane: Callable[..., str]
) -> AsyncIterator[Stack]:
    # Async so that it stops the processes (and closes their channels) in the
    # test's event loop.
    s = Stack(etcd_server, tmp_path, unique_lane())
    yield s
    s.stop()


async def running(client: Client, task_ids: list[str], worker_addr: str) -> None:
    """Until the worker runs every one of ``task_ids``."""

    async def all_running() -> bool:
        for task_id in task_ids:
            try:
                got = await client.get_task_result(task_id, worker_addr=worker_addr)
            except TaskNotFoundError:
                return False
            if got.state is not TaskState.RUNNING:
                return False
        return True

    await wait_until(all_running, f"{len(task_ids)} tasks running", timeout=30)


async def test_coordinator_kill_9_under_load_every_task_gets_an_outcome(stack: Stack) -> None:
    await stack.ready()
    tasks = [Task.call_list("nap", [[100]], task_id=f"load-{i}") for i in range(150)]
    results: list[TaskResult] = []
    done_at_kill: list[int] = []

    async def kill_and_restart() -> None:
        await wait_until(lambda: len(results) >= 16, "the first results", timeout=60)
        stack.coordinator.kill()  # SIGKILL
        done_at_kill.append(len(results))
        await asyncio.sleep(2.5)
        stack.coordinator = stack.start_coordinator()

    async with Client(coordinator=stack.coordinator_addr) as client:
        chaos = asyncio.create_task(kill_and_restart())
        async for result in client.run_many(tasks, concurrency=16):
            results.append(result)
        await chaos
    assert done_at_kill[0] < len(tasks)  # the kill came while most were unplaced
    assert sorted(r.task_id for r in results) == sorted(t.task_id for t in tasks)
    # Placement rode out the outage: every task ran, none was lost to it.
    failed = [(r.task_id, r.failure_code, r.failure_message) for r in results if not r.ok]
    assert failed == []
    assert all(r.outputs() == [100] for r in results)
    stack.coordinator.assert_alive()


async def test_worker_kill_9_mid_run_every_task_is_worker_lost(stack: Stack) -> None:
    await stack.ready()
    naps = [Task.call_list("nap", [[30_000]], task_id=f"nap-{i}") for i in range(6)]
    policy = RetryPolicy(worker_unreachable_s=1.0)
    async with Client(coordinator=stack.coordinator_addr, retry=policy) as client:
        outcomes = asyncio.create_task(collect(client, naps))
        await running(client, [t.task_id for t in naps], stack.worker_addr)
        stack.worker.kill()  # SIGKILL, and nothing comes back on its address
        results = await outcomes
    assert sorted(r.task_id for r in results) == sorted(t.task_id for t in naps)
    for r in results:
        assert r.state is TaskState.FAILED
        assert (r.failure_code, r.retryable, r.may_have_run) == (
            ClientFailureCode.WORKER_LOST,
            True,
            True,
        )
        assert r.worker_addr == stack.worker_addr
        assert "unreachable for" in r.failure_message


async def test_a_worker_restarted_on_its_address_has_forgotten_its_tasks(stack: Stack) -> None:
    await stack.ready()
    naps = [Task.call_list("nap", [[30_000]], task_id=f"forgot-{i}") for i in range(6)]
    # Long enough for the worker to come back: its answer, not silence, decides.
    policy = RetryPolicy(worker_unreachable_s=60.0)
    async with Client(coordinator=stack.coordinator_addr, retry=policy) as client:
        outcomes = asyncio.create_task(collect(client, naps))
        await running(client, [t.task_id for t in naps], stack.worker_addr)
        stack.worker.kill()
        stack.worker = stack.start_worker()
        results = await outcomes
        # The restarted worker runs new tasks; the lost ones are retried under new ids.
        again = await client.run_with_retries(
            Task.call_list("hello_world", [["back"]], task_id="after-restart")
        )
    assert sorted(r.task_id for r in results) == sorted(t.task_id for t in naps)
    for r in results:
        assert (r.failure_code, r.retryable, r.may_have_run) == (
            ClientFailureCode.WORKER_LOST,
            True,
            True,
        )
        assert "no longer knows the task" in r.failure_message
    assert again[-1].outputs() == ["hello, back"]


async def collect(client: Client, tasks: list[Task]) -> list[TaskResult]:
    return [r async for r in client.run_many(tasks, concurrency=len(tasks))]
