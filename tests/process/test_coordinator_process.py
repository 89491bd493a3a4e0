"""The real ``blockx-coordinator`` / ``blockx-bundle-coordinator`` processes, against
a real etcd, with fake Worker gRPC servers written here (the test is about the
Coordinator, so the Workers are scripted peers)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aetcd
import grpc
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server
from processes import CoordinatorProcess
from support import free_port, heartbeat, wait_until

from blockx_core.heartbeat import encode_heartbeat
from blockx_core.registry import RegistryKind
from blockx_proto import bundlecoordinator_v1, coordinator_v1, worker_v1
from blockx_server.etcd.local import EtcdServer
from blockx_server.runtime.clock import SYSTEM_CLOCK

EtcdFactory = Callable[..., Awaitable[EtcdServer]]


class FakeWorker(worker_v1.WorkerServiceBase):
    """A worker that grants, rejects with a status, or hangs."""

    def __init__(self, mode: str | Status = "grant") -> None:
        self.mode = mode
        self.requests: list[str] = []

    async def request_task_slot(
        self, message: worker_v1.RequestTaskSlotRequest
    ) -> worker_v1.TaskSnapshot:
        self.requests.append(message.task_id)
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if isinstance(self.mode, Status):
            raise GRPCError(self.mode, "scripted rejection")
        return worker_v1.TaskSnapshot(
            task_id=message.task_id,
            slot_id=f"slot-{len(self.requests)}",
            state=worker_v1.TaskState.ALLOCATED,
        )


class Workers:
    """Fake workers on real ports, and their heartbeats in etcd."""

    def __init__(self) -> None:
        self.servers: list[Server] = []

    async def start(self, worker: FakeWorker) -> str:
        server = Server([worker])
        port = free_port()
        await server.start("127.0.0.1", port)
        self.servers.append(server)
        return f"127.0.0.1:{port}"

    async def close(self) -> None:
        for server in self.servers:
            server.close()
            await server.wait_closed()


@pytest.fixture
async def workers() -> AsyncIterator[Workers]:
    w = Workers()
    yield w
    await w.close()


async def publish(etcd: EtcdServer, prefix: str, addr: str, *, slots: int = 10) -> None:
    """Write a fresh heartbeat, as a Worker's EtcdPublisher would."""
    client = aetcd.Client(etcd.host, etcd.port, timeout=5)
    try:
        hb = heartbeat(addr, slots=slots, at_ms=SYSTEM_CLOCK.now_ms())
        await client.put((prefix + addr).encode(), encode_heartbeat(hb))
    finally:
        await client.close()


@pytest.fixture
async def start_coordinator(
    tmp_path: Path,
) -> AsyncIterator[Callable[..., Awaitable[CoordinatorProcess]]]:
    started: list[CoordinatorProcess] = []

    async def start(
        etcd_endpoint: str,
        prefix: str,
        *,
        program: str = "blockx-coordinator",
        wait: bool = True,
        **env: str,
    ) -> CoordinatorProcess:
        proc = CoordinatorProcess(
            {"ETCD_ENDPOINTS": etcd_endpoint, "COORDINATOR_REGISTRY_PREFIXES": prefix, **env},
            tmp_path / f"coordinator-{len(started)}.log",
            program,
        )
        started.append(proc)
        if wait:
            await proc.wait_serving()
        return proc

    yield start
    for proc in started:
        proc.stop()


StartCoordinator = Callable[..., Awaitable[CoordinatorProcess]]


async def until_status(
    coordinator: CoordinatorProcess, status: Status, within: float = 20, *, message: str = ""
) -> None:
    """Reserve "probe" until the answer has ``status`` (and a message starting with ``message``)."""

    async def reached() -> bool:
        try:
            await coordinator.reserve("probe")
        except GRPCError as exc:
            return exc.status is status and (exc.message or "").startswith(message)
        return status is Status.OK

    await wait_until(reached, timeout=within, interval=0.05)


async def test_routes_to_a_granting_worker_and_reports_metrics(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    workers: Workers,
    start_coordinator: StartCoordinator,
) -> None:
    prefix = unique_lane()
    worker = FakeWorker()
    addr = await workers.start(worker)
    await publish(etcd_server, prefix, addr)
    coordinator = await start_coordinator(etcd_server.endpoint, prefix)

    await until_status(coordinator, Status.OK)
    response = await coordinator.reserve("task-1")
    assert response.task_id == "task-1"
    assert response.worker_addr == addr
    assert response.slot_id.startswith("slot-")
    assert "task-1" in worker.requests

    metrics = coordinator.metrics()
    assert 'blockx_coordinator_registry_workers{format="v2"} 1.0' in metrics
    assert 'blockx_coordinator_registry_workers{format="legacy"} 0.0' in metrics
    assert 'blockx_coordinator_reserve_total{outcome="reserved"}' in metrics


async def test_error_mapping_end_to_end(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    workers: Workers,
    start_coordinator: StartCoordinator,
) -> None:
    """Each worker behaviour reaches the client as the specified gRPC status."""
    prefix = unique_lane()
    coordinator = await start_coordinator(
        etcd_server.endpoint, prefix, COORDINATOR_MAX_TIMEOUT_RETRIES="1"
    )
    # Initialized view with no worker at all: UNAVAILABLE.
    await until_status(coordinator, Status.UNAVAILABLE)

    with pytest.raises(GRPCError) as err:
        await coordinator.reserve("")
    assert err.value.status is Status.INVALID_ARGUMENT
    assert "task_id" in (err.value.message or "")

    # A live worker without free capacity: NoExecutableSlot, no worker contacted.
    full = FakeWorker()
    full_addr = await workers.start(full)
    await publish(etcd_server, prefix, full_addr, slots=0)
    await until_status(coordinator, Status.RESOURCE_EXHAUSTED)
    assert full.requests == []

    # A worker that always says NoSlot: the one candidate rejected -> RESOURCE_EXHAUSTED.
    busy = FakeWorker(Status.RESOURCE_EXHAUSTED)
    busy_addr = await workers.start(busy)
    await publish(etcd_server, prefix, busy_addr, slots=5)
    await until_status(coordinator, Status.RESOURCE_EXHAUSTED, message="all candidates rejected")
    assert "probe" in busy.requests

    # A hanging worker ranked first: ABORTED after 1 + 1 attempts on it alone.
    hang = FakeWorker("hang")
    hang_addr = await workers.start(hang)
    await publish(etcd_server, prefix, hang_addr, slots=9)
    await until_status(coordinator, Status.ABORTED)
    before = len(hang.requests)
    started = time.monotonic()
    with pytest.raises(GRPCError) as err:
        await coordinator.reserve("t-hang")
    assert err.value.status is Status.ABORTED
    assert (err.value.message or "").startswith("unable to confirm slot reservation")
    assert hang.requests[before:] == ["t-hang", "t-hang"]
    assert "t-hang" not in busy.requests  # never switched after an uncertain outcome
    assert time.monotonic() - started >= 0.9  # two 500 ms worker RPC timeouts

    # A refusing address ranked first, then a granting worker: switches and succeeds.
    refused_addr = f"127.0.0.1:{free_port()}"
    await publish(etcd_server, prefix, refused_addr, slots=20)
    good = FakeWorker()
    good_addr = await workers.start(good)
    await publish(etcd_server, prefix, good_addr, slots=15)
    await until_status(coordinator, Status.OK)
    response = await coordinator.reserve("t-good")
    assert response.worker_addr == good_addr
    assert "t-good" in good.requests


def coordinator_routes_somewhere(
    coordinator: CoordinatorProcess, worker: FakeWorker
) -> Callable[[], Awaitable[bool]]:
    """A condition: a short reserve reached ``worker`` (its answer does not matter)."""

    async def reached() -> bool:
        stub = coordinator_v1.CoordinatorServiceStub(coordinator.channel)
        with contextlib.suppress(GRPCError, TimeoutError):
            await stub.reserve_worker_slot(
                coordinator_v1.ReserveWorkerSlotRequest(task_id="probe"), timeout=0.3
            )
        return bool(worker.requests)

    return reached


async def test_caller_deadline_is_honoured(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    workers: Workers,
    start_coordinator: StartCoordinator,
) -> None:
    prefix = unique_lane()
    hang = FakeWorker("hang")
    await publish(etcd_server, prefix, await workers.start(hang))
    coordinator = await start_coordinator(
        etcd_server.endpoint, prefix, COORDINATOR_WORKER_RPC_TIMEOUT_MS="10000"
    )
    await wait_until(coordinator_routes_somewhere(coordinator, hang), timeout=20)
    stub = coordinator_v1.CoordinatorServiceStub(coordinator.channel)
    started = time.monotonic()
    with pytest.raises((GRPCError, asyncio.TimeoutError)):
        await stub.reserve_worker_slot(
            coordinator_v1.ReserveWorkerSlotRequest(task_id="t"), timeout=0.5
        )
    assert time.monotonic() - started < 5


async def test_etcd_started_after_the_coordinator(
    etcd_factory: EtcdFactory,
    unique_lane: Callable[..., str],
    workers: Workers,
    start_coordinator: StartCoordinator,
) -> None:
    etcd = EtcdServer(port=free_port())
    prefix = unique_lane()
    coordinator = await start_coordinator(etcd.endpoint, prefix)
    assert await coordinator.status_of("t") is Status.UNAVAILABLE
    try:
        await etcd.start()
        await publish(etcd, prefix, await workers.start(FakeWorker()))
        await until_status(coordinator, Status.OK)
    finally:
        await etcd.close()


async def test_etcd_outage_grace_then_unavailable_then_recovery(
    etcd_factory: EtcdFactory,
    unique_lane: Callable[..., str],
    workers: Workers,
    start_coordinator: StartCoordinator,
) -> None:
    etcd = await etcd_factory()
    prefix = unique_lane()
    addr = await workers.start(FakeWorker())
    await publish(etcd, prefix, addr)
    coordinator = await start_coordinator(
        etcd.endpoint,
        prefix,
        COORDINATOR_HEARTBEAT_TIMEOUT_MS="60000",
        COORDINATOR_WATCH_GRACE_PERIOD_MS="3000",
    )
    await until_status(coordinator, Status.OK)

    await etcd.kill()
    killed = time.monotonic()
    # Within the grace period the view is still trusted.
    assert await coordinator.status_of("within-grace") is Status.OK
    assert time.monotonic() - killed < 3
    # Beyond it: UNAVAILABLE, and no worker is contacted.
    await until_status(coordinator, Status.UNAVAILABLE, within=15)
    assert time.monotonic() - killed >= 3

    await etcd.restart()
    await publish(etcd, prefix, addr)
    await until_status(coordinator, Status.OK)


async def test_bundle_coordinator_serves_only_its_own_service(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    workers: Workers,
    start_coordinator: StartCoordinator,
) -> None:
    prefix = unique_lane(RegistryKind.BUNDLE)
    addr = await workers.start(FakeWorker())
    await publish(etcd_server, prefix, addr)
    coordinator = await start_coordinator(
        etcd_server.endpoint, prefix, program="blockx-bundle-coordinator", wait=False
    )
    bundle = bundlecoordinator_v1.BundleCoordinatorServiceStub(coordinator.channel)

    async def routes() -> bool:
        assert coordinator.alive(), coordinator.output()
        try:
            response = await bundle.reserve_worker_slot(
                bundlecoordinator_v1.ReserveWorkerSlotRequest(task_id="b1"), timeout=5
            )
        except (GRPCError, OSError):
            return False
        return response.worker_addr == addr and response.task_id == "b1"

    await wait_until(routes, timeout=20)
    # The block service is not registered. Asked with the official grpcio client:
    # grpclib's own client reads grpclib's trailers-only answer as UNKNOWN.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{coordinator.port}") as channel:
        call = channel.unary_unary(
            "/coordinator.v1.CoordinatorService/ReserveWorkerSlot",
            request_serializer=bytes,
            response_deserializer=coordinator_v1.ReserveWorkerSlotResponse.parse,
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(coordinator_v1.ReserveWorkerSlotRequest(task_id="b2"), timeout=5)
    assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("COORDINATOR_MAX_CANDIDATES", "0"),
        ("COORDINATOR_WATCH_GRACE_PERIOD_MS", "20000"),
        ("COORDINATOR_CPU_RED_LINE", "1.5"),
        ("COORDINATOR_REGISTRY_PREFIXES", "/blockx/bundle-workers/"),
        ("ETCD_ENDPOINTS", "etcd:two"),
    ],
)
def test_bad_configuration_is_one_line_and_nonzero(variable: str, value: str) -> None:
    binary = shutil.which("blockx-coordinator")
    assert binary is not None
    result = subprocess.run(
        [binary],
        env={**os.environ, "COORDINATOR_LISTEN": f"127.0.0.1:{free_port()}", variable: value},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert variable in lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


async def test_sigterm_stops_cleanly_and_writes_the_cpu_profile(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    start_coordinator: StartCoordinator,
    tmp_path: Path,
) -> None:
    profile = tmp_path / "cpu.prof"
    coordinator = await start_coordinator(
        etcd_server.endpoint, unique_lane(), COORDINATOR_CPU_PROFILE=str(profile)
    )
    assert coordinator.stop() == 0
    log = coordinator.log.read_text()
    assert "Traceback" not in log
    import pstats

    stats = pstats.Stats(str(profile))
    assert stats.total_calls > 0  # type: ignore[attr-defined]
