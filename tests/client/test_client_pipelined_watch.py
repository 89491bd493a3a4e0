"""With a reserved slot, ``Client.run`` opens the task's Watch alongside SubmitTask
instead of after its answer, and closes that Watch when the submission goes to
another worker. The coordinator and workers here are scripted gRPC servers on real
sockets: the tests are about the client's side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server
from support import free_port

from blockx_client import Client, Task, TaskState
from blockx_proto import coordinator_v1, worker_v1

WAIT_S = 5.0


async def serve(service: Any) -> tuple[Server, str]:
    server = Server([service])
    port = free_port()
    await server.start("127.0.0.1", port)
    return server, f"127.0.0.1:{port}"


class Placer(coordinator_v1.CoordinatorServiceBase):
    """Grants the n-th reservation on ``workers[n]`` (the last one from then on)."""

    def __init__(self, workers: list[str]) -> None:
        self.workers = workers
        self.granted = 0

    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        addr = self.workers[min(self.granted, len(self.workers) - 1)]
        self.granted += 1
        return coordinator_v1.ReserveWorkerSlotResponse(
            task_id=message.task_id, worker_addr=addr, slot_id=f"s{self.granted}"
        )


class GatedWorker(worker_v1.WorkerServiceBase):
    """Answers SubmitTask only once a Watch of the task is open (a client that waits
    for the answer before watching never gets one), or refuses every SubmitTask
    with FAILED_PRECONDITION (``refuse``). A Watch sends the ALLOCATED snapshot,
    then the terminal update once the task was submitted."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.refuse = refuse
        self.watching = asyncio.Event()
        self.submitted = asyncio.Event()
        self.watch_closed = asyncio.Event()
        self.watches = 0

    async def submit_task(
        self, message: worker_v1.SubmitTaskRequest
    ) -> worker_v1.SubmitTaskResponse:
        assert message.task is not None
        if self.refuse:
            await asyncio.wait_for(self.watching.wait(), WAIT_S)
            raise GRPCError(Status.FAILED_PRECONDITION, f"slot {message.slot_id} expired")
        try:
            await asyncio.wait_for(self.watching.wait(), WAIT_S)
        except TimeoutError:
            raise GRPCError(Status.INTERNAL, "scripted: no Watch opened with SubmitTask") from None
        self.submitted.set()
        return worker_v1.SubmitTaskResponse(
            task_id=message.task.task_id, slot_id=message.slot_id, state=worker_v1.TaskState.RUNNING
        )

    async def watch_tasks(
        self, message: worker_v1.WatchTasksRequest
    ) -> AsyncIterator[worker_v1.TaskUpdate]:
        self.watches += 1
        [task_id] = message.task_ids
        try:
            yield worker_v1.TaskUpdate(task_id=task_id, state=worker_v1.TaskState.ALLOCATED)
            self.watching.set()
            await self.submitted.wait()
            yield worker_v1.TaskUpdate(
                task_id=task_id,
                state=worker_v1.TaskState.SUCCEEDED,
                is_terminal=True,
                result=worker_v1.TaskResult(success=True, execute_result=worker_v1.ExecuteResult()),
            )
        finally:
            self.watch_closed.set()


async def test_the_watch_opens_before_submit_task_is_answered() -> None:
    worker = GatedWorker()
    worker_server, worker_addr = await serve(worker)
    placer = Placer([worker_addr])
    coordinator_server, coordinator_addr = await serve(placer)
    try:
        async with Client(coordinator=coordinator_addr) as client:
            result = await asyncio.wait_for(client.run(Task.call_list("f", [[1]])), 3 * WAIT_S)
    finally:
        worker_server.close()
        coordinator_server.close()
    assert result.state is TaskState.SUCCEEDED
    assert (placer.granted, worker.watches) == (1, 1)


async def test_the_watch_on_a_worker_that_refused_the_task_is_closed() -> None:
    refusing, taking = GatedWorker(refuse=True), GatedWorker()
    refusing_server, refusing_addr = await serve(refusing)
    taking_server, taking_addr = await serve(taking)
    placer = Placer([refusing_addr, taking_addr])
    coordinator_server, coordinator_addr = await serve(placer)
    try:
        async with Client(coordinator=coordinator_addr) as client:
            result = await asyncio.wait_for(client.run(Task.call_list("f", [[1]])), 3 * WAIT_S)
            # The refused worker's Watch is closed by the client, not left to its slot's end.
            await asyncio.wait_for(refusing.watch_closed.wait(), WAIT_S)
    finally:
        for server in (refusing_server, taking_server, coordinator_server):
            server.close()
    assert result.state is TaskState.SUCCEEDED
    assert taking.submitted.is_set()
    assert (placer.granted, refusing.watches, taking.watches) == (2, 1, 1)
