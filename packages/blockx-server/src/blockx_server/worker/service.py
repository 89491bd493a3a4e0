"""worker.v1.WorkerService over grpclib: decode, call the Orchestrator, encode.

Admission errors become gRPC statuses through ``blockx_server.runtime.status.WORKER_STATUS``
(the inverse of the Coordinator's classification).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import assert_never

import msgspec
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from blockx_core.errors import Refusal
from blockx_core.ids import MAX_WATCH_TASK_IDS, task_id_problem
from blockx_core.task import TaskState
from blockx_core.worker import CallProgress, TaskSnapshot
from blockx_proto import worker_v1
from blockx_server.runtime.status import WORKER_STATUS
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
    return GRPCError(WORKER_STATUS[error.code], error.message)


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
        orchestrator = self._orchestrator
        listing = orchestrator.core.handle_list_tasks(query, orchestrator.clock.now_ms())
        if isinstance(listing, Refusal):
            raise _raise(listing)
        return listing_to_pb(listing, self._addr)

    async def describe_worker(
        self, message: worker_v1.DescribeWorkerRequest
    ) -> worker_v1.DescribeWorkerResponse:
        failures = how_many(message.recent_failures, DEFAULT_RECENT_FAILURES, "recent_failures")
        if isinstance(failures, Refusal):
            raise _raise(failures)
        running = how_many(message.running_tasks, DEFAULT_RUNNING_TASKS, "running_tasks")
        if isinstance(running, Refusal):
            raise _raise(running)
        return description_to_pb(self._describer.describe(failures, running), self._addr)

    async def watch_tasks(
        self, message: worker_v1.WatchTasksRequest
    ) -> AsyncIterator[worker_v1.TaskUpdate]:
        """A snapshot per task_id, then one terminal update per task still pending;
        the stream ends when all are terminal. Closing it is the unsubscribe. With
        ``progress`` the running tasks' call progress comes in between (each one
        only when it differs from what this stream last saw of the task)."""
        orchestrator = self._orchestrator
        clock = orchestrator.clock
        task_ids = list(dict.fromkeys(message.task_ids))
        if len(task_ids) > MAX_WATCH_TASK_IDS:
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"{len(task_ids)} task_ids in one WatchTasks; at most {MAX_WATCH_TASK_IDS}",
            )
        for task_id in task_ids:
            problem = task_id_problem(task_id)
            if problem is not None:
                raise GRPCError(Status.INVALID_ARGUMENT, f"task_ids: {problem}")
        with_progress = message.progress
        # Subscribe before the snapshots, so that no terminal update falls between.
        subscription = orchestrator.subscriptions.subscribe(task_ids, progress=with_progress)
        pending: set[str] = set()
        seen: dict[str, CallProgress] = {}  # the progress this stream last sent per task
        try:
            for task_id in task_ids:
                answer = orchestrator.get_task_result(task_id)
                if isinstance(answer, Refusal):
                    now_ms = clock.now_ms()
                    yield self._update(NotFound(task_id=task_id, timestamp_ms=now_ms), now_ms)
                    continue
                progress = orchestrator.core.call_progress(task_id) if with_progress else None
                if progress is not None:
                    seen[task_id] = progress
                yield self._snapshot_update(answer, clock.now_ms(), progress)
                if not answer.state.is_terminal:
                    pending.add(task_id)
                    orchestrator.watch_attached(task_id, progress=with_progress)
            while pending:
                event = await subscription.queue.get()
                if event.task_id not in pending:
                    continue
                if isinstance(event, Progress):
                    if seen.get(event.task_id) == event.progress:
                        continue
                    seen[event.task_id] = event.progress
                    yield self._update(event, clock.now_ms())
                    continue
                pending.discard(event.task_id)
                if not with_progress and isinstance(event, Converged):
                    event = msgspec.structs.replace(event, progress=None)
                yield self._update(event, clock.now_ms())
        finally:
            orchestrator.subscriptions.unsubscribe(subscription)
            for task_id in pending:
                # The stream is gone before the task ended: maybe start the watch grace.
                orchestrator.watch_detached(task_id, progress=with_progress)

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

    def _update(self, event: TaskEvent, now_ms: int) -> worker_v1.TaskUpdate:
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
                    progress=progress_to_pb(event.progress),
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
