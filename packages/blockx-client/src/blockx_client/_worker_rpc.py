"""The worker.v1 calls a client makes: RequestTaskSlot, SubmitTask, GetTaskResult,
WatchTasks, ListTasks, CancelTask, DescribeWorker. One call each, no retries: placement
and waiting build on these."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence

from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from blockx_client._convert import (
    cancellation_from_pb,
    description_from_pb,
    listed_from_pb,
    record_from_pb,
    result_from_pb,
    states_to_pb,
    task_to_pb,
    update_from_pb,
)
from blockx_client._options import ClientOptions
from blockx_client.errors import UnavailableError, error_for
from blockx_client.models import (
    Cancellation,
    CancelOutcome,
    ListedTask,
    Reservation,
    SubmitAnswer,
    Task,
    TaskResult,
    TaskState,
    TaskUpdate,
    WorkerDescription,
)
from blockx_client.transport import Transport, connect_error, cut_off
from blockx_core.call_record import CallRecord
from blockx_proto import worker_v1


class WorkerRpc:
    def __init__(self, options: ClientOptions, transport: Transport) -> None:
        self._options = options
        self._transport = transport

    def _stub(self, worker_addr: str) -> tuple[worker_v1.WorkerServiceStub, dict[str, str] | None]:
        channel, metadata = self._transport.worker(worker_addr)
        return worker_v1.WorkerServiceStub(channel), metadata

    async def request_task_slot(
        self, worker_addr: str, task_id: str | None = None, *, ttl_ms: int = 5000
    ) -> Reservation:
        task_id = task_id or str(uuid.uuid4())
        stub, metadata = self._stub(worker_addr)
        reply = await self._transport.unary(
            worker_addr,
            stub.request_task_slot(
                worker_v1.RequestTaskSlotRequest(task_id=task_id, ttl_ms=ttl_ms),
                timeout=self._options.rpc_timeout_s,
                metadata=metadata,
            ),
        )
        return Reservation(reply.task_id, reply.worker_addr or worker_addr, reply.slot_id)

    async def submit_task(self, task: Task, *, worker_addr: str, slot_id: str = "") -> SubmitAnswer:
        task = task.with_id()
        stub, metadata = self._stub(worker_addr)
        reply = await self._transport.unary(
            worker_addr,
            stub.submit_task(
                worker_v1.SubmitTaskRequest(task=task_to_pb(task), slot_id=slot_id),
                timeout=self._options.rpc_timeout_s,
                metadata=metadata,
            ),
        )
        result = result_from_pb(task.task_id, reply.state, reply.result, worker_addr)
        return SubmitAnswer(
            task_id=task.task_id,
            state=result.state,
            slot_id=reply.slot_id,
            worker_addr=worker_addr,
            result=result if result.state.is_terminal else None,
            input_differs=reply.input_differs,
        )

    async def get_task_result(self, task_id: str, *, worker_addr: str) -> TaskResult:
        stub, metadata = self._stub(worker_addr)
        reply = await self._transport.unary(
            worker_addr,
            stub.get_task_result(
                worker_v1.GetTaskResultRequest(task_id=task_id),
                timeout=self._options.rpc_timeout_s,
                metadata=metadata,
            ),
        )
        return result_from_pb(task_id, reply.state, reply.result, worker_addr)

    async def cancel_task(self, task_id: str, *, worker_addr: str) -> Cancellation:
        """CancelTask; a task reserved but not submitted (FAILED_PRECONDITION) is the
        NOT_SUBMITTED outcome, with the Worker's words. TaskNotFoundError when the
        worker does not know the task."""
        stub, metadata = self._stub(worker_addr)
        call = stub.cancel_task(
            worker_v1.CancelTaskRequest(task_id=task_id),
            timeout=self._options.rpc_timeout_s,
            metadata=metadata,
        )
        reply = await self._transport.unary(worker_addr, _not_submitted(call))
        if isinstance(reply, str):
            return Cancellation(
                task_id=task_id,
                worker_addr=worker_addr,
                outcome=CancelOutcome.NOT_SUBMITTED,
                state=TaskState.ALLOCATED,
                detail=reply,
            )
        return cancellation_from_pb(reply, task_id, worker_addr)

    async def list_tasks(
        self,
        worker_addr: str,
        *,
        states: Sequence[TaskState] = (),
        function: str = "",
        min_age_ms: int = 0,
        max_age_ms: int = 0,
        page_size: int = 0,
        page_token: str = "",
        include_expired: bool = False,
    ) -> tuple[list[ListedTask], str]:
        """One page of the worker's tasks and the token of the next ("" at the end)."""
        stub, metadata = self._stub(worker_addr)
        reply = await self._transport.unary(
            worker_addr,
            stub.list_tasks(
                worker_v1.ListTasksRequest(
                    states=states_to_pb(states),
                    function=function,
                    min_age_ms=min_age_ms,
                    max_age_ms=max_age_ms,
                    page_size=page_size,
                    page_token=page_token,
                    include_expired=include_expired,
                ),
                timeout=self._options.rpc_timeout_s,
                metadata=metadata,
            ),
        )
        tasks = [listed_from_pb(t, reply.worker_addr or worker_addr) for t in reply.tasks]
        return tasks, reply.next_page_token

    async def get_call_record(
        self, task_id: str, call_index: int | None, *, worker_addr: str
    ) -> CallRecord:
        """GetCallRecord; TaskNotFoundError with the Worker's words when it keeps no
        such record."""
        stub, metadata = self._stub(worker_addr)
        reply = await self._transport.unary(
            worker_addr,
            stub.get_call_record(
                worker_v1.GetCallRecordRequest(task_id=task_id, call_index=call_index),
                timeout=self._options.rpc_timeout_s,
                metadata=metadata,
            ),
        )
        return record_from_pb(reply.record)

    async def describe_worker(
        self, worker_addr: str, *, recent_failures: int = 0, running_tasks: int = 0
    ) -> WorkerDescription:
        stub, metadata = self._stub(worker_addr)
        reply = await self._transport.unary(
            worker_addr,
            stub.describe_worker(
                worker_v1.DescribeWorkerRequest(
                    recent_failures=recent_failures, running_tasks=running_tasks
                ),
                timeout=self._options.rpc_timeout_s,
                metadata=metadata,
            ),
        )
        return description_from_pb(reply, worker_addr)

    async def watch_tasks(
        self, task_ids: Sequence[str], *, worker_addr: str, progress: bool = False
    ) -> AsyncIterator[TaskUpdate]:
        """The stream's updates (with ``progress``, the call-progress ones too). The
        Worker answers its opening with a snapshot per task_id, so the first update
        (connecting included) must come within ``rpc_timeout_s``, or the stream
        counts as broken; after that, a silent peer is dropped by the channel's
        keepalive."""
        stub, metadata = self._stub(worker_addr)
        updates = stub.watch_tasks(
            worker_v1.WatchTasksRequest(task_ids=list(task_ids), progress=progress),
            metadata=metadata,
        )
        first = True
        try:
            while True:
                try:
                    if first:
                        # asyncio.timeout, not wait_for: no task of its own per stream.
                        async with asyncio.timeout(self._options.rpc_timeout_s):
                            update = await anext(updates)
                        first = False
                    else:
                        update = await anext(updates)
                except StopAsyncIteration:
                    return
                yield update_from_pb(update)
        except GRPCError as exc:
            raise error_for(exc.status, exc.message or "") from None
        except TimeoutError:
            raise UnavailableError(
                f"the Watch stream to {worker_addr} did not open in time",
                Status.DEADLINE_EXCEEDED,
            ) from None
        except (OSError, StreamTerminatedError, AttributeError) as exc:
            lost = cut_off(exc) if isinstance(exc, AttributeError) else exc
            where = f"the Watch stream to {worker_addr}"
            raise connect_error(where, lost, self._transport.setting_of(worker_addr)) from None
        finally:
            close = getattr(updates, "aclose", None)  # an async generator, typed as an iterator
            if close is not None:
                await close()


async def _not_submitted(
    call: Awaitable[worker_v1.CancelTaskResponse],
) -> worker_v1.CancelTaskResponse | str:
    """CancelTask's answer, or the Worker's message where it answered that the task is
    only reserved (FAILED_PRECONDITION, which CancelTask answers for nothing else)."""
    try:
        return await call
    except GRPCError as exc:
        if exc.status is Status.FAILED_PRECONDITION:
            return exc.message or "the task is reserved, not submitted"
        raise
