"""Why a task is not placed, end to end: a real etcd, a real ``blockx-coordinator``,
scripted heartbeats for workers in each state (full, stale, red-lined), a scripted
worker that answers NoSlot and a real ``blockx-worker``; then what reaches a raw
gRPC caller (trailing metadata), the SDK (typed errors), ``blockx why`` and the
CLI's waiting line."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aetcd
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server
from processes import EXAMPLES, CoordinatorProcess, WorkerProcess
from support import free_port, heartbeat, wait_until

from blockx_client import (
    BlockxError,
    Client,
    Cluster,
    ClusterBusyError,
    NoSlotError,
    PlacementReport,
    SlotWaitTimeoutError,
)
from blockx_core.coordinator import (
    PLACEMENT_METADATA_KEY,
    PlacementExplanation,
    ReasonKind,
    decode_explanation,
    describe_reason,
)
from blockx_core.heartbeat import encode_heartbeat
from blockx_core.registry import RegistryKind
from blockx_proto import coordinator_v1, worker_v1
from blockx_server.etcd.local import EtcdServer
from blockx_server.runtime.clock import SYSTEM_CLOCK

_RESERVE = "/coordinator.v1.CoordinatorService/ReserveWorkerSlot"


class NoSlotWorker(worker_v1.WorkerServiceBase):
    """A worker whose slot table is always full: it answers RESOURCE_EXHAUSTED."""

    async def request_task_slot(
        self, message: worker_v1.RequestTaskSlotRequest
    ) -> worker_v1.TaskSnapshot:
        raise GRPCError(Status.RESOURCE_EXHAUSTED, "scripted: no free slot")


@pytest.fixture
async def no_slot_worker() -> AsyncIterator[str]:
    server = Server([NoSlotWorker()])
    port = free_port()
    await server.start("127.0.0.1", port)
    yield f"127.0.0.1:{port}"
    server.close()
    await server.wait_closed()


async def publish(etcd: EtcdServer, prefix: str, addr: str, **fields: float) -> None:
    """A heartbeat for ``addr``, ``age_ms`` old, as a Worker's publisher would write it."""
    age_ms = int(fields.pop("age_ms", 0))
    slots = int(fields.pop("slots", 10))
    used = int(fields.pop("used", 0))
    client = aetcd.Client(etcd.host, etcd.port, timeout=5)
    try:
        hb = heartbeat(addr, slots=slots, used=used, at_ms=SYSTEM_CLOCK.now_ms() - age_ms, **fields)
        await client.put((prefix + addr).encode(), encode_heartbeat(hb))
    finally:
        await client.close()


@pytest.fixture
async def start_coordinator(tmp_path: Path) -> AsyncIterator[Callable[..., CoordinatorProcess]]:
    started: list[CoordinatorProcess] = []

    def start(
        etcd: EtcdServer, prefix: str, program: str = "blockx-coordinator", **env: str
    ) -> CoordinatorProcess:
        proc = CoordinatorProcess(
            {
                "ETCD_ENDPOINTS": etcd.endpoint,
                "COORDINATOR_REGISTRY_PREFIXES": prefix,
                # Scripted heartbeats are written once: keep them fresh for the test.
                "COORDINATOR_HEARTBEAT_TIMEOUT_MS": "60000",
                "COORDINATOR_WATCH_GRACE_PERIOD_MS": "10000",
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


async def raw_refusal(coordinator: CoordinatorProcess) -> tuple[GRPCError, bytes]:
    """ReserveWorkerSlot as any gRPC caller makes it: the status and the raw metadata."""
    channel = Channel(coordinator.host, coordinator.port)
    try:
        async with channel.request(
            _RESERVE,
            Cardinality.UNARY_UNARY,
            coordinator_v1.ReserveWorkerSlotRequest,
            coordinator_v1.ReserveWorkerSlotResponse,
            timeout=10,
        ) as stream:
            await stream.send_message(
                coordinator_v1.ReserveWorkerSlotRequest(task_id="t"), end=True
            )
            try:
                await stream.recv_message()
            except GRPCError as exc:
                assert stream.trailing_metadata is not None
                raw = stream.trailing_metadata[PLACEMENT_METADATA_KEY]
                assert isinstance(raw, bytes)
                return exc, raw
    finally:
        channel.close()
    raise AssertionError("the reservation was granted")


async def sees(client: Client, count: int) -> PlacementReport:
    """The coordinator's report once its view holds ``count`` workers."""
    report: PlacementReport | None = None

    async def complete() -> bool:
        nonlocal report
        try:
            report = await client.explain_placement()
        except OSError:
            return False
        return len(report.workers) == count

    await wait_until(complete, "the coordinator's view", timeout=30)
    assert report is not None
    return report


def by_addr(explanation: PlacementExplanation) -> dict[str, str]:
    return {r.worker_addr: describe_reason(r) for r in explanation.workers}


def blockx(
    coordinator: CoordinatorProcess, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("blockx") or str(Path(sys.executable).parent / "blockx")
    return subprocess.run(
        [binary, "--coordinator", f"127.0.0.1:{coordinator.port}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "220"},
    )


FULL, STALE, RED = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"


async def test_a_refusal_explains_every_worker(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    no_slot_worker: str,
    start_coordinator: Callable[..., CoordinatorProcess],
) -> None:
    prefix = unique_lane()
    await publish(etcd_server, prefix, FULL, slots=50, used=50)
    await publish(etcd_server, prefix, STALE, age_ms=120_000)
    await publish(etcd_server, prefix, RED, cpu_percent=0.97)
    await publish(etcd_server, prefix, no_slot_worker, slots=5)
    coordinator = start_coordinator(
        etcd_server, prefix, COORDINATOR_CPU_RED_LINE="0.90", COORDINATOR_MAX_CANDIDATES="3"
    )
    await coordinator.wait_serving()
    async with Client(coordinator=f"127.0.0.1:{coordinator.port}") as client:
        report = await sees(client, 4)

        # The read-only RPC: the one eligible worker first, then the others by address.
        assert [(w.worker_addr, w.eligible) for w in report.workers] == [
            (no_slot_worker, True),
            (FULL, False),
            (STALE, False),
            (RED, False),
        ]
        assert report.view_trusted
        reasons = {w.worker_addr: w.reason for w in report.workers}
        assert reasons[FULL] == "full 50/50"
        assert reasons[STALE].startswith("stale heartbeat 12")  # 120.x s
        assert reasons[RED] == "cpu 0.97 > red line 0.90"
        assert reasons[no_slot_worker] == "eligible 0/5"

        # What any gRPC caller gets with RESOURCE_EXHAUSTED.
        error, raw = await raw_refusal(coordinator)
        assert error.status is Status.RESOURCE_EXHAUSTED
        explanation = decode_explanation(raw)
        assert explanation.workers[0].worker_addr == no_slot_worker  # asked first
        assert explanation.workers[0].kind is ReasonKind.ANSWERED
        described = by_addr(explanation)
        assert described[no_slot_worker] == "answered RESOURCE_EXHAUSTED: scripted: no free slot"
        assert described[FULL] == "full 50/50"
        assert described[RED] == "cpu 0.97 > red line 0.90"
        assert described[STALE].startswith("stale heartbeat")
        assert explanation.omitted == 0

        # The SDK: the deadline passes while a worker is red-lined and one is stale,
        # which is not "every worker full": timed out, with every reason kept.
        with pytest.raises(SlotWaitTimeoutError) as caught:
            await client.reserve_worker_slot("t-sdk", deadline_s=1.0)
        assert "timed out waiting for a slot" in caught.value.message
        assert "cpu 0.97 > red line 0.90" in caught.value.message
        assert {r.worker_addr: r.kind for r in caught.value.worker_reasons} == {
            no_slot_worker: ReasonKind.ANSWERED,
            FULL: ReasonKind.FULL,
            STALE: ReasonKind.STALE_HEARTBEAT,
            RED: ReasonKind.CPU_RED_LINE,
        }
        assert isinstance(caught.value, NoSlotError)

    # `blockx why`, a table and --json.
    shown = await asyncio.to_thread(blockx, coordinator, "why")
    assert shown.returncode == 0, shown.stderr
    assert "1 of 4 worker(s) eligible" in shown.stdout
    for words in ("full 50/50", "cpu 0.97 > red line 0.90", "stale heartbeat", "eligible 0/5"):
        assert words in shown.stdout, shown.stdout
    # Below it, the refusals just met, newest first: the SDK's wait, then the raw one.
    assert "the coordinator's last 5 refusal(s)" in shown.stdout, shown.stdout
    assert "t-sdk" in shown.stdout
    as_json = await asyncio.to_thread(blockx, coordinator, "why", "--json")
    document = json.loads(as_json.stdout)
    assert document["view_trusted"] is True
    refused = document["recent_refusals"]
    assert len(refused) == 5
    assert refused[0]["task_id"] == "t-sdk"
    assert refused[0]["code"] == "NoExecutableSlot"
    assert any(w["kind"] == "full" for w in refused[0]["workers"])
    none = await asyncio.to_thread(blockx, coordinator, "why", "--refusals", "0", "--json")
    assert json.loads(none.stdout)["recent_refusals"] == []
    assert [w["kind"] for w in document["workers"]] == [
        "eligible",
        "full",
        "stale_heartbeat",
        "cpu_red_line",
    ]
    assert document["workers"][3]["cpu_fraction"] == pytest.approx(0.97)
    one = await asyncio.to_thread(blockx, coordinator, "why", "--worker", RED, "--json")
    assert [w["reason"] for w in json.loads(one.stdout)["workers"]] == ["cpu 0.97 > red line 0.90"]

    # The CLI's waiting line while it backs off, then the timed-out error.
    waited = await asyncio.to_thread(blockx, coordinator, "reserve", "--timeout", "1.5")
    assert waited.returncode == 3
    assert "waiting for a slot: " in waited.stderr, waited.stderr
    assert f"{no_slot_worker}: answered RESOURCE_EXHAUSTED" in waited.stderr
    assert "timed out waiting for a slot" in waited.stderr
    assert "blockx why" in waited.stderr  # the hint
    assert "Traceback" not in waited.stderr


async def test_every_worker_full_is_busy_not_timed_out(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    no_slot_worker: str,
    start_coordinator: Callable[..., CoordinatorProcess],
) -> None:
    prefix = unique_lane()
    await publish(etcd_server, prefix, FULL, slots=2, used=2)
    await publish(etcd_server, prefix, no_slot_worker, slots=3)
    coordinator = start_coordinator(etcd_server, prefix)
    await coordinator.wait_serving()
    async with Client(coordinator=f"127.0.0.1:{coordinator.port}") as client:
        await sees(client, 2)
        with pytest.raises(ClusterBusyError) as caught:
            await client.reserve_worker_slot("t-busy", deadline_s=1.0)
    assert caught.value.message.startswith("busy: every worker is full")
    assert "full 2/2" in caught.value.message
    assert "deadline" in caught.value.message
    assert {r.kind for r in caught.value.worker_reasons} == {ReasonKind.FULL, ReasonKind.ANSWERED}


async def test_the_bundle_coordinator_explains_too(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    start_coordinator: Callable[..., CoordinatorProcess],
) -> None:
    prefix = unique_lane(RegistryKind.BUNDLE)
    await publish(etcd_server, prefix, FULL, slots=4, used=4)
    coordinator = start_coordinator(etcd_server, prefix, "blockx-bundle-coordinator")
    await coordinator.wait_serving()
    address = f"127.0.0.1:{coordinator.port}"

    async def refused_with_reasons() -> bool:
        async with Client(bundle_coordinator=address) as client:
            try:
                await client.reserve_worker_slot("t-b", cluster=Cluster.BUNDLE, deadline_s=0.3)
            except ClusterBusyError as exc:
                return "127.0.0.1:1: full 4/4" in exc.message
            except BlockxError:
                return False
        return False

    await wait_until(refused_with_reasons, "a busy refusal naming the full worker", timeout=30)


async def test_many_workers_stay_within_8_kib(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    start_coordinator: Callable[..., CoordinatorProcess],
) -> None:
    prefix = unique_lane()
    count = 400
    client = aetcd.Client(etcd_server.host, etcd_server.port, timeout=5)
    try:
        now_ms = SYSTEM_CLOCK.now_ms()
        for i in range(count):
            addr = f"worker-{i:03d}.a-rather-long-rack-name.cluster.example.internal:50051"
            hb = heartbeat(addr, slots=50, used=50, at_ms=now_ms)
            await client.put((prefix + addr).encode(), encode_heartbeat(hb))
    finally:
        await client.close()
    coordinator = start_coordinator(etcd_server, prefix)
    await coordinator.wait_serving()
    async with Client(coordinator=f"127.0.0.1:{coordinator.port}") as sdk:
        await sees(sdk, count)
        error, raw = await raw_refusal(coordinator)
        with pytest.raises(NoSlotError) as caught:
            await sdk.reserve_worker_slot("t-many", deadline_s=0.5)
    assert error.status is Status.RESOURCE_EXHAUSTED
    assert len(base64.b64encode(raw)) <= 8 * 1024
    explanation = decode_explanation(raw)
    assert 0 < len(explanation.workers) < count
    assert len(explanation.workers) + explanation.omitted == count
    assert all(r.kind is ReasonKind.FULL for r in explanation.workers)
    assert f"(+{count - 5} more workers)" in caught.value.message
    assert caught.value.placement.omitted == explanation.omitted


FUNCTIONS = EXAMPLES / "functions"


async def test_a_real_worker_full_then_free(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    start_coordinator: Callable[..., CoordinatorProcess],
    tmp_path: Path,
) -> None:
    """A real worker with one slot: once reserved, `why` says it is full."""
    prefix = unique_lane()
    (tmp_path / "functions").mkdir()
    shutil.copy(FUNCTIONS / "hello.py", tmp_path / "functions" / "hello.py")
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": prefix,
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(tmp_path / "functions"),
            "TASK_SLOTS": "1",
        },
        tmp_path / "worker.log",
    )
    # The coordinator first: its readiness probe (a ReserveWorkerSlot) must not take
    # the worker's only slot. A generous RequestTaskSlot timeout: on a loaded host an
    # uncertain first try would hold the slot for this very task, and the heartbeat
    # would then (rightly) show the worker full to its own retry.
    coordinator = start_coordinator(
        etcd_server,
        prefix,
        COORDINATOR_SLOT_TTL_MS="30000",
        COORDINATOR_WORKER_RPC_TIMEOUT_MS="10000",
    )
    await coordinator.wait_serving()
    try:
        await worker.wait_ready()
        async with Client(coordinator=f"127.0.0.1:{coordinator.port}") as client:
            report = await sees(client, 1)
            worker_addr = report.workers[0].worker_addr
            await client.reserve_worker_slot("t-holds-the-slot", deadline_s=20)

            async def full() -> bool:
                [only] = (await client.explain_placement()).workers
                return only.reason == "full 1/1"

            await wait_until(full, "the heartbeat with the slot reserved", timeout=20)
            with pytest.raises(ClusterBusyError) as caught:
                await client.reserve_worker_slot("t-second", deadline_s=0.5)
            assert f"{worker_addr}: full 1/1" in caught.value.message
    finally:
        worker.stop()
