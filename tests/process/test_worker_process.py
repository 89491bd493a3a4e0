"""The real ``blockx-worker`` process: the worker.v1 contract, end to end with the
real ``blockx-coordinator``, a real etcd, and real executors."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aetcd
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_pb2 import HealthCheckResponse
from processes import EXAMPLES, CoordinatorProcess, WorkerProcess
from support import free_port, heartbeat, wait_until

from blockx_core.heartbeat import decode_heartbeat, encode_heartbeat
from blockx_core.registry import RegistryKind
from blockx_proto import bundlecoordinator_v1, worker_v1
from blockx_server.etcd.local import EtcdServer
from blockx_server.runtime.clock import SYSTEM_CLOCK

TEST_FUNCTIONS = '''
import hashlib

def busy(ms):
    """Burn CPU for about ``ms`` milliseconds."""
    import time
    end = time.perf_counter() + ms / 1000
    n = 0
    while time.perf_counter() < end:
        n += 1
    return ms

def echo(x):
    return x
'''


@pytest.fixture(scope="module")
def functions_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("functions")
    shutil.copy(EXAMPLES / "functions" / "hello.py", d / "hello.py")
    (d / "testfns.py").write_text(TEST_FUNCTIONS)
    return d


StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def start_worker(
    etcd_server: EtcdServer, functions_dir: Path, tmp_path: Path
) -> Iterator[StartWorker]:
    started: list[WorkerProcess] = []

    def start(
        prefix: str, program: str = "blockx-worker", port: int | None = None, **env: str
    ) -> WorkerProcess:
        worker = WorkerProcess(
            {
                "ETCD_ENDPOINTS": etcd_server.endpoint,
                "WORKER_REGISTRY_PREFIX": prefix,
                "WORKER_HEARTBEAT_INTERVAL": "100",
                "FUNCTIONS_DIR": str(functions_dir),
                **env,
            },
            tmp_path / f"worker-{len(started)}.log",
            program,
            port=port,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
async def start_coordinator(
    etcd_server: EtcdServer, tmp_path: Path
) -> AsyncIterator[Callable[..., CoordinatorProcess]]:
    started: list[CoordinatorProcess] = []

    def start(prefix: str, program: str = "blockx-coordinator", **env: str) -> CoordinatorProcess:
        proc = CoordinatorProcess(
            {
                "ETCD_ENDPOINTS": etcd_server.endpoint,
                "COORDINATOR_REGISTRY_PREFIXES": prefix,
                **env,
            },
            tmp_path / f"coordinator-{len(started)}.log",
            program,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
async def channels() -> AsyncIterator[Callable[[str], worker_v1.WorkerServiceStub]]:
    opened: list[Channel] = []

    def open_stub(addr: str) -> worker_v1.WorkerServiceStub:
        host, port = addr.rsplit(":", 1)
        channel = Channel(host, int(port))
        opened.append(channel)
        return worker_v1.WorkerServiceStub(channel)

    yield open_stub
    for channel in opened:
        channel.close()


def task(
    task_id: str,
    function: str,
    call_list: list[list[Any]],
    *,
    handler: str | None = "ReturnValueResultHandler",
    timeout_ms: int = 0,
) -> worker_v1.TaskInput:
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type="CallListCallConfig",
            config=json.dumps({"function": function, "callList": call_list}),
        ),
        result_handler=worker_v1.ResultHandler(type=handler, config="{}") if handler else None,
        task_timeout_ms=timeout_ms,
    )


async def watch_all(
    stub: worker_v1.WorkerServiceStub, task_ids: list[str], timeout: float = 30
) -> list[worker_v1.TaskUpdate]:
    async with asyncio.timeout(timeout):
        return [u async for u in stub.watch_tasks(worker_v1.WatchTasksRequest(task_ids=task_ids))]


def return_values(update: worker_v1.TaskUpdate) -> Any:
    assert update.result is not None
    assert update.result.execute_result is not None
    return json.loads(update.result.execute_result.plugin_results[0].result)


async def status_of(call: Any) -> Status:
    try:
        await call
    except GRPCError as exc:
        return exc.status
    return Status.OK


def load_example_task() -> worker_v1.TaskInput:
    """examples/tasks/hello_world.json, as the specification spells it (config as an object)."""
    raw = json.loads((EXAMPLES / "tasks" / "hello_world.json").read_text())
    return worker_v1.TaskInput(
        task_id=raw.get("task_id", "example-hello-world"),  # the file leaves it to the client
        function_call_config=worker_v1.FunctionCallConfig(
            type=raw["functionCallConfig"]["type"],
            config=json.dumps(raw["functionCallConfig"]["config"]),
        ),
        result_handler=worker_v1.ResultHandler(
            type=raw["resultHandler"]["type"], config=json.dumps(raw["resultHandler"]["config"])
        ),
        task_timeout_ms=raw["taskTimeoutMs"],
    )


async def test_reserve_submit_watch_end_to_end(
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    start_coordinator: Callable[..., CoordinatorProcess],
    channels: Callable[[str], worker_v1.WorkerServiceStub],
) -> None:
    prefix = unique_lane()
    worker = start_worker(prefix)
    coordinator = start_coordinator(prefix)
    await worker.wait_ready()
    await coordinator.wait_serving()
    example = load_example_task()

    async def reserved() -> bool:
        return await coordinator.status_of(example.task_id) is Status.OK

    await wait_until(reserved, "the coordinator routing to the worker", timeout=20)
    reservation = await coordinator.reserve(example.task_id)  # idempotent: the same slot
    assert reservation.worker_addr == worker.addr
    stub = channels(reservation.worker_addr)
    submitted = await stub.submit_task(
        worker_v1.SubmitTaskRequest(task=example, slot_id=reservation.slot_id)
    )
    assert submitted.state is worker_v1.TaskState.RUNNING
    updates = await watch_all(stub, [example.task_id])
    final = updates[-1]
    assert final.is_terminal
    assert final.state is worker_v1.TaskState.SUCCEEDED
    assert final.worker_addr == worker.addr
    assert return_values(final) == ["hello, ct2", "hello, blockx"]
    assert final.result is not None
    assert final.result.execute_result is not None
    assert final.result.execute_result.plugin_results[0].plugin_name == "ReturnValueResultHandler"

    got = await stub.get_task_result(worker_v1.GetTaskResultRequest(task_id=example.task_id))
    assert got.state is worker_v1.TaskState.SUCCEEDED
    # Resubmitting the same task_id answers the retained result: never a second run.
    again = await stub.submit_task(worker_v1.SubmitTaskRequest(task=example))
    assert again.state is worker_v1.TaskState.SUCCEEDED
    assert again.result == got.result


async def test_transport_failure_switches_to_the_next_worker(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    start_coordinator: Callable[..., CoordinatorProcess],
) -> None:
    prefix = unique_lane()
    worker = start_worker(prefix)
    await worker.wait_ready()
    # A registered worker that refuses connections, ranked first (more free slots).
    dead = f"127.0.0.1:{free_port()}"
    async with aetcd.Client(etcd_server.host, etcd_server.port, timeout=5) as client:
        hb = heartbeat(dead, slots=500, at_ms=SYSTEM_CLOCK.now_ms() + 60_000)
        await client.put((prefix + dead).encode(), encode_heartbeat(hb))
    coordinator = start_coordinator(prefix)
    await coordinator.wait_serving()

    async def routed() -> bool:
        return await coordinator.status_of("t-switch") is Status.OK

    await wait_until(routed, "a reservation", timeout=20)
    assert (await coordinator.reserve("t-switch")).worker_addr == worker.addr


async def test_a_million_slots_start_and_a_lease_expires_on_its_timer(
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    channels: Callable[[str], worker_v1.WorkerServiceStub],
) -> None:
    """The slot table costs what is in use: a Worker of 1,000,000 slots starts, and the
    timer armed from the core's next deadline ends the lease (no scan of the table)."""
    worker = start_worker(unique_lane(), TASK_SLOTS="1000000")
    await worker.wait_ready()
    stub = channels(worker.addr)
    slot = await stub.request_task_slot(
        worker_v1.RequestTaskSlotRequest(task_id="t-big", ttl_ms=300)
    )
    assert slot.state is worker_v1.TaskState.ALLOCATED
    updates = await watch_all(stub, ["t-big"])
    assert (updates[-1].is_terminal, updates[-1].error) == (True, "slot_expired")
    assert worker.stop() == 0


async def test_expired_slot_is_rejected_and_its_watch_ends(
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    channels: Callable[[str], worker_v1.WorkerServiceStub],
) -> None:
    worker = start_worker(unique_lane())
    await worker.wait_ready()
    stub = channels(worker.addr)
    slot = await stub.request_task_slot(
        worker_v1.RequestTaskSlotRequest(task_id="t-exp", ttl_ms=300)
    )
    assert slot.state is worker_v1.TaskState.ALLOCATED
    assert slot.worker_addr == worker.addr
    updates = await watch_all(stub, ["t-exp"])
    assert updates[0].state is worker_v1.TaskState.ALLOCATED
    assert not updates[0].is_terminal
    assert (updates[-1].is_terminal, updates[-1].error) == (True, "slot_expired")
    with pytest.raises(GRPCError) as err:
        await stub.submit_task(
            worker_v1.SubmitTaskRequest(task=task("t-exp", "echo", [[1]]), slot_id=slot.slot_id)
        )
    assert err.value.status is Status.FAILED_PRECONDITION
    assert "does not exist" in (err.value.message or "")


async def test_a_watch_opened_on_a_reserved_task_follows_it_to_the_end(
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    channels: Callable[[str], worker_v1.WorkerServiceStub],
) -> None:
    """The client's pipelined Watch: opened before SubmitTask, it sends the ALLOCATED
    snapshot, stays open while the task runs, and ends with its terminal update."""
    worker = start_worker(unique_lane())
    await worker.wait_ready()
    stub = channels(worker.addr)
    slot = await stub.request_task_slot(
        worker_v1.RequestTaskSlotRequest(task_id="t-early", ttl_ms=30_000)
    )
    updates: list[worker_v1.TaskUpdate] = []
    first = asyncio.Event()

    async def watch() -> None:
        async for update in stub.watch_tasks(worker_v1.WatchTasksRequest(task_ids=["t-early"])):
            updates.append(update)
            first.set()

    watching = asyncio.create_task(watch())
    await asyncio.wait_for(first.wait(), 10)
    assert (updates[0].state, updates[0].is_terminal) == (worker_v1.TaskState.ALLOCATED, False)
    await stub.submit_task(
        worker_v1.SubmitTaskRequest(task=task("t-early", "echo", [[5]]), slot_id=slot.slot_id)
    )
    await asyncio.wait_for(watching, 30)
    assert [(u.state, u.is_terminal) for u in updates] == [
        (worker_v1.TaskState.ALLOCATED, False),
        (worker_v1.TaskState.SUCCEEDED, True),
    ]
    assert return_values(updates[-1]) == [5]


async def test_an_old_slot_id_is_invalid_after_a_restart(
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    channels: Callable[[str], worker_v1.WorkerServiceStub],
) -> None:
    prefix = unique_lane()
    first = start_worker(prefix)
    await first.wait_ready()
    stub = channels(first.addr)
    slot = await stub.request_task_slot(
        worker_v1.RequestTaskSlotRequest(task_id="t-restart", ttl_ms=60_000)
    )
    assert first.stop() == 0
    second = start_worker(prefix, port=first.port)
    await second.wait_ready()
    stub = channels(second.addr)
    with pytest.raises(GRPCError) as err:
        await stub.submit_task(
            worker_v1.SubmitTaskRequest(task=task("t-restart", "echo", [[1]]), slot_id=slot.slot_id)
        )
    assert err.value.status is Status.FAILED_PRECONDITION


async def test_a_full_pool_is_rejected(
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    start_coordinator: Callable[..., CoordinatorProcess],
    channels: Callable[[str], worker_v1.WorkerServiceStub],
) -> None:
    prefix = unique_lane()
    worker = start_worker(prefix, TASK_SLOTS="1")
    coordinator = start_coordinator(prefix)
    await worker.wait_ready()
    stub = channels(worker.addr)
    await stub.request_task_slot(worker_v1.RequestTaskSlotRequest(task_id="a", ttl_ms=60_000))
    assert (
        await status_of(
            stub.request_task_slot(worker_v1.RequestTaskSlotRequest(task_id="b", ttl_ms=60_000))
        )
        is Status.RESOURCE_EXHAUSTED
    )
    await coordinator.wait_serving()

    async def full() -> bool:
        return await coordinator.status_of("c") is Status.RESOURCE_EXHAUSTED

    await wait_until(full, "the coordinator to see a full pool", timeout=20)


async def test_a_task_past_its_timeout_converges_timed_out(
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    channels: Callable[[str], worker_v1.WorkerServiceStub],
) -> None:
    worker = start_worker(unique_lane(), CALL_DEADLINE_MS="20000")
    await worker.wait_ready()
    stub = channels(worker.addr)
    await stub.submit_task(
        worker_v1.SubmitTaskRequest(task=task("t-slow", "busy", [[3000]], timeout_ms=800))
    )
    final = (await watch_all(stub, ["t-slow"]))[-1]
    assert final.state is worker_v1.TaskState.FAILED
    assert final.result is not None
    assert final.result.execute_result is not None
    assert final.result.execute_result.failure_code == "TIMED_OUT"
    assert final.result.execute_result.retryable


async def test_a_lost_watch_converges_watch_disconnected(
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    channels: Callable[[str], worker_v1.WorkerServiceStub],
) -> None:
    worker = start_worker(unique_lane(), WATCH_DISCONNECT_GRACE_MS="300", CALL_DEADLINE_MS="20000")
    await worker.wait_ready()
    stub = channels(worker.addr)
    await stub.submit_task(worker_v1.SubmitTaskRequest(task=task("t-watch", "busy", [[4000]])))
    watcher = worker.channel()
    try:
        stream = worker_v1.WorkerServiceStub(watcher).watch_tasks(
            worker_v1.WatchTasksRequest(task_ids=["t-watch"])
        )
        first = await anext(aiter(stream))
        assert first.state is worker_v1.TaskState.RUNNING
    finally:
        watcher.close()  # the stream's connection is gone

    async def disconnected() -> bool:
        got = await stub.get_task_result(worker_v1.GetTaskResultRequest(task_id="t-watch"))
        return got.state is worker_v1.TaskState.FAILED

    await wait_until(disconnected, "WATCH_DISCONNECTED", timeout=10)
    got = await stub.get_task_result(worker_v1.GetTaskResultRequest(task_id="t-watch"))
    assert got.result is not None
    assert got.result.execute_result is not None
    assert got.result.execute_result.failure_code == "WATCH_DISCONNECTED"
    assert not got.result.execute_result.retryable


# Long enough that the Worker still runs the task after deregistering, on a loaded
# machine too (the drain is what the test looks at).
RUNNING_MS = 6000


async def test_sigterm_drains_running_work_and_deregisters(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    channels: Callable[[str], worker_v1.WorkerServiceStub],
) -> None:
    prefix = unique_lane()
    worker = start_worker(prefix, CALL_DEADLINE_MS="20000")
    await worker.wait_ready()
    async with aetcd.Client(etcd_server.host, etcd_server.port, timeout=5) as client:
        key = (prefix + worker.addr).encode()

        async def registered() -> bool:
            return await client.get(key) is not None

        await wait_until(registered, "the worker's heartbeat in etcd")
        got = await client.get(key)
        assert decode_heartbeat(got.value).worker_addr == worker.addr
        stub = channels(worker.addr)
        await stub.submit_task(
            worker_v1.SubmitTaskRequest(task=task("t-drain", "busy", [[RUNNING_MS]]))
        )
        watching = asyncio.Event()

        async def watch_to_the_end() -> list[worker_v1.TaskUpdate]:
            updates = []
            async with asyncio.timeout(30):
                request = worker_v1.WatchTasksRequest(task_ids=["t-drain"])
                async for update in stub.watch_tasks(request):
                    updates.append(update)
                    watching.set()
            return updates

        watch = asyncio.create_task(watch_to_the_end())
        async with asyncio.timeout(10):
            await watching.wait()  # the watch is open and has the running task's state
        worker.proc.send_signal(signal.SIGTERM)

        async def deregistered() -> bool:
            return await client.get(key) is None

        await wait_until(deregistered, "the lease revoked", timeout=5)
        assert worker.alive()  # still finishing its task
        assert (
            await status_of(
                stub.request_task_slot(worker_v1.RequestTaskSlotRequest(task_id="new", ttl_ms=5000))
            )
            is Status.UNAVAILABLE
        )
        final = (await watch)[-1]
        assert final.state is worker_v1.TaskState.SUCCEEDED
        assert return_values(final) == [RUNNING_MS]
    assert worker.stop() == 0


async def test_result_retention_then_the_task_id_is_free_again(
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    channels: Callable[[str], worker_v1.WorkerServiceStub],
) -> None:
    worker = start_worker(unique_lane(), RESULT_RETENTION_MS="600")
    await worker.wait_ready()
    stub = channels(worker.addr)
    await stub.submit_task(worker_v1.SubmitTaskRequest(task=task("t-ret", "echo", [[7]])))
    assert (await watch_all(stub, ["t-ret"]))[-1].state is worker_v1.TaskState.SUCCEEDED

    async def expired() -> bool:
        return (
            await status_of(stub.get_task_result(worker_v1.GetTaskResultRequest(task_id="t-ret")))
            is Status.NOT_FOUND
        )

    await wait_until(expired, "the result to expire", timeout=10)
    slot = await stub.request_task_slot(
        worker_v1.RequestTaskSlotRequest(task_id="t-ret", ttl_ms=5000)
    )
    assert slot.state is worker_v1.TaskState.ALLOCATED


async def test_bundle_worker_and_bundle_coordinator(
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    start_coordinator: Callable[..., CoordinatorProcess],
) -> None:
    prefix = unique_lane(RegistryKind.BUNDLE)
    worker = start_worker(prefix, program="blockx-bundle-worker")
    coordinator = start_coordinator(prefix, program="blockx-bundle-coordinator")
    await worker.wait_ready()
    stub = bundlecoordinator_v1.BundleCoordinatorServiceStub(coordinator.channel)

    async def routed() -> bool:
        try:
            r = await stub.reserve_worker_slot(
                bundlecoordinator_v1.ReserveWorkerSlotRequest(task_id="b1"), timeout=5
            )
        except (GRPCError, OSError):
            return False
        return r.worker_addr == worker.addr

    await wait_until(routed, "the bundle coordinator routing to the bundle worker", timeout=20)


async def test_health_reports_serving(
    start_worker: StartWorker, unique_lane: Callable[..., str]
) -> None:
    worker = start_worker(unique_lane())
    await worker.wait_ready()
    assert await worker.health() == HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TASK_SLOTS", "0"),
        ("WORKER_REGISTRY_PREFIX", "/blockx/bundle-workers/"),
        ("FUNCTIONS_DIR", "/nonexistent"),
        ("TASK_DEADLINE_MS", "99999999999"),
        ("WORKER_LISTEN", "nope"),
    ],
)
def test_bad_configuration_is_one_line_and_nonzero(variable: str, value: str) -> None:
    binary = shutil.which("blockx-worker")
    assert binary is not None
    env = {**os.environ, "FUNCTIONS_DIR": str(EXAMPLES / "functions"), variable: value}
    result = subprocess.run([binary], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert variable in lines[0]
    assert "Traceback" not in result.stderr


def test_a_bad_memory_seed_is_one_line_and_exit_2(tmp_path: Path) -> None:
    seed = tmp_path / "seed.json"
    seed.write_text("{not json")
    binary = shutil.which("blockx-worker")
    assert binary is not None
    env = {
        **os.environ,
        "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
        "IO_MEMORY_SEED_FILE": str(seed),
        "WORKER_LISTEN": f"127.0.0.1:{free_port()}",
        "BLOCKX_LOG_LEVEL": "ERROR",
    }
    result = subprocess.run([binary], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"blockx-worker: cannot start: IO_MEMORY_SEED_FILE: cannot read memory seed {seed}: "
    ), lines


def test_a_port_in_use_is_one_line_and_nonzero() -> None:
    binary = shutil.which("blockx-worker")
    assert binary is not None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            **os.environ,
            "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
            "WORKER_LISTEN": f"127.0.0.1:{port}",
            "EXECUTOR_COUNT": "1",
        }
        result = subprocess.run([binary], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("blockx-worker: cannot serve on 127.0.0.1:")


async def test_sigterm_stops_and_writes_the_event_loops_cpu_profile(
    unique_lane: Callable[..., str],
    start_worker: StartWorker,
    channels: Callable[[str], worker_v1.WorkerServiceStub],
    tmp_path: Path,
) -> None:
    import pstats

    profile = tmp_path / "worker.prof"
    worker = start_worker(unique_lane(), WORKER_CPU_PROFILE=str(profile))
    await worker.wait_ready()
    stub = channels(worker.addr)
    await stub.submit_task(worker_v1.SubmitTaskRequest(task=task("t-prof", "echo", [[7]])))
    assert (await watch_all(stub, ["t-prof"]))[-1].state is worker_v1.TaskState.SUCCEEDED
    assert worker.stop() == 0
    assert "Traceback" not in worker.log.read_text()
    stats = pstats.Stats(str(profile))
    # The loop's thread ran the task's phases.
    assert any("orchestrator" in path for path, _, _ in stats.stats)  # type: ignore[attr-defined]
