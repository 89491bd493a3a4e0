"""WorkerCore's side of WatchTasks: opening a stream (the request checked, the first
snapshots, the run credentials), which published updates a stream sends (each
terminal once, progress only when it changed for that stream), closing it; and which
failures count against the Worker's health."""

from __future__ import annotations

import pytest

from blockx_core.errors import ErrorCode, Refusal
from blockx_core.failures import FailureCode
from blockx_core.ids import MAX_TASK_ID_BYTES, MAX_WATCH_TASK_IDS
from blockx_core.task import CANCELLED_BY_CLIENT, PluginConfig, TaskInput, TaskResult, TaskState
from blockx_core.worker import (
    WORKER_FAULTS,
    CallProgress,
    PhaseSucceeded,
    PrepareTaskActivation,
    StartBuilderPhase,
    StartWriterPhase,
    TaskConverged,
    TaskPhase,
    TaskSnapshot,
    UnknownTask,
    WatchedTask,
    WatchStream,
    WorkerConfig,
    WorkerCore,
    is_worker_fault,
)

T0 = 1_000_000
GRACE = 2_000
CFG = WorkerConfig(task_slots=4, watch_disconnect_grace_ms=GRACE)


def make_core() -> WorkerCore:
    core = WorkerCore(CFG, "inc")
    core.set_ready(True)
    return core


def submit(core: WorkerCore, task_id: str, now: int = T0) -> None:
    task = TaskInput(task_id=task_id, function_call_config=PluginConfig(type="B"))
    answer = core.handle_submit_task(task, "", now)
    assert not isinstance(answer, Refusal)
    [prepare] = answer[1]
    assert isinstance(prepare, PrepareTaskActivation)
    [start] = core.handle_task_activation_prepared(task_id, prepare.token, now)
    assert isinstance(start, StartBuilderPhase)
    core.handle_task_phase_finished(task_id, start.token, PhaseSucceeded(), now)
    assert core.task_phase(task_id) is TaskPhase.CALLS


def finish(core: WorkerCore, task_id: str, now: int) -> TaskConverged:
    """The task's calls and writer succeed."""
    token = core.phase_token(task_id)
    assert token is not None
    [start] = core.handle_task_phase_finished(task_id, token, PhaseSucceeded(), now)
    assert isinstance(start, StartWriterPhase)
    [done] = core.handle_task_phase_finished(task_id, start.token, PhaseSucceeded(), now)
    assert isinstance(done, TaskConverged)
    return done


def opened(answer: WatchStream | Refusal) -> WatchStream:
    assert isinstance(answer, WatchStream), answer
    return answer


def p(done: int) -> CallProgress:
    return CallProgress(calls_done=done, calls_total=10, total_known=True)


# ---- opening ---------------------------------------------------------------------------------

REFUSED = [
    # (task_ids, message)
    (
        [f"t{i}" for i in range(MAX_WATCH_TASK_IDS + 1)],
        f"{MAX_WATCH_TASK_IDS + 1} task_ids in one WatchTasks; at most {MAX_WATCH_TASK_IDS}",
    ),
    (["ok", ""], "task_ids: "),
    (["x" * (MAX_TASK_ID_BYTES + 1)], "task_ids: "),
]


@pytest.mark.parametrize(("task_ids", "message"), REFUSED)
def test_open_refuses_a_bad_request(task_ids: list[str], message: str) -> None:
    core = make_core()
    refused = core.handle_open_watch(task_ids, T0)
    assert isinstance(refused, Refusal)
    assert refused.code is ErrorCode.INVALID_ARGUMENT
    assert refused.message.startswith(message)


def test_repeated_task_ids_count_once() -> None:
    core = make_core()
    ids = [f"t{i}" for i in range(MAX_WATCH_TASK_IDS)] * 2
    stream = opened(core.handle_open_watch(ids, T0))
    assert stream.task_ids == tuple(dict.fromkeys(ids))
    assert len(stream.first) == MAX_WATCH_TASK_IDS


def test_the_first_updates_and_what_the_stream_waits_for() -> None:
    core = make_core()
    reserved = core.handle_request_task_slot("reserved", 5_000, T0)
    assert isinstance(reserved, TaskSnapshot)
    submit(core, "running")
    core.handle_calls_progress("running", p(3), T0)
    submit(core, "done")
    done = finish(core, "done", T0)
    ids = ["unknown", "reserved", "running", "done"]
    running = core.handle_get_task_result("running", T0)
    assert isinstance(running, TaskSnapshot)
    for progress in (False, True):
        stream = opened(core.handle_open_watch(ids, T0 + 1, progress=progress))
        assert stream.with_progress is progress
        assert stream.first == (
            UnknownTask(task_id="unknown"),
            WatchedTask(snapshot=reserved),
            WatchedTask(
                snapshot=TaskSnapshot(
                    task_id="running", slot_id=running.slot_id, state=TaskState.RUNNING
                ),
                progress=p(3) if progress else None,
            ),
            WatchedTask(
                snapshot=TaskSnapshot(
                    task_id="done",
                    slot_id=done.slot_id,
                    state=TaskState.SUCCEEDED,
                    result=done.result,
                )
            ),
        )
        assert set(stream.pending) == {"reserved", "running"}
        assert stream.waiting


# ---- what a stream sends ---------------------------------------------------------------------


def test_progress_is_sent_only_when_it_changed_for_this_stream() -> None:
    core = make_core()
    submit(core, "t1")
    core.handle_calls_progress("t1", p(3), T0)
    stream = opened(core.handle_open_watch(["t1", "t1"], T0, progress=True))
    assert not stream.progress("t1", p(3))  # the snapshot carried these counts
    assert stream.progress("t1", p(4))
    assert not stream.progress("t1", p(4))
    assert stream.progress("t1", p(5))
    assert not stream.progress("other", p(1))  # a task it does not follow
    assert stream.ended("t1")
    assert not stream.ended("t1")  # once
    assert not stream.progress("t1", p(6))  # nothing after the terminal update
    assert not stream.waiting


def test_a_stream_without_counts_sends_the_first_it_sees() -> None:
    core = make_core()
    submit(core, "t1")
    stream = opened(core.handle_open_watch(["t1"], T0, progress=True))
    [first] = stream.first
    assert isinstance(first, WatchedTask)
    assert first.progress is None  # no call has been counted yet
    assert stream.progress("t1", p(1))


def test_terminal_tasks_and_unknown_ones_are_not_waited_for() -> None:
    core = make_core()
    stream = opened(core.handle_open_watch(["nope"], T0))
    assert not stream.waiting
    assert not stream.ended("nope")


# ---- the stream as a run credential ----------------------------------------------------------


def test_open_and_close_are_the_run_credential() -> None:
    core = make_core()
    submit(core, "t1")
    stream = opened(core.handle_open_watch(["t1"], T0))
    assert core.tick_timers(T0 + 10 * GRACE) == []  # watched: no grace runs
    core.handle_close_watch(stream, T0 + 10 * GRACE)
    assert core.next_deadline_ms() == T0 + 11 * GRACE
    [_abort, lost] = core.tick_timers(T0 + 11 * GRACE)
    assert isinstance(lost, TaskConverged)
    assert lost.result.failure_code is FailureCode.WATCH_DISCONNECTED


def test_closing_a_stream_after_the_end_starts_no_grace() -> None:
    core = make_core()
    submit(core, "t1")
    stream = opened(core.handle_open_watch(["t1"], T0))
    finish(core, "t1", T0 + 1)
    assert stream.ended("t1")
    before = core.next_deadline_ms()
    core.handle_close_watch(stream, T0 + 2)
    assert core.next_deadline_ms() == before


def test_closing_one_of_two_streams_keeps_the_credential() -> None:
    core = make_core()
    submit(core, "t1")
    first = opened(core.handle_open_watch(["t1"], T0))
    second = opened(core.handle_open_watch(["t1"], T0))
    core.handle_close_watch(first, T0 + 1)
    assert core.tick_timers(T0 + 10 * GRACE) == []
    core.handle_close_watch(second, T0 + 10 * GRACE)
    assert core.next_deadline_ms() == T0 + 11 * GRACE


# ---- health ----------------------------------------------------------------------------------

FAULTS = [
    (TaskResult(success=True), False),
    *[
        (
            TaskResult(success=False, failure_code=code, retryable=True),
            code in {F.ACTIVATION_FAILED, F.IO_SCOPE_FAILED, F.CANCELLED},
        )
        for F in [FailureCode]
        for code in FailureCode
    ],
    # A client's CancelTask says nothing about the Worker.
    (
        TaskResult(
            success=False,
            failure_code=FailureCode.CANCELLED,
            retryable=False,
            failure_message=CANCELLED_BY_CLIENT,
        ),
        False,
    ),
]


@pytest.mark.parametrize(("result", "fault"), FAULTS)
def test_which_failures_count_against_the_worker(result: TaskResult, fault: bool) -> None:
    assert is_worker_fault(result) is fault


def test_the_fault_set() -> None:
    assert {
        FailureCode.ACTIVATION_FAILED,
        FailureCode.IO_SCOPE_FAILED,
        FailureCode.CANCELLED,
    } == WORKER_FAULTS
