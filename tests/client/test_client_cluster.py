"""The client against a real coordinator, worker and etcd (and scripted coordinators
where the test is about how the client reacts to a status)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server
from processes import EXAMPLES, CoordinatorProcess, WorkerProcess
from support import free_port, wait_until

from blockx_client import (
    Client,
    ClientFailureCode,
    ConnectError,
    FailureCode,
    NoSlotError,
    PluginConfig,
    RetryPolicy,
    SyncClient,
    Task,
    TaskNotFoundError,
    TaskState,
    UnavailableError,
)
from blockx_client._watch import WatchBatcher
from blockx_proto import coordinator_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
def busy(ms):
    import time
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass
    return ms
"""


class Cluster:
    def __init__(self, coordinator: CoordinatorProcess, worker: WorkerProcess) -> None:
        self.coordinator = coordinator
        self.worker = worker

    def client(self, **kwargs: Any) -> Client:
        return Client(coordinator=f"127.0.0.1:{self.coordinator.port}", **kwargs)


def _start(etcd: EtcdServer, root: Path, lane: str, **worker_env: str) -> Cluster:
    (root / "functions").mkdir()
    shutil.copy(EXAMPLES / "functions" / "hello.py", root / "functions" / "hello.py")
    (root / "functions" / "busy.py").write_text(FUNCTIONS)
    prefix = f"/blockx/test/lanes/{lane}/workers/"
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd.endpoint,
            "WORKER_REGISTRY_PREFIX": prefix,
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(root / "functions"),
            "CALL_DEADLINE_MS": "20000",
            **worker_env,
        },
        root / "worker.log",
    )
    coordinator = CoordinatorProcess(
        {"ETCD_ENDPOINTS": etcd.endpoint, "COORDINATOR_REGISTRY_PREFIXES": prefix},
        root / "coordinator.log",
    )
    asyncio.run(worker.wait_ready())
    asyncio.run(
        wait_until(lambda: _sees_one_worker(coordinator), "the coordinator's view", timeout=30)
    )
    return Cluster(coordinator, worker)


def _sees_one_worker(coordinator: CoordinatorProcess) -> bool:
    """The coordinator's registry gauge counts the worker (its view is built)."""
    try:
        return 'blockx_coordinator_registry_workers{format="v2"} 1.0' in coordinator.metrics()
    except OSError:
        return False


def _stop(cluster: Cluster) -> None:
    cluster.worker.stop()
    cluster.coordinator.stop()


@pytest.fixture(scope="module")
def cluster(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = _start(etcd_server, tmp_path_factory.mktemp("client"), "client")
    yield c
    _stop(c)


@pytest.fixture(scope="module")
def one_slot(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    c = _start(etcd_server, tmp_path_factory.mktemp("oneslot"), "oneslot", TASK_SLOTS="1")
    yield c
    _stop(c)


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Client]:
    async with cluster.client() as c:
        yield c


HELLO = Task.call_list("hello_world", [["ct2"], ["blockx"]])


async def test_run_end_to_end(client: Client, cluster: Cluster) -> None:
    result = await client.run(HELLO)
    assert result.ok
    assert result.state is TaskState.SUCCEEDED
    assert result.worker_addr == cluster.worker.addr
    assert result.outputs() == ["hello, ct2", "hello, blockx"]
    assert result.task_id  # generated
    assert result.plugin_results[0].plugin_name == "ReturnValueResultHandler"


async def test_a_lone_task_opens_its_watch_without_the_linger(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With no Watch stream open to the worker there is nothing to batch with: the
    # stream opens at once, so a linger of an hour does not hold the result back.
    monkeypatch.setattr(WatchBatcher, "LINGER_S", 3600.0)
    async with asyncio.timeout(30):
        for i in range(3):
            result = await client.run(Task.call_list("hello_world", [[f"lone{i}"]]))
            assert result.outputs() == [f"hello, lone{i}"]


async def test_run_is_idempotent_by_task_id(client: Client) -> None:
    task = Task.call_list("hello_world", [["again"]], task_id="client-idem-1")
    first = await client.run(task)
    second = await client.run(task)
    assert first.outputs() == second.outputs() == ["hello, again"]


async def test_run_straight_to_a_worker(client: Client, cluster: Cluster) -> None:
    result = await client.run(HELLO, worker_addr=cluster.worker.addr)
    assert result.outputs() == ["hello, ct2", "hello, blockx"]


async def test_direct_worker_calls(client: Client, cluster: Cluster) -> None:
    addr = cluster.worker.addr
    slot = await client.request_task_slot(addr, "client-direct", ttl_ms=10_000)
    assert slot.worker_addr == addr
    task = Task.call_list("hello_world", [["x"]], task_id="client-direct")
    answer = await client.submit_task(task, worker_addr=addr, slot_id=slot.slot_id)
    assert answer.state is TaskState.RUNNING
    updates = [u async for u in client.watch_tasks(["client-direct"], worker_addr=addr)]
    assert updates[-1].is_terminal
    assert updates[-1].result is not None
    assert updates[-1].result.outputs() == ["hello, x"]
    got = await client.get_task_result("client-direct", worker_addr=addr)
    assert got.state is TaskState.SUCCEEDED
    with pytest.raises(TaskNotFoundError):
        await client.get_task_result("never-submitted", worker_addr=addr)


async def test_failures_are_results_with_the_retryable_flag(client: Client) -> None:
    result = await client.run(Task.call_list("no_such_function", [[1]]))
    assert result.state is TaskState.FAILED
    assert (result.failure_code, result.retryable) == ("CALL_FAILED", False)
    assert "FUNCTION_NOT_FOUND" in result.failure_message


async def test_run_many(client: Client) -> None:
    tasks = [Task.call_list("hello_world", [[f"n{i}"]], task_id=f"many-{i}") for i in range(30)]
    results = [r async for r in client.run_many(tasks, concurrency=8)]
    assert sorted(r.task_id for r in results) == sorted(t.task_id for t in tasks)
    assert all(r.ok for r in results)
    by_id = {r.task_id: r.outputs() for r in results}
    assert by_id["many-7"] == ["hello, n7"]


async def test_run_many_yields_every_outcome_with_an_invalid_task_among_them(
    client: Client,
) -> None:
    bad = Task(
        function_call_config=PluginConfig(type="CallListCallConfig", config="{not json"),
        task_id="many-bad",
    )
    good = [Task.call_list("hello_world", [[f"g{i}"]], task_id=f"many-good-{i}") for i in range(8)]
    results = {r.task_id: r async for r in client.run_many([*good[:4], bad, *good[4:]])}
    assert sorted(results) == sorted(["many-bad", *(t.task_id for t in good)])
    assert all(results[t.task_id].ok for t in good)
    failed = results["many-bad"]
    assert failed.state is TaskState.FAILED
    assert (failed.failure_code, failed.retryable, failed.may_have_run) == (
        ClientFailureCode.INVALID_ARGUMENT,
        False,
        False,
    )
    assert "INVALID_ARGUMENT" in failed.failure_message


async def test_run_with_retries_records_lineage(client: Client) -> None:
    task = Task.call_list("busy", [[3000]], task_timeout_ms=300, task_id="client-timeout")
    attempts = await client.run_with_retries(task, max_attempts=2)
    assert [a.failure_code for a in attempts] == ["TIMED_OUT", "TIMED_OUT"]
    assert all(a.retryable for a in attempts)
    assert [a.task_id for a in attempts] == ["client-timeout", "client-timeout.retry-2"]
    assert [(a.attempt, a.original_task_id) for a in attempts] == [
        (1, "client-timeout"),
        (2, "client-timeout"),
    ]


async def test_backs_off_while_the_pool_is_full_until_a_slot_frees(one_slot: Cluster) -> None:
    async with one_slot.client() as client:
        first = asyncio.create_task(client.run(Task.call_list("busy", [[1500]], task_id="busy-1")))
        await running(client, "busy-1", one_slot.worker.addr)  # the only slot is taken
        second = await client.run(Task.call_list("hello_world", [["later"]]))
        assert second.outputs() == ["hello, later"]
        # The second could only be placed once the first had converged and freed the slot.
        assert first.done()
        assert (await first).ok


async def running(client: Client, task_id: str, worker_addr: str) -> None:
    async def is_running() -> bool:
        try:
            got = await client.get_task_result(task_id, worker_addr=worker_addr)
        except TaskNotFoundError:
            return False
        return got.state is TaskState.RUNNING

    await wait_until(is_running, f"{task_id} running", timeout=20)


async def test_no_slot_within_the_deadline(one_slot: Cluster) -> None:
    async with one_slot.client() as client:
        first = asyncio.create_task(client.run(Task.call_list("busy", [[1500]], task_id="busy-2")))
        await running(client, "busy-2", one_slot.worker.addr)
        with pytest.raises(NoSlotError, match="deadline"):
            await client.run(Task.call_list("hello_world", [["x"]]), deadline_s=0.4)
        await first


class ScriptedCoordinator(coordinator_v1.CoordinatorServiceBase):
    """Answers ReserveWorkerSlot from a script of statuses (then a reservation)."""

    def __init__(self, script: list[Status], reservation: tuple[str, str] = ("w:1", "s1")) -> None:
        self.script = list(script)
        self.reservation = reservation
        self.seen: list[tuple[str, float]] = []

    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        self.seen.append((message.task_id, time.monotonic()))
        if self.script:
            raise GRPCError(self.script.pop(0), "scripted")
        addr, slot = self.reservation
        return coordinator_v1.ReserveWorkerSlotResponse(
            task_id=message.task_id, worker_addr=addr, slot_id=slot
        )


async def serve(service: Any) -> tuple[Server, str]:
    server = Server([service])
    port = free_port()
    await server.start("127.0.0.1", port)
    return server, f"127.0.0.1:{port}"


async def test_aborted_waits_one_slot_ttl_and_keeps_the_task_id() -> None:
    fake = ScriptedCoordinator([Status.ABORTED])
    server, addr = await serve(fake)
    try:
        async with Client(coordinator=addr, retry=RetryPolicy(slot_ttl_s=0.4)) as client:
            reservation = await client.reserve_worker_slot("t-aborted")
        assert reservation.slot_id == "s1"
        assert [t for t, _ in fake.seen] == ["t-aborted", "t-aborted"]
        assert fake.seen[1][1] - fake.seen[0][1] >= 0.4
    finally:
        server.close()


async def test_unavailable_is_retried_a_bounded_number_of_times() -> None:
    fake = ScriptedCoordinator([Status.UNAVAILABLE] * 100)
    server, addr = await serve(fake)
    try:
        policy = RetryPolicy(unavailable_attempts=4)
        async with Client(coordinator=addr, retry=policy) as client:
            with pytest.raises(UnavailableError):
                await client.reserve_worker_slot("t-unavailable")
        assert len(fake.seen) == 4
    finally:
        server.close()


async def test_resource_exhausted_backs_off_then_succeeds() -> None:
    fake = ScriptedCoordinator([Status.RESOURCE_EXHAUSTED] * 3)
    server, addr = await serve(fake)
    try:
        async with Client(coordinator=addr) as client:
            reservation = await client.reserve_worker_slot("t-busy")
        assert reservation.worker_addr == "w:1"
        assert {t for t, _ in fake.seen} == {"t-busy"}
        assert len(fake.seen) == 4
    finally:
        server.close()


class StaleSlotCoordinator(coordinator_v1.CoordinatorServiceBase):
    """First hands out a slot the worker does not know, then reserves for real."""

    def __init__(self, worker_addr: str) -> None:
        self.worker_addr = worker_addr
        self.seen: list[str] = []

    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        self.seen.append(message.task_id)
        if len(self.seen) == 1:
            slot = "stale-slot"
        else:
            async with Client() as direct:
                slot = (await direct.request_task_slot(self.worker_addr, message.task_id)).slot_id
        return coordinator_v1.ReserveWorkerSlotResponse(
            task_id=message.task_id, worker_addr=self.worker_addr, slot_id=slot
        )


async def test_failed_precondition_on_submit_reserves_again(cluster: Cluster) -> None:
    fake = StaleSlotCoordinator(cluster.worker.addr)
    server, addr = await serve(fake)
    try:
        async with Client(coordinator=addr) as client:
            result = await client.run(Task.call_list("hello_world", [["y"]], task_id="t-stale"))
        assert result.outputs() == ["hello, y"]
        assert fake.seen == ["t-stale", "t-stale"]
    finally:
        server.close()


async def test_an_unreachable_coordinator_is_a_connect_error() -> None:
    policy = RetryPolicy(unreachable_s=0.5)
    async with Client(coordinator=f"127.0.0.1:{free_port()}", retry=policy) as client:
        with pytest.raises(ConnectError, match="cannot reach"):
            await client.reserve_worker_slot("t")


def test_sync_client(cluster: Cluster) -> None:
    with SyncClient(coordinator=f"127.0.0.1:{cluster.coordinator.port}") as client:
        result = client.run(HELLO)
        assert result.outputs() == ["hello, ct2", "hello, blockx"]
        updates = list(client.watch_tasks([result.task_id], worker_addr=result.worker_addr))
        assert updates[-1].state is TaskState.SUCCEEDED
        results = client.run_many(
            [Task.call_list("hello_world", [[i]]) for i in range(5)], concurrency=2
        )
        assert sorted(r.outputs()[0] for r in results) == [f"hello, {i}" for i in range(5)]


def test_a_sync_client_cancels_what_another_thread_waits_for(cluster: Cluster) -> None:
    with SyncClient(coordinator=f"127.0.0.1:{cluster.coordinator.port}") as client:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client.run, Task.call_list("busy", [[15_000]], task_id="sync-c"))

            async def placed() -> bool:
                return "sync-c" in client.in_flight()

            asyncio.run(wait_until(placed, "the task placed", timeout=20))
            cancelled = client.cancel_in_flight()
            assert [c.task_id for c in cancelled] == ["sync-c"]
            result = waiting.result(timeout=20)
        assert (result.state, result.failure_code, result.retryable) == (
            TaskState.FAILED,
            FailureCode.CANCELLED,
            False,
        )
        assert client.in_flight() == {}
