"""The Worker encodes and the client decodes ListTasks and DescribeWorker into the
same core values (``ListedTask``, ``WorkerDescription``): a value the Worker sends
reads back equal on the client, every field set, so the two sides cannot drift
apart when a field is added to one of them. The one difference is the client's:
it names the Worker that holds each listed task. A task's result reads back with
the same failure codes (the Worker's ``FailureCode``, None where there is none)."""

from __future__ import annotations

import msgspec
import pytest

from blockx_client._convert import description_from_pb, listed_from_pb, result_from_pb
from blockx_client.models import PluginOutput
from blockx_core.dispatch import CallsWaiting, ExecutorState, RunningCall
from blockx_core.failures import FailureCode
from blockx_core.load_series import LoadPoint
from blockx_core.task import PluginResult, TaskResult, TaskState
from blockx_core.worker import ListedTask, RunningTask, TaskPhase, WorkerDescription
from blockx_proto import worker_v1
from blockx_server.worker.convert import description_to_pb, listed_to_pb, result_to_pb

ADDR = "127.0.0.1:7001"

FAILED = ListedTask(
    task_id="t-failed",
    state=TaskState.FAILED,
    slot_id="s-1",
    call_builder="CallListCallConfig",
    function="boom",
    created_ms=1_000,
    converged_ms=2_000,
    chain="mainnet",
    failure_code=FailureCode.CALL_FAILED,
    failure_summary="ValueError: boom",
    tombstone=True,
    call_failures=3,
    calls_done=4,
    calls_total=9,
    calls_total_known=True,
    retryable=True,
    expired=True,
)
RUNNING = ListedTask(
    task_id="t-running",
    state=TaskState.RUNNING,
    slot_id="s-2",
    call_builder="CallListCallConfig",
    function="slow",
    created_ms=3_000,
    converged_ms=0,
    calls_done=1,
    calls_total=2,
)


def _held_by(task: ListedTask) -> ListedTask:
    return msgspec.structs.replace(task, worker_addr=ADDR)


@pytest.mark.parametrize("task", [FAILED, RUNNING], ids=["failed", "running"])
def test_a_listed_task_reads_back_as_the_worker_listed_it(task: ListedTask) -> None:
    assert listed_from_pb(listed_to_pb(task), ADDR) == _held_by(task)


def test_a_code_this_client_does_not_know_reads_as_none() -> None:
    pb = listed_to_pb(FAILED)
    pb.failure_code = "A_NEWER_WORKERS_CODE"
    assert listed_from_pb(pb, ADDR).failure_code is None


FAILED_RESULT = TaskResult(
    success=False,
    failure_code=FailureCode.PLUGIN_FAILED,
    retryable=True,
    failure_message="the writer failed",
    plugin_results=(
        PluginResult(plugin_name="ReturnValueResultHandler", success=True, result=b"[1]"),
        PluginResult(
            plugin_name="SqlWriter",
            success=False,
            failure_code=FailureCode.PLUGIN_FAILED,
            failure_message="the writer failed",
        ),
    ),
)


@pytest.mark.parametrize(
    "sent",
    [FAILED_RESULT, TaskResult(success=True)],
    ids=["failed", "succeeded"],
)
def test_a_task_result_reads_back_with_the_workers_codes(sent: TaskResult) -> None:
    state = worker_v1.TaskState.SUCCEEDED if sent.success else worker_v1.TaskState.FAILED
    read = result_from_pb("t", state, result_to_pb(sent), ADDR)
    assert (read.success, read.failure_code, read.retryable, read.failure_message) == (
        sent.success,
        sent.failure_code,
        sent.retryable,
        sent.failure_message,
    )
    assert [
        (p.plugin_name, p.success, p.failure_code, p.failure_message, p.result)
        for p in read.plugin_results
    ] == [
        (p.plugin_name, p.success, p.failure_code, p.failure_message, p.result)
        for p in sent.plugin_results
    ]


def test_a_plugin_output_has_the_fields_of_the_workers_plugin_result() -> None:
    def fields(struct: type[msgspec.Struct]) -> set[tuple[str, object]]:
        return {(f.name, f.type) for f in msgspec.structs.fields(struct)}

    assert fields(PluginOutput) == fields(PluginResult)


def test_a_result_code_this_client_does_not_know_reads_as_none() -> None:
    pb = result_to_pb(FAILED_RESULT)
    assert pb is not None
    assert pb.execute_result is not None
    pb.execute_result.failure_code = "A_NEWER_WORKERS_CODE"
    pb.execute_result.plugin_results[1].failure_code = "A_NEWER_WORKERS_CODE"
    read = result_from_pb("t", worker_v1.TaskState.FAILED, pb, ADDR)
    assert (read.state, read.failure_code, read.failure_message, read.retryable) == (
        TaskState.FAILED,
        None,
        "the writer failed",
        True,
    )
    assert read.plugin_results[1].failure_code is None
    assert read.plugin_results[1].failure_message == "the writer failed"


def _description(*, running: RunningTask) -> WorkerDescription:
    return WorkerDescription(
        worker_addr=ADDR,
        program="blockx-worker",
        now_ms=10_000,
        started_ms=4_000,
        ready=True,
        draining=True,
        task_slots=8,
        reserved_slots=2,
        running_tasks=1,
        executors_configured=2,
        executors=(
            ExecutorState(
                executor_id="x0.1",
                pid=42,
                running=RunningCall(
                    call_id=7,
                    task_id="t-running",
                    function="slow",
                    root_index=1,
                    attempt=2,
                    held_ms=900,
                    cancelled=True,
                ),
                calls_queued=3,
                calls_suspended=4,
                calls_started=5,
                rss_bytes=6,
                retiring=True,
            ),
            ExecutorState(
                executor_id="x1.1",
                running=None,
                calls_queued=0,
                calls_suspended=0,
                calls_started=0,
                rss_bytes=0,
            ),
        ),
        executor_restarts=1,
        calls_waiting=CallsWaiting(
            queued_on_executors=1, no_executor=2, retry_backoff=3, roots_not_dispatched=4
        ),
        calls_in_flight=5,
        code_epoch=6,
        process_rss_bytes=7,
        call_deadline_ms=8,
        call_wall_limit_ms=9,
        running=(running,),
        recent_failures=(FAILED,),
        failed_tasks_kept=10,
        result_retention_ms=11,
        load_interval_ms=12,
        load=(
            LoadPoint(start_ms=0, end_ms=10, slots_peak=1, calls_finished=2, tasks_failed=3),
            LoadPoint(start_ms=10, end_ms=20, slots_peak=4, calls_finished=5, tasks_failed=6),
        ),
    )


@pytest.mark.parametrize("phase", [p for p in TaskPhase if p is not TaskPhase.TERMINAL])
def test_a_description_reads_back_as_the_worker_described_itself(phase: TaskPhase) -> None:
    sent = _description(running=RunningTask(task=RUNNING, phase=phase, deadline_ms=20_000))
    read = description_from_pb(description_to_pb(sent), "another-name-for-it:1")
    assert read == msgspec.structs.replace(
        sent,
        running=(RunningTask(task=_held_by(RUNNING), phase=phase, deadline_ms=20_000),),
        recent_failures=(_held_by(FAILED),),
    )
    assert read.executors_busy == 1
