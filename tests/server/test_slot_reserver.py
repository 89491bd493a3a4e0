"""GrpcSlotReserver against real sockets: a scripted fake Worker gRPC server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server
from lost_connections import ClosedUnderTheCall
from support import free_port

from blockx_core.coordinator import (
    SlotAttemptResult,
    SlotError,
    SlotGranted,
    classify_slot_answer,
)
from blockx_core.errors import ErrorCode
from blockx_proto import coordinator_v1, worker_v1
from blockx_server.coordinator.slot_reserver import GrpcSlotReserver
from blockx_server.runtime.status import (
    WORKER_ADMISSION_STATUS,
    WORKER_STATUS,
    classify_worker_status,
)


class FakeWorker(worker_v1.WorkerServiceBase):
    """Grants, fails with a status, or hangs, as the test sets ``mode``."""

    def __init__(self) -> None:
        self.mode: str | Status = "grant"
        self.requests: list[worker_v1.RequestTaskSlotRequest] = []

    async def request_task_slot(
        self, message: worker_v1.RequestTaskSlotRequest
    ) -> worker_v1.TaskSnapshot:
        self.requests.append(message)
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if isinstance(self.mode, Status):
            raise GRPCError(self.mode, f"scripted {self.mode.name}")
        return worker_v1.TaskSnapshot(
            task_id=message.task_id,
            slot_id=f"slot-{message.task_id}",
            state=worker_v1.TaskState.ALLOCATED,
            lease_deadline_ms=42,
        )


@pytest.fixture
async def fake_worker() -> AsyncIterator[tuple[FakeWorker, str]]:
    worker = FakeWorker()
    server = Server([worker])
    port = free_port()
    await server.start("127.0.0.1", port)
    yield worker, f"127.0.0.1:{port}"
    server.close()
    await server.wait_closed()


@pytest.fixture
async def reserver() -> AsyncIterator[GrpcSlotReserver]:
    # A busy host can take hundreds of ms for a first connection: only the hang
    # test wants the deadline to pass.
    r = GrpcSlotReserver(timeout_ms=10_000)
    yield r
    r.close()


@pytest.fixture
async def impatient_reserver() -> AsyncIterator[GrpcSlotReserver]:
    r = GrpcSlotReserver(timeout_ms=300)
    yield r
    r.close()


async def test_grant(fake_worker: tuple[FakeWorker, str], reserver: GrpcSlotReserver) -> None:
    worker, addr = fake_worker
    outcome = await reserver.request_task_slot(addr, "t1", 5000)
    assert outcome == SlotGranted("slot-t1", 42)
    assert worker.requests == [worker_v1.RequestTaskSlotRequest(task_id="t1", ttl_ms=5000)]


@pytest.mark.parametrize(
    ("status", "code", "uncertain"),
    [
        (Status.INVALID_ARGUMENT, ErrorCode.INVALID_ARGUMENT, False),
        (Status.RESOURCE_EXHAUSTED, ErrorCode.NO_SLOT, False),
        (Status.FAILED_PRECONDITION, ErrorCode.INVALID_SLOT, False),
        (Status.NOT_FOUND, ErrorCode.NOT_FOUND, False),
        (Status.UNAVAILABLE, ErrorCode.UNAVAILABLE, False),  # draining / not ready
        (Status.UNIMPLEMENTED, ErrorCode.REJECTED, False),
        (Status.DEADLINE_EXCEEDED, ErrorCode.SLOT_UNCERTAIN, True),
        (Status.CANCELLED, ErrorCode.SLOT_UNCERTAIN, True),
        (Status.ABORTED, ErrorCode.SLOT_UNCERTAIN, True),
        (Status.INTERNAL, ErrorCode.SLOT_UNCERTAIN, True),
        (Status.UNKNOWN, ErrorCode.SLOT_UNCERTAIN, True),
    ],
)
async def test_status_classification_over_the_wire(
    fake_worker: tuple[FakeWorker, str],
    reserver: GrpcSlotReserver,
    status: Status,
    code: ErrorCode,
    uncertain: bool,
) -> None:
    worker, addr = fake_worker
    worker.mode = status
    outcome = await reserver.request_task_slot(addr, "t1", 5000)
    assert isinstance(outcome, SlotError)
    assert (outcome.code, outcome.may_have_allocated) == (code, uncertain)
    assert status.name in outcome.message


async def test_hang_is_uncertain_timeout(
    fake_worker: tuple[FakeWorker, str], impatient_reserver: GrpcSlotReserver
) -> None:
    worker, addr = fake_worker
    worker.mode = "hang"
    outcome = await impatient_reserver.request_task_slot(addr, "t1", 5000)
    assert isinstance(outcome, SlotError)
    assert outcome.may_have_allocated
    assert "timed out" in outcome.message
    assert len(worker.requests) == 1  # it did reach the worker


async def test_connection_refused_is_definite(reserver: GrpcSlotReserver) -> None:
    outcome = await reserver.request_task_slot(f"127.0.0.1:{free_port()}", "t1", 5000)
    assert isinstance(outcome, SlotError)
    assert (outcome.code, outcome.may_have_allocated) == (ErrorCode.UNAVAILABLE, False)


async def test_connection_dropped_mid_call_is_uncertain(reserver: GrpcSlotReserver) -> None:
    """A peer that accepts and then drops the connection: the request may have landed."""

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the client has started sending
        writer.transport.abort()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        outcome = await reserver.request_task_slot(f"127.0.0.1:{port}", "t1", 5000)
    finally:
        server.close()
        await server.wait_closed()
    assert isinstance(outcome, SlotError)
    assert outcome.may_have_allocated


async def test_a_call_cut_off_inside_grpclib_is_uncertain(
    fake_worker: tuple[FakeWorker, str], reserver: GrpcSlotReserver
) -> None:
    _, addr = fake_worker
    host, port = addr.rsplit(":", 1)
    reserver._channels[addr] = ClosedUnderTheCall(host, int(port))
    outcome = await reserver.request_task_slot(addr, "t1", 5000)
    assert isinstance(outcome, SlotError)
    assert (outcome.code, outcome.may_have_allocated) == (ErrorCode.SLOT_UNCERTAIN, True)
    assert outcome.message == "connection lost"


async def test_bad_address_is_definite(reserver: GrpcSlotReserver) -> None:
    outcome = await reserver.request_task_slot("no-port", "t1", 5000)
    assert isinstance(outcome, SlotError)
    assert (outcome.code, outcome.may_have_allocated) == (ErrorCode.REJECTED, False)


async def test_one_channel_per_worker(
    fake_worker: tuple[FakeWorker, str], reserver: GrpcSlotReserver
) -> None:
    _, addr = fake_worker
    for i in range(3):
        assert isinstance(await reserver.request_task_slot(addr, f"t{i}", 5000), SlotGranted)
    assert list(reserver._channels) == [addr]


def test_classification_is_the_inverse_of_the_worker_mapping() -> None:
    for code, status in WORKER_ADMISSION_STATUS.items():
        assert classify_worker_status(status) == (code, False), code
    # CancelTask's one refusal of its own shares a status RequestTaskSlot means as
    # a definite rejection, and is never answered to it.
    for code, status in WORKER_STATUS.items():
        assert classify_worker_status(status)[1] is False, code
    worker_statuses = set(WORKER_STATUS.values())
    for status in Status:
        if status is Status.OK:
            continue
        code, uncertain = classify_worker_status(status)
        # A status the Worker never uses for a rejection is never read as one of its codes.
        if status not in worker_statuses:
            assert code not in WORKER_STATUS, status
        if status in (
            Status.DEADLINE_EXCEEDED,
            Status.CANCELLED,
            Status.ABORTED,
            Status.INTERNAL,
            Status.UNKNOWN,
        ):
            assert uncertain, status


# What each status a Worker may answer RequestTaskSlot with means for that Worker.
STATUS_RESULTS: dict[Status, SlotAttemptResult] = {
    # The request's fault: no penalty, no breaker; the reservation fails.
    Status.INVALID_ARGUMENT: SlotAttemptResult.INVALID,
    # Full: the Worker working as intended, no penalty.
    Status.RESOURCE_EXHAUSTED: SlotAttemptResult.BACKPRESSURE,
    # Definite refusals that count against the Worker.
    Status.FAILED_PRECONDITION: SlotAttemptResult.REJECTED,
    Status.UNAVAILABLE: SlotAttemptResult.REJECTED,
    Status.NOT_FOUND: SlotAttemptResult.REJECTED,
    Status.UNIMPLEMENTED: SlotAttemptResult.REJECTED,
    Status.PERMISSION_DENIED: SlotAttemptResult.REJECTED,
    Status.UNAUTHENTICATED: SlotAttemptResult.REJECTED,
    # Anything else may have allocated: the same Worker is asked again.
    Status.CANCELLED: SlotAttemptResult.UNCERTAIN,
    Status.UNKNOWN: SlotAttemptResult.UNCERTAIN,
    Status.DEADLINE_EXCEEDED: SlotAttemptResult.UNCERTAIN,
    Status.ALREADY_EXISTS: SlotAttemptResult.UNCERTAIN,
    Status.ABORTED: SlotAttemptResult.UNCERTAIN,
    Status.OUT_OF_RANGE: SlotAttemptResult.UNCERTAIN,
    Status.INTERNAL: SlotAttemptResult.UNCERTAIN,
    Status.DATA_LOSS: SlotAttemptResult.UNCERTAIN,
}


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.OK])
def test_every_status_counts_as_the_table_says(status: Status) -> None:
    code, uncertain = classify_worker_status(status)
    answer = SlotError(code, status.name, may_have_allocated=uncertain)
    assert classify_slot_answer(answer) is STATUS_RESULTS[status]


async def test_an_address_that_is_not_a_worker_is_a_definite_rejection(
    reserver: GrpcSlotReserver,
) -> None:
    """A grpclib server without worker.v1 (here: a coordinator) refuses the method; the
    request reached no slot table, so the coordinator may move on to the next worker."""
    server = Server([coordinator_v1.CoordinatorServiceBase()])
    port = free_port()
    await server.start("127.0.0.1", port)
    try:
        outcome = await reserver.request_task_slot(f"127.0.0.1:{port}", "t1", 5000)
    finally:
        server.close()
        await server.wait_closed()
    assert isinstance(outcome, SlotError)
    assert (outcome.code, outcome.may_have_allocated) == (ErrorCode.REJECTED, False)
    assert "does not serve worker.v1" in outcome.message
