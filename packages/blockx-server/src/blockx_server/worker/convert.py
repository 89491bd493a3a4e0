"""worker.v1 wire messages <-> core values (the only protobuf conversion of the Worker)."""

from __future__ import annotations

from typing import Final

import msgspec

from blockx_core.dispatch import ExecutorState
from blockx_core.errors import ErrorCode, Refusal
from blockx_core.task import PluginConfig, TaskInput, TaskResult, TaskState
from blockx_core.worker import (
    CallProgress,
    CancelAnswer,
    CancelOutcome,
    ListedTask,
    ListTasksQuery,
    TaskListing,
    WorkerDescription,
)
from blockx_proto import worker_v1
from blockx_server.runtime.json_bounds import check_json

_STATE: Final = {
    TaskState.ALLOCATED: worker_v1.TaskState.ALLOCATED,
    TaskState.RUNNING: worker_v1.TaskState.RUNNING,
    TaskState.SUCCEEDED: worker_v1.TaskState.SUCCEEDED,
    TaskState.FAILED: worker_v1.TaskState.FAILED,
}


_STATE_OF_PB: Final = {pb: state for state, pb in _STATE.items()}

_CANCEL_OUTCOME: Final = {
    CancelOutcome.CANCELLED: worker_v1.CancelOutcome.CANCELLED,
    CancelOutcome.FINISHED: worker_v1.CancelOutcome.FINISHED,
    CancelOutcome.WRITING: worker_v1.CancelOutcome.WRITING,
}


def state_to_pb(state: TaskState | None) -> worker_v1.TaskState:
    return worker_v1.TaskState.UNSPECIFIED if state is None else _STATE[state]


def query_from_pb(request: worker_v1.ListTasksRequest) -> ListTasksQuery | Refusal:
    """A ListTasks request as the core's query (which checks the bounds itself)."""
    states = set()
    for pb in request.states:
        state = _STATE_OF_PB.get(pb)
        if state is None:
            return Refusal(
                ErrorCode.INVALID_ARGUMENT,
                f"states: {pb!r} is not a state to list; use ALLOCATED, RUNNING, SUCCEEDED, FAILED",
            )
        states.add(state)
    return ListTasksQuery(
        states=frozenset(states),
        function=request.function,
        min_age_ms=request.min_age_ms,
        max_age_ms=request.max_age_ms,
        page_size=request.page_size,
        page_token=request.page_token,
        include_expired=request.include_expired,
    )


def listed_to_pb(t: ListedTask) -> worker_v1.ListedTask:
    return worker_v1.ListedTask(
        task_id=t.task_id,
        state=_STATE[t.state],
        slot_id=t.slot_id,
        call_builder=t.call_builder,
        function=t.function,
        chain=t.chain,
        created_ms=t.created_ms,
        converged_ms=t.converged_ms,
        failure_code=t.failure_code.value if t.failure_code else "",
        failure_summary=t.failure_summary,
        tombstone=t.tombstone,
        call_failures=t.call_failures,
        calls_done=t.calls_done,
        calls_total=t.calls_total,
        calls_total_known=t.calls_total_known,
        retryable=t.retryable,
        expired=t.expired,
    )


def listing_to_pb(listing: TaskListing, worker_addr: str) -> worker_v1.ListTasksResponse:
    return worker_v1.ListTasksResponse(
        tasks=[listed_to_pb(t) for t in listing.tasks],
        next_page_token=listing.next_page_token,
        worker_addr=worker_addr,
    )


def cancel_to_pb(answer: CancelAnswer, worker_addr: str) -> worker_v1.CancelTaskResponse:
    snapshot = answer.snapshot
    return worker_v1.CancelTaskResponse(
        task_id=snapshot.task_id,
        outcome=_CANCEL_OUTCOME[answer.outcome],
        state=state_to_pb(snapshot.state),
        result=result_to_pb(snapshot.result),
        worker_addr=worker_addr,
    )


def _executor_to_pb(executor: ExecutorState) -> worker_v1.ExecutorState:
    call = executor.running
    return worker_v1.ExecutorState(
        executor_id=executor.executor_id,
        pid=executor.pid,
        running=None
        if call is None
        else worker_v1.RunningCall(
            call_id=call.call_id,
            task_id=call.task_id,
            function=call.function,
            root_index=call.root_index,
            attempt=call.attempt,
            held_ms=call.held_ms,
            cancelled=call.cancelled,
        ),
        calls_queued=executor.calls_queued,
        calls_suspended=executor.calls_suspended,
        calls_started=executor.calls_started,
        rss_bytes=executor.rss_bytes,
        retiring=executor.retiring,
    )


def description_to_pb(d: WorkerDescription) -> worker_v1.DescribeWorkerResponse:
    waiting = d.calls_waiting
    return worker_v1.DescribeWorkerResponse(
        worker_addr=d.worker_addr,
        program=d.program,
        now_ms=d.now_ms,
        started_ms=d.started_ms,
        ready=d.ready,
        draining=d.draining,
        task_slots=d.task_slots,
        reserved_slots=d.reserved_slots,
        running_tasks=d.running_tasks,
        executors_configured=d.executors_configured,
        executors=[_executor_to_pb(e) for e in d.executors],
        executor_restarts=d.executor_restarts,
        calls_waiting=worker_v1.CallsWaiting(
            queued_on_executors=waiting.queued_on_executors,
            no_executor=waiting.no_executor,
            retry_backoff=waiting.retry_backoff,
            roots_not_dispatched=waiting.roots_not_dispatched,
        ),
        calls_in_flight=d.calls_in_flight,
        code_epoch=d.code_epoch,
        process_rss_bytes=d.process_rss_bytes,
        call_deadline_ms=d.call_deadline_ms,
        call_wall_limit_ms=d.call_wall_limit_ms,
        running=[
            worker_v1.RunningTaskState(
                task=listed_to_pb(r.task), phase=r.phase.value, deadline_ms=r.deadline_ms
            )
            for r in d.running
        ],
        recent_failures=[listed_to_pb(t) for t in d.recent_failures],
        failed_tasks_kept=d.failed_tasks_kept,
        result_retention_ms=d.result_retention_ms,
        load_interval_ms=d.load_interval_ms,
        load_series=[
            worker_v1.LoadPoint(
                start_ms=p.start_ms,
                end_ms=p.end_ms,
                slots_peak=p.slots_peak,
                calls_finished=p.calls_finished,
                tasks_failed=p.tasks_failed,
            )
            for p in d.load
        ],
    )


def progress_to_pb(progress: CallProgress | None) -> worker_v1.CallProgress | None:
    if progress is None:
        return None
    return worker_v1.CallProgress(
        calls_done=progress.calls_done,
        calls_total=progress.calls_total,
        total_known=progress.total_known,
        calls_failed=progress.calls_failed,
    )


def result_to_pb(result: TaskResult | None) -> worker_v1.TaskResult | None:
    if result is None:
        return None
    return worker_v1.TaskResult(
        success=result.success,
        execute_result=worker_v1.ExecuteResult(
            failure_code=result.failure_code.value if result.failure_code else "",
            retryable=result.retryable,
            failure_message=result.failure_message,
            plugin_results=[
                worker_v1.PluginResult(
                    plugin_name=p.plugin_name,
                    success=p.success,
                    failure_code=p.failure_code.value if p.failure_code else "",
                    result=p.result,
                    failure_message=p.failure_message,
                )
                for p in result.plugin_results
            ],
            call_failures=[
                worker_v1.CallFailureSummary(
                    root_index=f.root_index,
                    function=f.function,
                    kind=f.kind,
                    message=f.message,
                    attempt=f.attempt,
                    retried=f.retried,
                )
                for f in result.call_failures
            ],
            call_failures_omitted=result.call_failures_omitted,
        ),
    )


def _check_json(text: str, field: str) -> Refusal | None:
    # A large config is checked without building its values: it costs a scan.
    try:
        check_json(text or "{}")
    except msgspec.DecodeError as exc:
        return Refusal(ErrorCode.INVALID_ARGUMENT, f"{field} is not valid JSON: {exc}")
    return None


def config_chars(request: worker_v1.SubmitTaskRequest) -> int:
    """How much JSON ``task_from_pb`` checks (decides whether it runs on a thread)."""
    pb = request.task
    if pb is None:
        return 0
    fcc, handler = pb.function_call_config, pb.result_handler
    return len(fcc.config if fcc is not None else "") + len(
        handler.config if handler is not None else ""
    )


def task_from_pb(request: worker_v1.SubmitTaskRequest) -> TaskInput | Refusal:
    """Validate the wire task (``submitTaskFromPB`` in the specification): config must be JSON."""
    pb = request.task
    if pb is None:
        return Refusal(ErrorCode.INVALID_ARGUMENT, "task is required")
    fcc = pb.function_call_config
    if fcc is None or not fcc.type:
        return Refusal(
            ErrorCode.INVALID_ARGUMENT,
            "task.function_call_config.type is required (e.g. CallListCallConfig)",
        )
    bad = _check_json(fcc.config, "task.function_call_config.config")
    if bad is not None:
        return bad
    handler: PluginConfig | None = None
    if pb.result_handler is not None and pb.result_handler.type:
        bad = _check_json(pb.result_handler.config, "task.result_handler.config")
        if bad is not None:
            return bad
        handler = PluginConfig(type=pb.result_handler.type, config=pb.result_handler.config or "{}")
    function, chain = _function_of(fcc.config or "{}")
    return TaskInput(
        task_id=pb.task_id,
        function_call_config=PluginConfig(type=fcc.type, config=fcc.config or "{}"),
        result_handler=handler,
        task_timeout_ms=pb.task_timeout_ms,
        function=function,
        chain=chain,
    )


class _NamesFunction(msgspec.Struct):
    function: object = ""
    chain: object = ""


def _function_of(config: str) -> tuple[str, str]:
    """The root function and the chain a builder config names (its "function" and
    "chain" keys), for ListTasks. Checked already to be JSON; decoding two keys skips
    the rest without building it."""
    try:
        named = msgspec.json.decode(config, type=_NamesFunction)
    except msgspec.DecodeError:
        return "", ""  # not an object: the builder says what is wrong with it
    function = named.function if isinstance(named.function, str) else ""
    return function, named.chain if isinstance(named.chain, str) else ""
