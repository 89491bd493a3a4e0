"""WorkerCore.handle_list_tasks and the failure summary of every failed call.

Tasks are driven through the core's public handlers with explicit ``now_ms``; the
listing's filters, bounds and page tokens are checked against what was driven.
The dispatcher tests drive a DispatcherCore to a CALL_FAILED convergence and check
that every failed attempt (retried ones and sub-calls included) is kept, up to the
bound, with a count of the rest.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from support import token

from blockx_core.dispatch import (
    CallRetryPolicy,
    CallsFailed,
    ConvergeTaskCalls,
    DispatchConfig,
    DispatcherCore,
    SendCalls,
)
from blockx_core.errors import ErrorCode, InvalidConfig, Refusal
from blockx_core.failures import CallFailureKind, Failure, FailureCode
from blockx_core.task import (
    CALL_FAILURE_MESSAGE_CHARS,
    MAX_CALL_FAILURES,
    CallFailureSummary,
    PluginConfig,
    PluginResult,
    TaskInput,
    TaskState,
)
from blockx_core.worker import (
    MAX_PAGE_SIZE,
    ListedTask,
    ListTasksQuery,
    PhaseFailed,
    PhaseSucceeded,
    TaskListing,
    TaskPhase,
    WorkerConfig,
    WorkerCore,
)
from blockx_core.worker._listing import EXPIRED_NAME_CHARS, SCAN_BUDGET

T0 = 1_000_000
RETENTION = 10_000


def make_core(
    *, slots: int = 8, max_bytes: int = 1 << 30, tombstones: int = 100, kept: int = 1_000
) -> WorkerCore:
    core = WorkerCore(
        WorkerConfig(
            task_slots=slots,
            result_retention_ms=RETENTION,
            result_retention_max_bytes=max_bytes,
            result_tombstones_max=tombstones,
            failed_tasks_kept=kept,
        ),
        "inc",
    )
    core.set_ready(True)
    return core


def task_input(task_id: str, function: str = "echo") -> TaskInput:
    return TaskInput(
        task_id=task_id,
        function_call_config=PluginConfig(type="CallListCallConfig"),
        function=function,
    )


def submit(core: WorkerCore, task_id: str, now: int, function: str = "echo") -> None:
    answer = core.handle_submit_task(task_input(task_id, function), "", now)
    assert not isinstance(answer, Refusal), answer
    core.handle_task_activation_prepared(task_id, token(core, task_id, TaskPhase.PREPARING), now)


def succeed(core: WorkerCore, task_id: str, now: int, size: int = 10) -> None:
    core.handle_task_phase_finished(
        task_id, token(core, task_id, TaskPhase.BUILDER), PhaseSucceeded(call_count=0), now
    )
    output = PluginResult(plugin_name="ReturnValueResultHandler", success=True, result=b"x" * size)
    core.handle_task_phase_finished(
        task_id,
        token(core, task_id, TaskPhase.WRITER),
        PhaseSucceeded(plugin_results=(output,)),
        now,
    )


FAILURES = (
    CallFailureSummary(
        root_index=0, function="echo", kind=CallFailureKind.USER_ERROR, message="a", retried=True
    ),
    CallFailureSummary(
        root_index=0, function="echo", kind=CallFailureKind.USER_ERROR, message="b", attempt=2
    ),
)


def fail_calls(core: WorkerCore, task_id: str, now: int) -> None:
    core.handle_task_phase_finished(
        task_id, token(core, task_id, TaskPhase.BUILDER), PhaseSucceeded(), now
    )
    core.handle_task_phase_finished(
        task_id,
        token(core, task_id, TaskPhase.CALLS),
        PhaseFailed(
            failure=Failure(
                FailureCode.CALL_FAILED,
                "call #0 echo(1) failed after 2 attempts: USER_ERROR: b",
                False,
            ),
            call_failures=FAILURES,
            call_failures_omitted=3,
        ),
        now,
    )


def listing(core: WorkerCore, now: int, **query: Any) -> TaskListing:
    got = core.handle_list_tasks(ListTasksQuery(**query), now)
    assert isinstance(got, TaskListing), got
    return got


def ids(page: TaskListing) -> list[str]:
    return [t.task_id for t in page.tasks]


def cluster_of_four() -> WorkerCore:
    """reserved (t=0), running (t=10), succeeded (t=20), failed (t=30), by function."""
    core = make_core()
    reserved = core.handle_request_task_slot("reserved", 5_000, T0)
    assert not isinstance(reserved, Refusal)
    submit(core, "running", T0 + 10, "slow")
    submit(core, "ok", T0 + 20)
    succeed(core, "ok", T0 + 25)
    submit(core, "bad", T0 + 30, "flaky")
    fail_calls(core, "bad", T0 + 35)
    return core


def test_every_held_task_is_listed_in_the_order_first_seen() -> None:
    page = listing(cluster_of_four(), T0 + 40)
    assert page.next_page_token == ""
    assert [(t.task_id, t.state) for t in page.tasks] == [
        ("reserved", TaskState.ALLOCATED),
        ("running", TaskState.RUNNING),
        ("ok", TaskState.SUCCEEDED),
        ("bad", TaskState.FAILED),
    ]
    bad = page.tasks[3]
    assert bad == ListedTask(
        task_id="bad",
        state=TaskState.FAILED,
        slot_id=bad.slot_id,
        call_builder="CallListCallConfig",
        function="flaky",
        created_ms=T0 + 30,
        converged_ms=T0 + 35,
        failure_code=FailureCode.CALL_FAILED,
        failure_summary="call #0 echo(1) failed after 2 attempts: USER_ERROR: b",
        call_failures=5,
    )
    assert page.tasks[1].converged_ms == 0
    assert page.tasks[0].function == ""  # reserved only: no config seen yet


FILTER_CASES = [
    ({"states": frozenset({TaskState.FAILED})}, ["bad"]),
    ({"states": frozenset({TaskState.ALLOCATED, TaskState.RUNNING})}, ["reserved", "running"]),
    ({"function": "echo"}, ["ok"]),
    ({"function": "nope"}, []),
    # now = T0 + 40: first seen at least 15 ms ago / at most 15 ms ago.
    ({"min_age_ms": 15}, ["reserved", "running", "ok"]),
    ({"max_age_ms": 15}, ["bad"]),
    ({"min_age_ms": 15, "max_age_ms": 30}, ["running", "ok"]),
    ({"states": frozenset({TaskState.SUCCEEDED}), "function": "flaky"}, []),
]


@pytest.mark.parametrize(("query", "expected"), FILTER_CASES)
def test_filters(query: dict[str, Any], expected: list[str]) -> None:
    assert ids(listing(cluster_of_four(), T0 + 40, **query)) == expected


INVALID_CASES = [
    ({"states": frozenset({TaskState.NOT_FOUND})}, "NOT_FOUND"),
    ({"min_age_ms": -1}, "must be >= 0"),
    ({"max_age_ms": -5}, "must be >= 0"),
    ({"min_age_ms": 10, "max_age_ms": 5}, "no task can be both"),
    ({"page_size": -1}, "page_size"),
    ({"page_size": MAX_PAGE_SIZE + 1}, f"to {MAX_PAGE_SIZE}"),
    ({"page_token": "other:3"}, "not from this run of the worker"),
    ({"page_token": "inc:x"}, "not a token this worker gave"),
]


@pytest.mark.parametrize(("query", "says"), INVALID_CASES)
def test_invalid_queries_are_refused_with_what_to_do(query: dict[str, Any], says: str) -> None:
    got = make_core().handle_list_tasks(ListTasksQuery(**query), T0)
    assert isinstance(got, Refusal)
    assert got.code is ErrorCode.INVALID_ARGUMENT
    assert says in got.message


def test_a_huge_page_token_is_cut_in_the_refusal() -> None:
    """The message becomes the grpc-message trailer: a 50 KB token in it broke the
    connection (headers past HTTP/2's limits) instead of answering INVALID_ARGUMENT."""
    for page_token in ("x" * 50_000, "inc:" + "x" * 50_000):
        got = make_core().handle_list_tasks(ListTasksQuery(page_token=page_token), T0)
        assert isinstance(got, Refusal)
        assert got.code is ErrorCode.INVALID_ARGUMENT
        assert len(got.message) < 1_000
        assert "50004 bytes" in got.message or "50000 bytes" in got.message


def test_pages_follow_each_other_without_gaps_or_repeats() -> None:
    core = make_core(slots=2)
    for i in range(7):
        submit(core, f"t{i}", T0 + i)
        succeed(core, f"t{i}", T0 + i)
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = listing(core, T0 + 100, page_size=3, page_token=token)
        seen += ids(page)
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == [f"t{i}" for i in range(7)]
    assert pages == 3
    # A task that converges between two pages is not listed twice.
    first = listing(core, T0 + 100, page_size=2)
    submit(core, "late", T0 + 101)
    rest = listing(core, T0 + 102, page_token=first.next_page_token)
    assert ids(first) + ids(rest) == [f"t{i}" for i in range(7)] + ["late"]


def test_tombstones_are_marked_and_expired_results_are_not_listed() -> None:
    core = make_core(max_bytes=1_000)  # one small result fits, the next pushes it out
    submit(core, "old", T0)
    succeed(core, "old", T0, size=100)
    submit(core, "new", T0 + 1)
    succeed(core, "new", T0 + 1, size=100)
    page = listing(core, T0 + 2)
    assert [(t.task_id, t.tombstone) for t in page.tasks] == [("old", True), ("new", False)]
    assert listing(core, T0 + 1 + RETENTION).tasks == ()


def test_a_task_id_that_comes_back_is_listed_once_with_its_new_run() -> None:
    core = make_core()
    assert not isinstance(core.handle_request_task_slot("t", 100, T0), Refusal)
    core.tick_timers(T0 + 100)  # the reservation lapses
    submit(core, "t", T0 + 200, "again")
    page = listing(core, T0 + 300)
    assert [(t.task_id, t.function, t.created_ms) for t in page.tasks] == [("t", "again", T0 + 200)]


def test_a_page_looks_at_most_at_its_scan_budget() -> None:
    # Every held task fails the filter: the page stops at the budget with a token.
    core = make_core(slots=SCAN_BUDGET + 10)
    for i in range(SCAN_BUDGET + 5):
        assert not isinstance(core.handle_request_task_slot(f"t{i}", 60_000, T0), Refusal)
    first = listing(core, T0, function="none")
    assert first.tasks == ()
    assert first.next_page_token
    rest = listing(core, T0, function="none", page_token=first.next_page_token)
    assert (rest.tasks, rest.next_page_token) == ((), "")


def test_the_directory_forgets_what_is_no_longer_held() -> None:
    core = make_core(slots=4)
    for i in range(5_000):
        assert not isinstance(core.handle_request_task_slot(f"t{i}", 1, T0 + i), Refusal)
        core.tick_timers(T0 + i + 1)
    # Rebuilt from time to time: about twice what was held at the last rebuild, at most.
    assert len(core._directory._order) <= 2 * 4 + 1024 + 1
    assert listing(core, T0 + 10**6).tasks == ()


def test_a_failed_task_keeps_every_failure_summary() -> None:
    core = cluster_of_four()
    got = core.handle_get_task_result("bad", T0 + 40)
    assert not isinstance(got, Refusal)
    assert got.result is not None
    assert got.result.call_failures == FAILURES
    assert got.result.call_failures_omitted == 3


# ---- failed tasks outlive their results --------------------------------------------------


def test_a_failure_is_listed_as_expired_after_its_retention_and_its_id_runs_again() -> None:
    core = cluster_of_four()
    after = T0 + 35 + RETENTION
    got = core.handle_get_task_result("bad", after)
    assert isinstance(got, Refusal)
    assert got.code is ErrorCode.NOT_FOUND
    # Only when asked: existing callers see what the Worker holds, as before.
    assert "bad" not in ids(listing(core, after))
    [expired] = listing(
        core, after, include_expired=True, states=frozenset({TaskState.FAILED})
    ).tasks
    assert expired == ListedTask(
        task_id="bad",
        state=TaskState.FAILED,
        slot_id="",
        call_builder="CallListCallConfig",
        function="flaky",
        created_ms=T0 + 30,
        converged_ms=T0 + 35,
        failure_code=FailureCode.CALL_FAILED,
        failure_summary="call #0 echo(1) failed after 2 attempts: USER_ERROR: b",
        call_failures=5,
        expired=True,
    )
    # The id may run again; its new run is listed as held, the old one as expired.
    submit(core, "bad", after + 1, "flaky")
    page = listing(core, after + 2, include_expired=True)
    assert [(t.task_id, t.state, t.expired) for t in page.tasks if t.task_id == "bad"] == [
        ("bad", TaskState.FAILED, True),
        ("bad", TaskState.RUNNING, False),
    ]


def test_a_retained_failure_is_listed_once_not_as_expired() -> None:
    core = cluster_of_four()
    page = listing(core, T0 + 40, include_expired=True)
    assert [(t.task_id, t.expired) for t in page.tasks] == [
        ("reserved", False),
        ("running", False),
        ("ok", False),
        ("bad", False),
    ]
    assert page.tasks[3].retryable is False  # CALL_FAILED


EXPIRED_FILTERS = [
    ({"states": frozenset({TaskState.SUCCEEDED})}, []),
    ({"states": frozenset({TaskState.FAILED, TaskState.RUNNING})}, ["bad"]),
    ({"function": "flaky"}, ["bad"]),
    ({"function": "echo"}, []),
    ({"max_age_ms": RETENTION}, []),  # first seen longer ago than that
    ({"min_age_ms": RETENTION}, ["bad"]),
]


@pytest.mark.parametrize(("query", "expected"), EXPIRED_FILTERS)
def test_expired_failures_pass_the_same_filters(query: dict[str, Any], expected: list[str]) -> None:
    core = cluster_of_four()
    core.tick_timers(T0 + 35 + RETENTION)  # ok and bad expire; running and reserved stay
    page = listing(core, T0 + 100 + RETENTION, include_expired=True, **query)
    assert [t.task_id for t in page.tasks if t.expired] == expected


def test_only_the_last_failed_tasks_kept_are_remembered() -> None:
    core = make_core(slots=2, kept=3)
    for i in range(5):
        submit(core, f"f{i}", T0 + i)
        fail_calls(core, f"f{i}", T0 + i)
        core.tick_timers(T0 + i + RETENTION)
    page = listing(core, T0 + 10 + RETENTION, include_expired=True)
    assert [(t.task_id, t.expired) for t in page.tasks] == [
        ("f2", True),
        ("f3", True),
        ("f4", True),
    ]
    recent = core.recent_failures(2, T0 + 10 + RETENTION)
    assert [(t.task_id, t.expired) for t in recent] == [("f4", True), ("f3", True)]


def test_a_summary_keeps_bounded_names() -> None:
    core = make_core()
    submit(core, "f", T0, "x" * 10_000)
    fail_calls(core, "f", T0)
    [summary] = listing(core, T0 + RETENTION, include_expired=True).tasks
    assert summary.expired
    assert summary.function == "x" * EXPIRED_NAME_CHARS


def test_none_kept_with_zero_and_successes_are_never_kept() -> None:
    core = make_core(kept=0)
    submit(core, "f", T0)
    fail_calls(core, "f", T0)
    submit(core, "ok", T0)
    succeed(core, "ok", T0)
    assert listing(core, T0 + RETENTION, include_expired=True).tasks == ()
    assert core.recent_failures(10, T0) == []


def test_recent_failures_mark_which_results_expired() -> None:
    core = make_core()
    submit(core, "old", T0)
    fail_calls(core, "old", T0)
    submit(core, "new", T0 + RETENTION // 2)
    fail_calls(core, "new", T0 + RETENTION // 2)
    recent = core.recent_failures(10, T0 + RETENTION)
    assert [(t.task_id, t.expired) for t in recent] == [("new", False), ("old", True)]


def test_a_tombstone_forgotten_early_is_listed_as_expired() -> None:
    # Each result drops its outputs at once (over the budget); one tombstone is kept.
    core = make_core(max_bytes=600, tombstones=1)
    for i in range(2):
        submit(core, f"f{i}", T0 + i)
        fail_calls(core, f"f{i}", T0 + i)
    page = listing(core, T0 + 5, include_expired=True)
    assert [(t.task_id, t.tombstone, t.expired) for t in page.tasks] == [
        ("f0", False, True),
        ("f1", True, False),
    ]


def test_pages_go_through_expired_failures_without_gaps_or_repeats() -> None:
    core = make_core(slots=2)
    for i in range(7):
        submit(core, f"t{i}", T0 + i)
        if i % 2:
            succeed(core, f"t{i}", T0 + i)
        else:
            fail_calls(core, f"t{i}", T0 + i)
    core.tick_timers(T0 + 3 + RETENTION)  # t0 .. t3 expire
    seen: list[str] = []
    token = ""
    while True:
        page = listing(
            core, T0 + 4 + RETENTION, page_size=2, page_token=token, include_expired=True
        )
        seen += ids(page)
        token = page.next_page_token
        if not token:
            break
    assert seen == ["t0", "t2", "t4", "t5", "t6"]


def test_the_directory_stays_bounded_with_failures_kept() -> None:
    core = make_core(slots=4, kept=10)
    for i in range(3_000):
        submit(core, f"t{i}", T0 + i)
        fail_calls(core, f"t{i}", T0 + i)
        core.tick_timers(T0 + i + RETENTION)
    assert len(core._directory._order) <= 2 * (4 + 10) + 1024 + 1
    page = listing(core, T0 + 10**7, include_expired=True)
    assert ids(page) == [f"t{i}" for i in range(2_990, 3_000)]


def test_running_tasks_oldest_first_with_their_phase() -> None:
    core = cluster_of_four()
    submit(core, "later", T0 + 50, "slow")
    core.handle_task_phase_finished(
        "later", token(core, "later", TaskPhase.BUILDER), PhaseSucceeded(), T0 + 51
    )
    running = core.running_tasks(10, T0 + 60)
    assert [(r.task.task_id, r.phase, r.task.created_ms) for r in running] == [
        ("running", TaskPhase.BUILDER, T0 + 10),
        ("later", TaskPhase.CALLS, T0 + 50),
    ]
    assert [r.task.task_id for r in core.running_tasks(1, T0 + 60)] == ["running"]


def test_the_slot_peak_is_the_most_in_use_since_the_last_take() -> None:
    core = make_core(slots=4)
    for i in range(3):
        submit(core, f"t{i}", T0)
    for i in range(2):
        succeed(core, f"t{i}", T0 + 1)
    assert core.slots_peak == 3
    assert core.take_slots_peak() == 3
    assert core.take_slots_peak() == 1  # the next interval starts at what is in use


@pytest.mark.parametrize("kept", [-1, 1_000_001])
def test_failed_tasks_kept_out_of_bounds_is_refused(kept: int) -> None:
    with pytest.raises(InvalidConfig) as refused:
        WorkerConfig(failed_tasks_kept=kept).validate()
    assert refused.value.field == "failed_tasks_kept"


# ---- the dispatcher keeps each failed attempt ------------------------------------------


def dispatcher(max_attempts: int = 1) -> DispatcherCore:
    retry = CallRetryPolicy(
        max_attempts=max_attempts,
        backoff_ms=1,
        backoff_max_ms=1,
        retry_on=frozenset({CallFailureKind.USER_ERROR}),
    )
    core = DispatcherCore(DispatchConfig(retry=retry, executor_heartbeat_timeout_ms=10**12))
    assert core.executor_up("e1", 0) == []
    return core


def sent_ids(cmds: list[Any]) -> list[int]:
    return [cid for c in cmds if isinstance(c, SendCalls) for cid in c.call_ids]


def test_retried_attempts_and_failed_sub_calls_are_all_summarised() -> None:
    core = dispatcher(max_attempts=2)
    (root,) = sent_ids(core.start_task("t1", "code@1", "parent", [[1]], 0))
    (child,) = sent_ids(core.subcall_requested("e1", root, "code@1", "helper", [2], 1))
    # IO_ERROR is not retried: the parent is resumed with the failure.
    core.call_failed("e1", child, CallFailureKind.IO_ERROR, "helper broke", 2)
    out = core.call_failed("e1", root, CallFailureKind.USER_ERROR, "first try", 4)
    assert not [c for c in out if isinstance(c, ConvergeTaskCalls)]
    (again,) = sent_ids(core.tick(10))
    out = core.call_failed("e1", again, CallFailureKind.USER_ERROR, "second try", 11)
    (converged,) = [c for c in out if isinstance(c, ConvergeTaskCalls)]
    assert isinstance(converged, CallsFailed)
    assert converged.failure_code is FailureCode.CALL_FAILED
    summary = [
        (f.root_index, f.function, f.kind, f.message, f.attempt, f.retried)
        for f in converged.call_failures
    ]
    assert summary == [
        (-1, "helper", "IO_ERROR", "helper broke", 1, False),
        (0, "parent", "USER_ERROR", "first try", 1, True),
        (0, "parent", "USER_ERROR", "second try", 2, False),
    ]
    assert converged.call_failures_omitted == 0


def test_failure_summaries_are_bounded_with_a_count_of_the_rest() -> None:
    core = dispatcher()
    (root,) = sent_ids(core.start_task("t1", "code@1", "parent", [[1]], 0))
    extra = 7
    for i in range(MAX_CALL_FAILURES + extra):
        (child,) = sent_ids(core.subcall_requested("e1", root, "code@1", "helper", [i], i))
        core.call_failed("e1", child, CallFailureKind.USER_ERROR, "x" * 5_000, i)
    out = core.call_failed("e1", root, CallFailureKind.USER_ERROR, "gave up", 10**4)
    (converged,) = [c for c in out if isinstance(c, ConvergeTaskCalls)]
    assert isinstance(converged, CallsFailed)
    assert len(converged.call_failures) == MAX_CALL_FAILURES
    assert converged.call_failures_omitted == extra + 1  # the root's own failure too
    assert {len(f.message) for f in converged.call_failures} == {CALL_FAILURE_MESSAGE_CHARS}


# ---- random interleavings: the listing is exactly what the core holds ------------------


LISTING_IDS = ("a", "b", "c", "d", "e")


class ListingMachine(RuleBasedStateMachine):
    """Reserve, submit, converge, fail and let time pass in any order; after every
    step, paging through ListTasks (small pages) lists each task id the core answers
    GetTaskResult for exactly once, in its current state, and nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.core = make_core(slots=3, max_bytes=1_200, tombstones=2, kept=3)
        self.now = T0
        # When each task id's latest run was first seen, and every failed run's.
        self.runs: dict[str, int] = {}
        self.failed: list[tuple[str, int]] = []

    def _held(self, task_id: str) -> bool:
        return not isinstance(self.core.handle_get_task_result(task_id, self.now), Refusal)

    @rule(task_id=st.sampled_from(LISTING_IDS), ttl=st.integers(1, 500))
    def reserve(self, task_id: str, ttl: int) -> None:
        new_run = not self._held(task_id)
        self.core.handle_request_task_slot(task_id, ttl, self.now)
        if new_run and self._held(task_id):
            self.runs[task_id] = self.now

    @rule(task_id=st.sampled_from(LISTING_IDS))
    def submit(self, task_id: str) -> None:
        new_run = not self._held(task_id)
        answer = self.core.handle_submit_task(task_input(task_id), "", self.now)
        if not isinstance(answer, Refusal) and answer[1]:
            self.core.handle_task_activation_prepared(
                task_id, token(self.core, task_id, TaskPhase.PREPARING), self.now
            )
        if new_run and self._held(task_id):
            self.runs[task_id] = self.now

    @rule(task_id=st.sampled_from(LISTING_IDS), size=st.integers(0, 600))
    def succeed(self, task_id: str, size: int) -> None:
        if self.core.task_phase(task_id) is TaskPhase.BUILDER:
            succeed(self.core, task_id, self.now, size)

    @rule(task_id=st.sampled_from(LISTING_IDS))
    def fail(self, task_id: str) -> None:
        if self.core.task_phase(task_id) is TaskPhase.BUILDER:
            fail_calls(self.core, task_id, self.now)
            self.failed.append((task_id, self.runs[task_id]))

    @rule(ms=st.integers(1, 4_000))
    def tick(self, ms: int) -> None:
        self.now += ms
        self.core.tick_timers(self.now)

    @invariant()
    def listing_is_what_is_held(self) -> None:
        held = {}
        for task_id in LISTING_IDS:
            got = self.core.handle_get_task_result(task_id, self.now)
            if not isinstance(got, Refusal):
                held[task_id] = got.state
        for include_expired in (False, True):
            listed: list[ListedTask] = []
            token = ""
            while True:
                page = listing(
                    self.core,
                    self.now,
                    page_size=2,
                    page_token=token,
                    include_expired=include_expired,
                )
                listed += page.tasks
                token = page.next_page_token
                if not token:
                    break
            current = [(t.task_id, t.state) for t in listed if not t.expired]
            assert sorted(current) == sorted(held.items())
            # The last failed runs kept, but for one still held: each once, expired.
            expected = [
                (task_id, seen)
                for task_id, seen in self.failed[-3:]
                if not (held.get(task_id) is TaskState.FAILED and self.runs[task_id] == seen)
            ]
            expired = [(t.task_id, t.created_ms) for t in listed if t.expired]
            assert sorted(expired) == (sorted(expected) if include_expired else [])


TestListingMachine = ListingMachine.TestCase
TestListingMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
