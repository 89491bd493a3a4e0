"""WorkerCore's call progress: counts kept for ListTasks, and when the Watch streams
that asked for progress hear of them (only on change, the first at once, then at
most one per task every PROGRESS_INTERVAL_MS, coalesced; nothing for a task nobody
watches with progress).

Every test drives the core through its public handlers with explicit ``now_ms``;
nothing sleeps or reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from support import current_token, token

from blockx_core.task import PluginConfig, TaskInput, TaskState
from blockx_core.worker import (
    PROGRESS_INTERVAL_MS,
    CallProgress,
    ListTasksQuery,
    PhaseSucceeded,
    PublishProgress,
    StartCallPhase,
    TaskConverged,
    TaskListing,
    TaskPhase,
    WorkerCommand,
    WorkerConfig,
    WorkerCore,
)
from blockx_core.worker._progress import ProgressBoard

T0 = 1_000_000
IV = PROGRESS_INTERVAL_MS


def p(done: int, total: int = 10, known: bool = True, failed: int = 0) -> CallProgress:
    return CallProgress(calls_done=done, calls_total=total, total_known=known, calls_failed=failed)


# ---- the board alone: a table of (event, now_ms) -> published now -----------------------

# Each step: ("count", progress, now_ms) or ("tick", None, now_ms); with what the step
# publishes: the counts it publishes at once (count) or the due ones (tick).
BOARD_CASES: list[tuple[str, list[tuple[str, CallProgress | None, int]], list[object]]] = [
    (
        "the first change goes out at once",
        [("count", p(1), T0)],
        [p(1)],
    ),
    (
        "the same counts again are not a change",
        [("count", p(1), T0), ("count", p(1), T0 + IV)],
        [p(1), None],
    ),
    (
        "a change within the interval is held, then the latest goes out when it ends",
        [
            ("count", p(1), T0),
            ("count", p(2), T0 + 10),
            ("count", p(3), T0 + 20),
            ("tick", None, T0 + IV - 1),
            ("tick", None, T0 + IV),
        ],
        [p(1), None, None, [], [p(3)]],
    ),
    (
        "a change after the interval goes out at once",
        [("count", p(1), T0), ("count", p(2), T0 + IV)],
        [p(1), p(2)],
    ),
    (
        "a held change that goes back to the published counts is dropped",
        [("count", p(1), T0), ("count", p(2), T0 + 10), ("count", p(1), T0 + 20)],
        [p(1), None, None],
    ),
    (
        "the counts before any call finished are not published",
        [("count", p(0, 4, False), T0), ("count", p(0, 8, False), T0 + IV)],
        [None, None],
    ),
    (
        "a streaming total so far grows with the calls done",
        [("count", p(1, 4, False), T0), ("count", p(3, 8, False), T0 + IV)],
        [p(1, 4, False), p(3, 8, False)],
    ),
    (
        "every call done waits an interval for the terminal update, then goes out",
        [
            ("count", p(0, 4), T0),
            ("count", p(4, 4), T0 + 5),
            ("tick", None, T0 + 5 + IV - 1),
            ("tick", None, T0 + 5 + IV),
        ],
        [None, None, [], [p(4, 4)]],
    ),
    (
        "a failed call is a change even with nothing done",
        [("count", p(0, 4, failed=1), T0)],
        [p(0, 4, failed=1)],
    ),
]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [(steps, expected) for _, steps, expected in BOARD_CASES],
    ids=[name for name, _, _ in BOARD_CASES],
)
def test_board_publishes(
    steps: list[tuple[str, CallProgress | None, int]], expected: list[object]
) -> None:
    board = ProgressBoard()
    board.watch_attached("t1")
    got: list[object] = []
    for kind, progress, now_ms in steps:
        if kind == "count":
            assert progress is not None
            got.append(progress if board.counted("t1", progress, now_ms) else None)
        else:
            got.append([pr for _, pr in board.due(now_ms)])
    assert got == expected


def test_board_keeps_counts_but_times_nothing_without_progress_watchers() -> None:
    board = ProgressBoard()
    assert board.counted("t1", p(1), T0) is False
    assert board.counted("t1", p(2), T0 + 1) is False
    assert board.latest("t1") == p(2)
    assert board.next_due_ms() is None


def test_board_last_watcher_gone_drops_the_held_counts() -> None:
    board = ProgressBoard()
    board.watch_attached("t1")
    board.watch_attached("t1")
    assert board.counted("t1", p(1), T0)
    assert not board.counted("t1", p(2), T0 + 1)
    board.watch_detached("t1")
    assert board.next_due_ms() == T0 + IV  # one watcher is left
    board.watch_detached("t1")
    assert board.next_due_ms() is None
    board.watch_detached("t1")  # one more than attached: nothing to undo
    assert board.latest("t1") == p(2)


# ---- through WorkerCore ------------------------------------------------------------------

HANDLER = PluginConfig(type="ReturnValueResultHandler")


def core_in_calls(task_id: str = "t1", *, watch: bool | None = True) -> WorkerCore:
    """A core whose task ``task_id`` is in its Calls phase; ``watch``: a Watch with
    progress (True), without (False), or none (None) opened on it first."""
    core = WorkerCore(WorkerConfig(task_slots=2), "inc")
    core.set_ready(True)
    task = TaskInput(
        task_id=task_id,
        function_call_config=PluginConfig(type="CallListCallConfig", config="{}"),
        result_handler=HANDLER,
    )
    assert isinstance(core.handle_submit_task(task, "", T0), tuple)
    if watch is not None:
        core.watch_attached(task_id, T0, progress=watch)
    core.handle_task_activation_prepared(task_id, token(core, task_id, TaskPhase.PREPARING), T0)
    cmds = core.handle_task_phase_finished(
        task_id, token(core, task_id, TaskPhase.BUILDER), PhaseSucceeded(call_count=10), T0
    )
    assert cmds == [StartCallPhase(task_id=task_id, token=current_token(core, task_id))]
    return core


def publishes(commands: Sequence[WorkerCommand]) -> list[CallProgress]:
    return [c.progress for c in commands if isinstance(c, PublishProgress)]


def test_core_publishes_to_progress_watchers_only_on_change_and_rate_limited() -> None:
    core = core_in_calls()
    assert publishes(core.handle_calls_progress("t1", p(0), T0)) == []
    assert publishes(core.handle_calls_progress("t1", p(1), T0 + 1)) == [p(1)]
    assert publishes(core.handle_calls_progress("t1", p(1), T0 + 2)) == []
    assert publishes(core.handle_calls_progress("t1", p(3), T0 + 2)) == []
    assert core.next_deadline_ms() == T0 + 1 + IV
    assert publishes(core.tick_timers(T0 + IV)) == []
    assert publishes(core.tick_timers(T0 + 1 + IV)) == [p(3)]
    assert publishes(core.tick_timers(T0 + 2 * IV)) == []
    assert core.call_progress("t1") == p(3)


@pytest.mark.parametrize("watch", [False, None], ids=["watch-without-progress", "no-watch"])
def test_core_publishes_nothing_without_a_progress_watcher(watch: bool | None) -> None:
    core = core_in_calls(watch=watch)
    for i in range(5):
        assert publishes(core.handle_calls_progress("t1", p(i), T0 + i * IV)) == []
    assert publishes(core.tick_timers(T0 + 10 * IV)) == []
    assert core.call_progress("t1") == p(4)  # kept for ListTasks all the same


def test_core_ignores_counts_outside_the_calls_phase() -> None:
    core = WorkerCore(WorkerConfig(task_slots=1), "inc")
    core.set_ready(True)
    assert core.handle_calls_progress("nobody", p(1), T0) == []
    assert core.call_progress("nobody") is None


def test_core_terminal_carries_the_last_counts_and_listing_keeps_them() -> None:
    core = core_in_calls()
    core.handle_calls_progress("t1", p(4), T0)
    listed = core.handle_list_tasks(ListTasksQuery(), T0 + 1)
    assert isinstance(listed, TaskListing)
    running = listed.tasks[0]
    assert (running.calls_done, running.calls_total, running.calls_total_known) == (4, 10, True)
    core.handle_calls_progress("t1", p(10), T0 + 2)  # every call done: held for the terminal
    core.handle_task_phase_finished(
        "t1", token(core, "t1", TaskPhase.CALLS), PhaseSucceeded(), T0 + 3
    )
    cmds = core.handle_task_phase_finished(
        "t1", token(core, "t1", TaskPhase.WRITER), PhaseSucceeded(), T0 + 4
    )
    converged = [c for c in cmds if isinstance(c, TaskConverged)]
    assert converged[0].state is TaskState.SUCCEEDED
    assert converged[0].progress == p(10)
    assert publishes(core.tick_timers(T0 + 10 * IV)) == []  # the held update died with it
    assert core.call_progress("t1") == p(10)  # a retained task's snapshot shows them
    listed = core.handle_list_tasks(ListTasksQuery(), T0 + 5)
    assert isinstance(listed, TaskListing)
    done = listed.tasks[0]
    assert (done.calls_done, done.calls_total, done.calls_total_known) == (10, 10, True)
