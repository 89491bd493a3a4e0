"""The client's only protobuf conversion: public models to wire messages and back."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final

from msgspec.structs import replace

from blockx_client.errors import BlockxError
from blockx_client.models import (
    CallFailureSummary,
    CallProgress,
    CallsWaiting,
    Cancellation,
    CancelOutcome,
    Durations,
    ExecutorState,
    Invocation,
    IoTrace,
    ListedTask,
    LoadPoint,
    PlacementReport,
    PluginOutput,
    Precheck,
    RecentRefusal,
    RefusedWorker,
    RunningCall,
    RunningTask,
    Task,
    TaskPhase,
    TaskResult,
    TaskState,
    TaskUpdate,
    WorkerDescription,
    WorkerEligibility,
)
from blockx_core.call_record import CallRecord, InvalidRecord, decode_record
from blockx_core.failures import CallFailureKind, FailureCode, PrecheckFailure, call_failure_kind
from blockx_proto import coordinator_v1, syncinvoker_v1, worker_v1

_STATES: Final[dict[worker_v1.TaskState, TaskState]] = {
    worker_v1.TaskState.ALLOCATED: TaskState.ALLOCATED,
    worker_v1.TaskState.RUNNING: TaskState.RUNNING,
    worker_v1.TaskState.SUCCEEDED: TaskState.SUCCEEDED,
    worker_v1.TaskState.FAILED: TaskState.FAILED,
}


_STATES_TO_PB: Final = {client: pb for pb, client in _STATES.items()}

# The states of a task a Worker has accepted (SubmitTask passed).
_ACCEPTED: Final = frozenset({TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED})


def task_to_pb(task: Task) -> worker_v1.TaskInput:
    handler = task.result_handler
    return worker_v1.TaskInput(
        task_id=task.task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type=task.function_call_config.type,
            config=task.function_call_config.config_text(),
        ),
        result_handler=(
            worker_v1.ResultHandler(type=handler.type, config=handler.config_text())
            if handler is not None
            else None
        ),
        task_timeout_ms=task.task_timeout_ms,
    )


_CANCEL_OUTCOMES: Final = {
    worker_v1.CancelOutcome.CANCELLED: CancelOutcome.CANCELLED,
    worker_v1.CancelOutcome.FINISHED: CancelOutcome.FINISHED,
    worker_v1.CancelOutcome.WRITING: CancelOutcome.WRITING,
}


def cancellation_from_pb(
    reply: worker_v1.CancelTaskResponse, task_id: str, worker_addr: str
) -> Cancellation:
    addr = reply.worker_addr or worker_addr
    result = result_from_pb(task_id, reply.state, reply.result, addr)
    outcome = _CANCEL_OUTCOMES.get(reply.outcome)
    if outcome is None:
        # A Worker newer than this client: say what it answered rather than guess.
        raise BlockxError(f"{addr} answered CancelTask with an unknown outcome {reply.outcome!r}")
    return Cancellation(
        task_id=task_id,
        worker_addr=addr,
        outcome=outcome,
        state=result.state,
        result=result if result.state.is_terminal else None,
    )


def states_to_pb(states: Iterable[TaskState]) -> list[worker_v1.TaskState]:
    """NOT_FOUND (what a client calls a task no Worker holds) goes out as
    UNSPECIFIED, which a Worker refuses as a state to list."""
    return [_STATES_TO_PB.get(s, worker_v1.TaskState.UNSPECIFIED) for s in states]


def state_from_pb(state: worker_v1.TaskState) -> TaskState:
    """UNSPECIFIED (a task the worker does not know) reads as NOT_FOUND."""
    return _STATES.get(state, TaskState.NOT_FOUND)


# Read only: what a TaskResult without an execute_result reads as.
_NO_EXECUTE_RESULT: Final = worker_v1.ExecuteResult()


def result_from_pb(
    task_id: str,
    state: worker_v1.TaskState,
    pb: worker_v1.TaskResult | None,
    worker_addr: str = "",
    error: str = "",
) -> TaskResult:
    # ``is None``, not truthiness: a betterproto2 message's ``bool`` compares every
    # field with its default. An absent result reads as an empty one.
    er = pb.execute_result if pb is not None else None
    if er is None:
        er = _NO_EXECUTE_RESULT
    client_state = state_from_pb(state)
    return TaskResult(
        task_id=task_id,
        state=client_state,
        worker_addr=worker_addr,
        success=pb is not None and pb.success,
        failure_code=_failure_code(er.failure_code),
        failure_message=er.failure_message,
        retryable=er.retryable,
        plugin_results=tuple(
            PluginOutput(
                plugin_name=p.plugin_name,
                success=p.success,
                failure_code=_failure_code(p.failure_code),
                failure_message=p.failure_message,
                result=p.result,
            )
            for p in er.plugin_results
        ),
        error=error,
        may_have_run=client_state in _ACCEPTED,
        call_failures=tuple(
            CallFailureSummary(
                root_index=f.root_index,
                function=f.function,
                kind=call_failure_kind(f.kind),
                message=f.message,
                attempt=f.attempt,
                retried=f.retried,
            )
            for f in er.call_failures
        ),
        call_failures_omitted=er.call_failures_omitted,
    )


def _failure_code(wire: str) -> FailureCode | None:
    """A Worker's failure code (of a task, a listed task, a plugin); "" is none. A
    code this client does not know (a newer Worker's) is read as none rather than
    refusing the whole answer: its message (``failure_message``, a listed task's
    ``failure_summary``) still says what failed, and ``retryable`` is the Worker's."""
    try:
        return FailureCode(wire) if wire else None
    except ValueError:
        return None


def listed_from_pb(pb: worker_v1.ListedTask, worker_addr: str) -> ListedTask:
    return ListedTask(
        task_id=pb.task_id,
        state=state_from_pb(pb.state),
        worker_addr=worker_addr,
        function=pb.function,
        call_builder=pb.call_builder,
        slot_id=pb.slot_id,
        created_ms=pb.created_ms,
        converged_ms=pb.converged_ms,
        failure_code=_failure_code(pb.failure_code),
        failure_summary=pb.failure_summary,
        tombstone=pb.tombstone,
        call_failures=pb.call_failures,
        calls_done=pb.calls_done,
        calls_total=pb.calls_total,
        calls_total_known=pb.calls_total_known,
        retryable=pb.retryable,
        expired=pb.expired,
        chain=pb.chain,
    )


def _executor_from_pb(pb: worker_v1.ExecutorState) -> ExecutorState:
    call = pb.running
    return ExecutorState(
        executor_id=pb.executor_id,
        pid=pb.pid,
        running=None
        if call is None
        else RunningCall(
            call_id=call.call_id,
            task_id=call.task_id,
            function=call.function,
            root_index=call.root_index,
            attempt=call.attempt,
            held_ms=call.held_ms,
            cancelled=call.cancelled,
        ),
        calls_queued=pb.calls_queued,
        calls_suspended=pb.calls_suspended,
        calls_started=pb.calls_started,
        rss_bytes=pb.rss_bytes,
        retiring=pb.retiring,
    )


def _phase(wire: str, worker_addr: str) -> TaskPhase:
    try:
        return TaskPhase(wire)
    except ValueError:
        # A Worker newer than this client: say what it answered rather than guess.
        raise BlockxError(f"{worker_addr} described a task in an unknown phase {wire!r}") from None


def description_from_pb(
    reply: worker_v1.DescribeWorkerResponse, worker_addr: str
) -> WorkerDescription:
    addr = reply.worker_addr or worker_addr
    waiting = reply.calls_waiting or worker_v1.CallsWaiting()
    return WorkerDescription(
        worker_addr=addr,
        program=reply.program,
        now_ms=reply.now_ms,
        started_ms=reply.started_ms,
        ready=reply.ready,
        draining=reply.draining,
        task_slots=reply.task_slots,
        reserved_slots=reply.reserved_slots,
        running_tasks=reply.running_tasks,
        executors_configured=reply.executors_configured,
        executors=tuple(_executor_from_pb(e) for e in reply.executors),
        executor_restarts=reply.executor_restarts,
        calls_waiting=CallsWaiting(
            queued_on_executors=waiting.queued_on_executors,
            no_executor=waiting.no_executor,
            retry_backoff=waiting.retry_backoff,
            roots_not_dispatched=waiting.roots_not_dispatched,
        ),
        calls_in_flight=reply.calls_in_flight,
        code_epoch=reply.code_epoch,
        process_rss_bytes=reply.process_rss_bytes,
        call_deadline_ms=reply.call_deadline_ms,
        call_wall_limit_ms=reply.call_wall_limit_ms,
        running=tuple(
            RunningTask(
                task=listed_from_pb(r.task or worker_v1.ListedTask(), addr),
                phase=_phase(r.phase, addr),
                deadline_ms=r.deadline_ms,
            )
            for r in reply.running
        ),
        recent_failures=tuple(listed_from_pb(t, addr) for t in reply.recent_failures),
        failed_tasks_kept=reply.failed_tasks_kept,
        result_retention_ms=reply.result_retention_ms,
        load_interval_ms=reply.load_interval_ms,
        load=tuple(
            LoadPoint(
                start_ms=p.start_ms,
                end_ms=p.end_ms,
                slots_peak=p.slots_peak,
                calls_finished=p.calls_finished,
                tasks_failed=p.tasks_failed,
            )
            for p in reply.load_series
        ),
    )


def update_from_pb(update: worker_v1.TaskUpdate) -> TaskUpdate:
    result = None
    if update.is_terminal:
        result = result_from_pb(
            update.task_id, update.state, update.result, update.worker_addr, update.error
        )
    return TaskUpdate(
        task_id=update.task_id,
        state=state_from_pb(update.state),
        is_terminal=update.is_terminal,
        worker_addr=update.worker_addr,
        timestamp_ms=update.timestamp_ms,
        error=update.error,
        result=result,
        progress=progress_from_pb(update.progress),
    )


def progress_from_pb(pb: worker_v1.CallProgress | None) -> CallProgress | None:
    if pb is None:
        return None
    return CallProgress(
        calls_done=pb.calls_done,
        calls_total=pb.calls_total,
        total_known=pb.total_known,
        calls_failed=pb.calls_failed,
    )


def args_to_pb(args: tuple[Any, ...]) -> str:
    """A call's positional arguments as the Sync Invoker takes them: a JSON array."""
    return json.dumps(list(args))


def _invoke_failure(wire: str) -> CallFailureKind | FailureCode | None:
    """An invoke's failure code: its call's kind, else the run's; "" is none, and so
    is a code this client does not know (a newer server's), as ``_failure_code``."""
    if not wire:
        return None
    try:
        return CallFailureKind(wire)
    except ValueError:
        return _failure_code(wire)


def _precheck_failure(wire: str) -> PrecheckFailure | None:
    """A precheck's failure; "" is none, and so is a failure this client does not know."""
    try:
        return PrecheckFailure(wire) if wire else None
    except ValueError:
        return None


def invocation_from_pb(reply: syncinvoker_v1.InvokeResponse) -> Invocation:
    durations = reply.durations or syncinvoker_v1.CallDurations()
    return Invocation(
        call_id=reply.call_id,
        success=reply.success,
        value=json.loads(reply.result) if reply.success and reply.result else None,
        failure_code=_invoke_failure(reply.failure_code),
        failure_message=reply.failure_message,
        retryable=reply.retryable,
        durations=Durations(
            queue_us=durations.queue_us, cpu_us=durations.cpu_us, io_us=durations.io_us
        ),
        code_epoch=reply.code_epoch,
    )


def debug_invocation_from_pb(reply: syncinvoker_v1.DebugInvokeResponse) -> Invocation:
    base = invocation_from_pb(reply.response or syncinvoker_v1.InvokeResponse())
    return replace(
        base,
        output=reply.output,
        record=record_from_pb(reply.call_record) if reply.call_record else None,
        io_trace=tuple(
            IoTrace(
                backend=t.backend,
                op=t.op,
                request=t.request,
                duration_us=t.duration_us,
                success=t.success,
                error=t.error,
                cached=t.cached,
                shared=t.shared,
                queue_us=t.queue_us,
            )
            for t in reply.io_trace
        ),
    )


def precheck_from_pb(reply: syncinvoker_v1.PrecheckResponse) -> Precheck:
    return Precheck(
        ok=reply.ok,
        failure_code=_precheck_failure(reply.failure_code),
        message=reply.message,
        signature=reply.signature,
        is_async=reply.is_async,
        code_epoch=reply.code_epoch,
    )


def placement_report_from_pb(
    addr: str, reply: coordinator_v1.ExplainPlacementResponse
) -> PlacementReport:
    return PlacementReport(
        coordinator=addr,
        view_trusted=reply.view_trusted,
        not_ready_reason=reply.not_ready_reason,
        now_ms=reply.now_ms,
        workers=tuple(
            WorkerEligibility(
                worker_addr=w.worker_addr,
                eligible=w.eligible,
                kind=w.kind,
                reason=w.reason,
                task_slots=w.task_slots,
                used_slots=w.used_slots,
                cpu_fraction=w.cpu_fraction,
                memory_fraction=w.memory_fraction,
                error_rate=w.error_rate,
                heartbeat_age_ms=w.heartbeat_age_ms,
                breaker_remaining_ms=w.breaker_remaining_ms,
                recent_failures=w.recent_failures,
            )
            for w in reply.workers
        ),
        recent_refusals=tuple(
            RecentRefusal(
                task_id=r.task_id,
                at_ms=r.at_ms,
                code=r.code,
                message=r.message,
                workers=tuple(
                    RefusedWorker(worker_addr=w.worker_addr, kind=w.kind, reason=w.reason)
                    for w in r.workers
                ),
                omitted=r.omitted,
            )
            for r in reply.recent_refusals
        ),
    )


def record_from_pb(data: bytes) -> CallRecord:
    """A call record as a server sent it; BlockxError when it is none this client
    reads (a newer server's format)."""
    try:
        return decode_record(data)
    except InvalidRecord as exc:
        raise BlockxError(f"the server sent a call record this client cannot read: {exc}") from None
