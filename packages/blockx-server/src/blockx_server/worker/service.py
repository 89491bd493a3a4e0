"""worker.v1.WorkerService over grpclib: decode, call the Orchestrator, encode.

Admission errors become gRPC statuses through ``blockx_server.runtime.status.WORKER_STATUS``
(the inverse of the Coordinator's classification).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import assert_never

from grpclib.exceptions import GRPCError

from blockx_core.errors import Refusal
from blockx_core.task import TaskState
from blockx_core.worker import CallProgress, TaskSnapshot, UnknownTask, WatchedTask
from blockx_proto import worker_v1
from blockx_server.runtime.status import WORKER_STATUS, status_error
from blockx_server.worker.convert import (
    cancel_to_pb,
    config_chars,
    description_to_pb,
    listing_to_pb,
    progress_to_pb,
    query_from_pb,
    result_to_pb,
    state_to_pb,
    task_from_pb,
)
from blockx_server.worker.describe import (
    DEFAULT_RECENT_FAILURES,
    DEFAULT_RUNNING_TASKS,
    WorkerDescriber,
    how_many,
)
from blockx_server.worker.orchestrator import Orchestrator
from blockx_server.worker.subscriptions import (
    Converged,
    NotFound,
    Progress,
    SlotExpired,
    TaskEvent,
)


def _raise(error: Refusal) -> GRPCError:
    return status_error(WORKER_STATUS[error.code], error.message)


class WorkerService(worker_v1.WorkerServiceBase):
    def __init__(
        self, orchestrator: Orchestrator, advertise_addr: str, describer: WorkerDescriber
    ) -> None:
        self._orchestrator = orchestrator
        self._addr = advertise_addr
        self._describer = describer

    async def request_task_slot(
        self, message: worker_v1.RequestTaskSlotRequest
    ) -> worker_v1.TaskSnapshot:
        answer = self._orchestrator.request_task_slot(message.task_id, message.ttl_ms)
        if isinstance(answer, Refusal):
            raise _raise(answer)
        return worker_v1.TaskSnapshot(
            task_id=answer.task_id,
            slot_id=answer.slot_id,
            state=state_to_pb(answer.state),
            lease_deadline_ms=answer.lease_deadline_ms,
            worker_addr=self._addr,
        )

    async def submit_task(
        self, message: worker_v1.SubmitTaskRequest
    ) -> worker_v1.SubmitTaskResponse:
        offload = self._orchestrator.offload
        task = await offload.run("submit", config_chars(message), task_from_pb, message)
        if isinstance(task, Refusal):
            raise _raise(task)
        answer = self._orchestrator.submit_task(task, message.slot_id)
        if isinstance(answer, Refusal):
            raise _raise(answer)
        return worker_v1.SubmitTaskResponse(
            task_id=answer.task_id,
            state=state_to_pb(answer.state),
            slot_id=answer.slot_id,
            worker_addr=self._addr,
            result=result_to_pb(answer.result),
            input_differs=self._orchestrator.input_differs(task),
        )

    async def get_task_result(
        self, message: worker_v1.GetTaskResultRequest
    ) -> worker_v1.GetTaskResultResponse:
        answer = self._orchestrator.get_task_result(message.task_id)
        if isinstance(answer, Refusal):
            raise _raise(answer)
        return worker_v1.GetTaskResultResponse(
            task_id=answer.task_id,
            state=state_to_pb(answer.state),
            result=result_to_pb(answer.result),
        )

    async def cancel_task(
        self, message: worker_v1.CancelTaskRequest
    ) -> worker_v1.CancelTaskResponse:
        answer = self._orchestrator.cancel_task(message.task_id)
        if isinstance(answer, Refusal):
            raise _raise(answer)
        return cancel_to_pb(answer, self._addr)

    async def list_tasks(self, message: worker_v1.ListTasksRequest) -> worker_v1.ListTasksResponse:
        query = query_from_pb(message)
        if isinstance(query, Refusal):
            raise _raise(query)
        listing = self._orchestrator.list_tasks(query)
        if isinstance(listing, Refusal):
            raise _raise(listing)
        return listing_to_pb(listing, self._addr)

    async def get_call_record(
        self, message: worker_v1.GetCallRecordRequest
    ) -> worker_v1.GetCallRecordResponse:
        answer = self._orchestrator.get_call_record(message.task_id, message.call_index)
        if isinstance(answer, Refusal):
            raise _raise(answer)
        index, record = answer
        return worker_v1.GetCallRecordResponse(
            task_id=message.task_id, call_index=index, record=record
        )

    async def describe_worker(
        self, message: worker_v1.DescribeWorkerRequest
    ) -> worker_v1.DescribeWorkerResponse:
        failures = how_many(message.recent_failures, DEFAULT_RECENT_FAILURES, "recent_failures")
        if isinstance(failures, Refusal):
            raise _raise(failures)
        running = how_many(message.running_tasks, DEFAULT_RUNNING_TASKS, "running_tasks")
        if isinstance(running, Refusal):
            raise _raise(running)
        return description_to_pb(self._describer.describe(failures, running))

    async def watch_tasks(
        self, message: worker_v1.WatchTasksRequest
    ) -> AsyncIterator[worker_v1.TaskUpdate]:
        """A snapshot per task_id, then one terminal update per task still pending;
        the stream ends when all are terminal. Closing it is the unsubscribe. With
        ``progress`` the running tasks' call progress comes in between (each one
        only when it differs from what this stream last saw of the task)."""
        orchestrator = self._orchestrator
        clock = orchestrator.clock
        opened = orchestrator.open_watch(message.task_ids, progress=message.progress)
        if isinstance(opened, Refusal):
            raise _raise(opened)
        stream, subscription = opened
        try:
            for start in stream.first:
                now_ms = clock.now_ms()
                match start:
                    case WatchedTask():
                        yield self._snapshot_update(start.snapshot, now_ms, start.progress)
                    case UnknownTask():
                        yield self._update(
                            NotFound(task_id=start.task_id, timestamp_ms=now_ms), now_ms
                        )
                    case _:
                        assert_never(start)
            while stream.waiting:
                event = await subscription.queue.get()
                match event:
                    case Progress():
                        send = stream.progress(event.task_id, event.progress)
                    case Converged() | SlotExpired() | NotFound():
                        send = stream.ended(event.task_id)
                    case _:
                        assert_never(event)
                if send:
                    yield self._update(event, clock.now_ms(), progress=stream.with_progress)
        finally:
            orchestrator.close_watch(stream, subscription)

    def _snapshot_update(
        self, answer: TaskSnapshot, now_ms: int, progress: CallProgress | None = None
    ) -> worker_v1.TaskUpdate:
        return worker_v1.TaskUpdate(
            task_id=answer.task_id,
            state=state_to_pb(answer.state),
            is_terminal=answer.state.is_terminal,
            worker_addr=self._addr,
            timestamp_ms=now_ms,
            result=result_to_pb(answer.result),
            progress=progress_to_pb(progress),
        )

    def _update(
        self, event: TaskEvent, now_ms: int, *, progress: bool = False
    ) -> worker_v1.TaskUpdate:
        """``event`` encoded; a terminal update carries the task's last call counts
        only to a stream that asked for ``progress``."""
        update = functools.partial(
            worker_v1.TaskUpdate,
            task_id=event.task_id,
            worker_addr=self._addr,
            timestamp_ms=event.timestamp_ms or now_ms,
        )
        match event:
            case Converged():
                return update(
                    state=state_to_pb(event.state),
                    is_terminal=True,
                    result=result_to_pb(event.result),
                    progress=progress_to_pb(event.progress if progress else None),
                )
            case SlotExpired():
                return update(state=state_to_pb(None), is_terminal=True, error="slot_expired")
            case NotFound():
                return update(state=state_to_pb(None), is_terminal=True, error="not_found")
            case Progress():
                return update(
                    state=state_to_pb(TaskState.RUNNING),
                    is_terminal=False,
                    progress=progress_to_pb(event.progress),
                )
            case _:
                assert_never(event)
