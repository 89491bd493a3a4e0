"""WorkerCore: the Worker's slot table, admission, the three phases, results, timers.

Every test drives the core through its public handlers with explicit ``now_ms``
integers and asserts on the answers and commands it returns; nothing sleeps or
reads a clock. Slot ids are never hard-coded: they are read back from the
snapshots the core answers. The authority is the specification's task lifecycle
(slots and admission, the three phases, results and Watch, timing) and issue 4.

CancelTask (a BlockX addition) has its own section at the end. The
random-interleaving test lives in test_core_worker_stateful.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import current_token, token

from blockx_core.errors import BlockxUsageError, ErrorCode, InvalidConfig, Refusal
from blockx_core.failures import CallFailureKind, Failure, FailureCode
from blockx_core.ids import MAX_TASK_ID_BYTES
from blockx_core.task import (
    CANCELLED_BY_CLIENT,
    PluginConfig,
    PluginResult,
    TaskInput,
    TaskResult,
    TaskState,
    cancelled_by_client,
)
from blockx_core.worker import (
    AbortTaskWork,
    CancelAnswer,
    CancelOutcome,
    InvalidTransition,
    PhaseCrashed,
    PhaseFailed,
    PhaseOutcome,
    PhaseSucceeded,
    PrepareTaskActivation,
    SlotExpired,
    SlotState,
    StartBuilderPhase,
    StartCallPhase,
    StartWriterPhase,
    TaskConverged,
    TaskPhase,
    TaskSnapshot,
    WorkerCommand,
    WorkerConfig,
    WorkerCore,
)
from blockx_core.worker._config import HOUR_MS
from blockx_core.worker._slots import _SLOT_TRANSITIONS, Slot
from blockx_core.worker._task_book import _PHASE_TRANSITIONS, Task
from blockx_core.worker._types import (
    Activate,
    Allocate,
    Built,
    BuiltNothing,
    CallsDone,
    Cancelled,
    Converge,
    Failed,
    LeaseExpired,
    LeaseLost,
    PhaseEvent,
    Prepared,
    SlotEvent,
    TimedOut,
    WatchLost,
    WriterStarted,
    Written,
)

T0 = 1_000_000
SLOTS = 2
TTL = 1_000  # the ttl_ms of explicit reservations in these tests
DEFAULT_TTL = 5_000
TASK_DEADLINE = 300_000
MAX_TIMEOUT = 8 * HOUR_MS
RETENTION = 300_000
GRACE = 2_000

CFG = WorkerConfig(task_slots=SLOTS)
WATCHED = WorkerConfig(task_slots=SLOTS, watch_disconnect_grace_ms=GRACE)

FREE = SlotState.FREE
ALLOCATED = SlotState.ALLOCATED
RUNNING = SlotState.RUNNING

PREPARING = TaskPhase.PREPARING
BUILDER = TaskPhase.BUILDER
CALLS = TaskPhase.CALLS
WRITER = TaskPhase.WRITER
TERMINAL = TaskPhase.TERMINAL

OK = PhaseSucceeded()
HANDLER = PluginConfig(type="ReturnValueResultHandler")
PLUGIN_OK = PluginResult(plugin_name="ReturnValueResultHandler", success=True, result=b'["ok"]')


# ---- helpers ---------------------------------------------------------------------------


def make_core(config: WorkerConfig = CFG, *, incarnation: str = "inc-a") -> WorkerCore:
    core = WorkerCore(config, incarnation)
    core.set_ready(True)
    return core


def task_input(
    task_id: str = "t1", *, timeout_ms: int = 0, handler: PluginConfig | None = HANDLER
) -> TaskInput:
    return TaskInput(
        task_id=task_id,
        function_call_config=PluginConfig(
            type="CallListCallConfig", config='{"function": "f", "callList": [[1]]}'
        ),
        result_handler=handler,
        task_timeout_ms=timeout_ms,
    )


def snap(result: TaskSnapshot | Refusal) -> TaskSnapshot:
    assert isinstance(result, TaskSnapshot), result
    return result


def error(result: object) -> Refusal:
    assert isinstance(result, Refusal), result
    return result


def submitted(
    result: tuple[TaskSnapshot, list[WorkerCommand]] | Refusal,
) -> tuple[TaskSnapshot, list[WorkerCommand]]:
    assert not isinstance(result, Refusal), result
    return result


def reserve(core: WorkerCore, task_id: str = "t1", *, ttl: int = TTL, now: int = T0) -> str:
    """RequestTaskSlot that must allocate; returns the slot_id."""
    s = snap(core.handle_request_task_slot(task_id, ttl, now))
    assert s.state is TaskState.ALLOCATED
    return s.slot_id


def submit(
    core: WorkerCore,
    task_id: str = "t1",
    *,
    slot_id: str | None = None,
    now: int = T0,
    timeout_ms: int = 0,
    handler: PluginConfig | None = HANDLER,
) -> str:
    """Reserve (unless given a slot_id) and submit a new task; returns the slot_id."""
    if slot_id is None:
        slot_id = reserve(core, task_id, now=now)
    task = task_input(task_id, timeout_ms=timeout_ms, handler=handler)
    snapshot, cmds = submitted(core.handle_submit_task(task, slot_id, now))
    assert snapshot == TaskSnapshot(task_id=task_id, slot_id=slot_id, state=TaskState.RUNNING)
    assert len(cmds) == 1
    assert isinstance(cmds[0], PrepareTaskActivation)
    return slot_id


def advance_to(core: WorkerCore, task_id: str, phase: TaskPhase, *, now: int = T0) -> None:
    """Move a PREPARING task through successful round trips until it is in ``phase``."""
    assert core.task_phase(task_id) is PREPARING
    if phase is PREPARING:
        return
    assert core.handle_task_activation_prepared(task_id, token(core, task_id, PREPARING), now) == [
        StartBuilderPhase(task_id=task_id, token=current_token(core, task_id))
    ]
    if phase is BUILDER:
        return
    assert core.handle_task_phase_finished(task_id, token(core, task_id, BUILDER), OK, now) == [
        StartCallPhase(task_id=task_id, token=current_token(core, task_id))
    ]
    if phase is CALLS:
        return
    assert core.handle_task_phase_finished(task_id, token(core, task_id, CALLS), OK, now) == [
        StartWriterPhase(task_id=task_id, token=current_token(core, task_id))
    ]
    assert phase is WRITER


def start(core: WorkerCore, task_id: str = "t1", phase: TaskPhase = BUILDER, **kw: Any) -> str:
    """Reserve, submit and advance a task to ``phase``; returns the slot_id."""
    slot_id = submit(core, task_id, **kw)
    advance_to(core, task_id, phase, now=kw.get("now", T0))
    return slot_id


def converged(cmds: Sequence[WorkerCommand]) -> TaskConverged:
    [cmd] = [c for c in cmds if isinstance(c, TaskConverged)]
    return cmd


def succeed(core: WorkerCore, task_id: str = "t1", *, now: int = T0) -> TaskConverged:
    start(core, task_id, WRITER, now=now)
    outcome = PhaseSucceeded(plugin_results=(PLUGIN_OK,))
    cmds = core.handle_task_phase_finished(task_id, token(core, task_id, WRITER), outcome, now)
    assert len(cmds) == 1
    return converged(cmds)


def counts(core: WorkerCore) -> tuple[int, int]:
    """(reservedSlots, runningTasks) of the heartbeat, checked against slot_states()."""
    slots, reserved, running = core.derive_heartbeat()
    states = core.slot_states()
    assert slots == core.config.task_slots == len(states)
    assert (reserved, running) == (states.count(ALLOCATED), states.count(RUNNING))
    return reserved, running


# ---- the slot transition table ---------------------------------------------------------

ALLOWED = [
    # (state, event, next state)
    (FREE, Allocate(), ALLOCATED),
    (ALLOCATED, Activate(), RUNNING),
    (ALLOCATED, LeaseExpired(), FREE),
    (ALLOCATED, Converge(), FREE),  # activation failed / SLOT_LOST while PREPARING
    (RUNNING, Converge(), FREE),
]
EVENTS: list[SlotEvent] = [Allocate(), Activate(), LeaseExpired(), Converge()]
ILLEGAL = [
    (state, event)
    for state in SlotState
    for event in EVENTS
    if not any(state is s and type(event) is type(e) for s, e, _ in ALLOWED)
]


def test_transition_table_is_exactly_the_allowed_rows() -> None:
    assert dict(_SLOT_TRANSITIONS) == {(s, type(e)): n for s, e, n in ALLOWED}
    assert len(ILLEGAL) == len(SlotState) * len(EVENTS) - len(ALLOWED) == 7


@pytest.mark.parametrize(("state", "event", "expected"), ALLOWED)
def test_allowed_slot_transition(state: SlotState, event: SlotEvent, expected: SlotState) -> None:
    slot = Slot(0)
    slot.state = state
    slot.apply(event)
    assert slot.state is expected


@pytest.mark.parametrize(("state", "event"), ILLEGAL)
def test_illegal_slot_transition_raises_and_keeps_state(state: SlotState, event: SlotEvent) -> None:
    slot = Slot(3)
    slot.state = state
    with pytest.raises(InvalidTransition, match=type(event).__name__):
        slot.apply(event)
    assert slot.state is state


# ---- the task phase transition table -----------------------------------------------------

PHASE_ALLOWED = [
    # (phase, event, next phase)
    (PREPARING, Prepared(), BUILDER),
    (PREPARING, LeaseLost(), TERMINAL),
    (BUILDER, Built(), CALLS),
    (BUILDER, BuiltNothing(), WRITER),  # an empty call list skips the Calls phase
    (CALLS, CallsDone(), WRITER),
    (WRITER, WriterStarted(), WRITER),
    (WRITER, Written(), TERMINAL),
    *[
        (phase, end, TERMINAL)
        for phase in (PREPARING, BUILDER, CALLS, WRITER)
        for end in (Failed(), TimedOut(), Cancelled(), WatchLost())
    ],
]
PHASE_EVENTS: list[PhaseEvent] = [
    Prepared(),
    Built(),
    BuiltNothing(),
    CallsDone(),
    WriterStarted(),
    Written(),
    Failed(),
    TimedOut(),
    Cancelled(),
    WatchLost(),
    LeaseLost(),
]
PHASE_ILLEGAL = [
    (phase, event)
    for phase in TaskPhase
    for event in PHASE_EVENTS
    if not any(phase is p and type(event) is type(e) for p, e, _ in PHASE_ALLOWED)
]


def a_task(phase: TaskPhase) -> Task:
    slot = Slot(0, "s-0", "t1")
    task = Task(task_input("t1"), slot, T0 + TASK_DEADLINE, 1)
    task.phase = phase
    return task


def test_phase_table_is_exactly_the_allowed_rows() -> None:
    assert dict(_PHASE_TRANSITIONS) == {(p, type(e)): n for p, e, n in PHASE_ALLOWED}
    assert len(PHASE_ALLOWED) == 23
    assert len(PHASE_ILLEGAL) == len(TaskPhase) * len(PHASE_EVENTS) - len(PHASE_ALLOWED) == 32
    # Nothing leaves TERMINAL.
    assert not any(p is TERMINAL for p, _ in _PHASE_TRANSITIONS)


@pytest.mark.parametrize(("phase", "event", "expected"), PHASE_ALLOWED)
def test_allowed_phase_transition(phase: TaskPhase, event: PhaseEvent, expected: TaskPhase) -> None:
    task = a_task(phase)
    assert task.apply(event) is phase
    assert task.phase is expected


@pytest.mark.parametrize(("phase", "event"), PHASE_ILLEGAL)
def test_illegal_phase_transition_raises_and_keeps_phase(
    phase: TaskPhase, event: PhaseEvent
) -> None:
    task = a_task(phase)
    with pytest.raises(InvalidTransition, match=type(event).__name__):
        task.apply(event)
    assert task.phase is phase


@given(st.lists(st.sampled_from(PHASE_EVENTS), max_size=12))
def test_any_event_sequence_follows_the_table(events: list[PhaseEvent]) -> None:
    """Whatever comes in, a task only ever moves along a row of the table; an illegal
    event leaves it where it was."""
    task = a_task(PREPARING)
    for event in events:
        before = task.phase
        target = _PHASE_TRANSITIONS.get((before, type(event)))
        if target is None:
            with pytest.raises(InvalidTransition):
                task.apply(event)
            assert task.phase is before
        else:
            task.apply(event)
            assert task.phase is target


# ---- activation tokens -------------------------------------------------------------------


def test_each_activation_gets_a_new_greater_token() -> None:
    core = make_core()
    submit(core)
    tokens = [current_token(core, "t1")]
    for phase in (BUILDER, CALLS, WRITER):
        answer = token(core, "t1", core.task_phase("t1") or PREPARING)
        if phase is BUILDER:
            cmds = core.handle_task_activation_prepared("t1", answer, T0)
        else:
            cmds = core.handle_task_phase_finished("t1", answer, OK, T0)
        [started] = cmds
        assert isinstance(started, (StartBuilderPhase, StartCallPhase, StartWriterPhase))
        assert started.token == current_token(core, "t1")
        tokens.append(started.token)
    assert tokens == sorted(set(tokens))
    # WriterStarted goes on within the Writer phase: no new activation.
    assert core.handle_writer_started("t1", tokens[-1], T0) == []
    assert current_token(core, "t1") == tokens[-1]


@pytest.mark.parametrize("phase", [PREPARING, BUILDER, CALLS, WRITER])
def test_an_earlier_phases_token_is_refused(phase: TaskPhase) -> None:
    """An answer carrying the token of an activation the task has left changes nothing,
    whatever it says."""
    core = make_core()
    submit(core)
    stale = [current_token(core, "t1")]
    advance_to(core, "t1", phase)
    stale.append(current_token(core, "t1") - 1)  # never the current one
    stale = [t for t in stale if t != current_token(core, "t1")]
    before = counts(core)
    for old in stale:
        assert core.handle_task_activation_prepared("t1", old, T0) == []
        assert core.handle_task_activation_failed("t1", old, F.ACTIVATION_FAILED, "x", T0) == []
        assert core.handle_task_phase_finished("t1", old, OK, T0) == []
        assert core.handle_task_phase_finished("t1", old, PhaseCrashed(message="x"), T0) == []
        assert core.handle_plugin_not_found("t1", old, "none", T0) == []
        assert core.handle_writer_started("t1", old, T0) == []
    assert core.task_phase("t1") is phase
    assert counts(core) == before


def test_an_answer_for_an_earlier_submission_of_the_task_id_is_refused() -> None:
    """A task_id submitted again after its result expired runs anew; what the first
    run's phases still answer (same task_id, same phase) is refused by its token."""
    core = make_core(WorkerConfig(task_slots=SLOTS, result_retention_ms=1_000))
    submit(core)
    advance_to(core, "t1", BUILDER)
    first = current_token(core, "t1")
    core.tick_timers(T0 + TASK_DEADLINE)  # the first run times out
    core.tick_timers(T0 + TASK_DEADLINE + 1_000)  # and its result expires
    now = T0 + TASK_DEADLINE + 1_001
    submit(core, now=now)
    advance_to(core, "t1", BUILDER, now=now)
    assert current_token(core, "t1") != first
    assert core.handle_task_phase_finished("t1", first, OK, now) == []
    assert core.task_phase("t1") is BUILDER
    assert core.handle_task_phase_finished("t1", current_token(core, "t1"), OK, now) == [
        StartCallPhase(task_id="t1", token=current_token(core, "t1"))
    ]


# ---- WorkerConfig ----------------------------------------------------------------------


def test_config_defaults_are_the_specifications() -> None:
    cfg = WorkerConfig()
    assert (
        cfg.task_slots,
        cfg.default_ttl_ms,
        cfg.task_deadline_ms,
        cfg.max_task_timeout_ms,
        cfg.result_retention_ms,
        cfg.watch_disconnect_grace_ms,
    ) == (50, 5_000, 300_000, 8 * 3_600_000, 300_000, 0)
    cfg.validate()


VALID_CONFIGS = [
    WorkerConfig(),
    WorkerConfig(task_slots=1, default_ttl_ms=1, task_deadline_ms=1, max_task_timeout_ms=1),
    WorkerConfig(result_retention_ms=1, watch_disconnect_grace_ms=0),
    WorkerConfig(watch_disconnect_grace_ms=120_000),
    WorkerConfig(task_deadline_ms=MAX_TIMEOUT, max_task_timeout_ms=MAX_TIMEOUT),
]


@pytest.mark.parametrize("cfg", VALID_CONFIGS)
def test_config_valid(cfg: WorkerConfig) -> None:
    cfg.validate()
    assert WorkerCore(cfg, "i").config is cfg


INVALID_CONFIGS = [
    # (fields, offending field)
    ({"task_slots": 0}, "task_slots"),
    ({"task_slots": -1}, "task_slots"),
    ({"default_ttl_ms": 0}, "default_ttl_ms"),
    ({"task_deadline_ms": 0}, "task_deadline_ms"),
    ({"task_deadline_ms": -5}, "task_deadline_ms"),
    ({"max_task_timeout_ms": 0}, "max_task_timeout_ms"),
    ({"result_retention_ms": 0}, "result_retention_ms"),
    ({"watch_disconnect_grace_ms": -1}, "watch_disconnect_grace_ms"),
    ({"task_deadline_ms": 1_001, "max_task_timeout_ms": 1_000}, "task_deadline_ms"),
]


@pytest.mark.parametrize(("fields", "field"), INVALID_CONFIGS)
def test_config_invalid(fields: dict[str, int], field: str) -> None:
    cfg = WorkerConfig(**fields)
    with pytest.raises(InvalidConfig) as info:
        cfg.validate()
    assert info.value.field == field
    with pytest.raises(InvalidConfig):
        WorkerCore(cfg, "i")


# ---- effective_task_deadline_ms ----------------------------------------------------------

EFFECTIVE = [
    # (task_timeout_ms, expected timeout or error)
    (-1, ErrorCode.INVALID_ARGUMENT),
    (-MAX_TIMEOUT, ErrorCode.INVALID_ARGUMENT),
    (MAX_TIMEOUT + 1, ErrorCode.INVALID_ARGUMENT),
    (0, TASK_DEADLINE),
    (1, 1),
    (12_345, 12_345),
    (TASK_DEADLINE + 1, TASK_DEADLINE + 1),
    (MAX_TIMEOUT, MAX_TIMEOUT),
]


@pytest.mark.parametrize(("timeout", "expected"), EFFECTIVE)
def test_effective_task_deadline(timeout: int, expected: int | ErrorCode) -> None:
    got = make_core().effective_task_deadline_ms(timeout)
    if isinstance(expected, ErrorCode):
        err = error(got)
        assert err.code is expected
        assert str(timeout) in err.message
    else:
        assert got == expected


@pytest.mark.parametrize(("timeout", "effective"), [(0, TASK_DEADLINE), (1_000, 1_000)])
def test_deadline_is_counted_from_when_the_worker_accepts(timeout: int, effective: int) -> None:
    core = make_core()
    slot_id = reserve(core, now=T0)  # reserving earlier does not start the clock
    accepted = T0 + 700
    task = task_input(timeout_ms=timeout)
    _, cmds = submitted(core.handle_submit_task(task, slot_id, accepted))
    assert cmds == [
        PrepareTaskActivation(
            task_id="t1",
            task=task,
            deadline_ms=accepted + effective,
            token=current_token(core, "t1"),
        )
    ]
    assert core.task_deadline_ms("t1") == accepted + effective


# ---- handle_request_task_slot -------------------------------------------------------------

REQUEST_ERRORS = [
    # (task_id, ttl_ms, ready, draining, expected code); input errors come first
    ("t1", 0, True, False, ErrorCode.INVALID_ARGUMENT),
    ("t1", -1, True, False, ErrorCode.INVALID_ARGUMENT),
    ("", TTL, True, False, ErrorCode.INVALID_ARGUMENT),
    ("t1", 0, False, True, ErrorCode.INVALID_ARGUMENT),
    ("", TTL, False, True, ErrorCode.INVALID_ARGUMENT),
    ("t1", TTL, False, False, ErrorCode.UNAVAILABLE),
    ("t1", TTL, True, True, ErrorCode.UNAVAILABLE),
    ("t1", TTL, False, True, ErrorCode.UNAVAILABLE),
]


@pytest.mark.parametrize(("task_id", "ttl", "ready", "draining", "code"), REQUEST_ERRORS)
def test_request_slot_errors(
    task_id: str, ttl: int, ready: bool, draining: bool, code: ErrorCode
) -> None:
    core = make_core()
    core.set_ready(ready)
    if draining:
        core.start_draining()
    err = error(core.handle_request_task_slot(task_id, ttl, T0))
    assert err.code is code
    assert err.message
    assert counts(core) == (0, 0)
    assert core.next_deadline_ms() is None


def test_request_slot_allocates_under_a_lease() -> None:
    core = make_core()
    s = snap(core.handle_request_task_slot("t1", TTL, T0))
    assert s.task_id == "t1"
    assert s.slot_id
    assert s.state is TaskState.ALLOCATED
    assert s.lease_deadline_ms == T0 + TTL
    assert s.result is None
    assert counts(core) == (1, 0)
    assert core.next_deadline_ms() == T0 + TTL
    assert core.active_task_ids() == []  # reserved, not submitted


def test_request_slot_no_capacity() -> None:
    core = make_core()
    reserve(core, "t1")
    start(core, "t2")  # one reserved, one running: the pool is full
    assert counts(core) == (1, 1)
    err = error(core.handle_request_task_slot("t3", TTL, T0))
    assert err.code is ErrorCode.NO_SLOT
    assert counts(core) == (1, 1)
    assert isinstance(core.handle_get_task_result("t3", T0), Refusal)


@pytest.mark.parametrize("phase", [None, PREPARING, BUILDER, CALLS, WRITER])
def test_request_slot_is_idempotent_while_allocated_or_running(phase: TaskPhase | None) -> None:
    core = make_core()
    slot_id = reserve(core, now=T0)
    if phase is not None:
        submit(core, slot_id=slot_id, now=T0 + 1)
        advance_to(core, "t1", phase, now=T0 + 1)
    before = counts(core)
    again = snap(core.handle_request_task_slot("t1", 5 * TTL, T0 + 2))
    assert again.slot_id == slot_id
    assert again.state is (TaskState.ALLOCATED if phase is None else TaskState.RUNNING)
    if phase in (None, PREPARING):
        assert again.lease_deadline_ms == T0 + TTL  # the same lease, not extended
    assert counts(core) == before


def test_same_slot_index_reallocated_gets_a_new_slot_id() -> None:
    core = make_core(WorkerConfig(task_slots=1))
    first = reserve(core, "t1", now=T0)
    assert core.tick_timers(T0 + TTL) == [SlotExpired(task_id="t1", slot_id=first)]
    second = reserve(core, "t1", now=T0 + TTL)
    assert second != first
    # The slot was converged and reused once more: a third distinct id.
    submit(core, "t1", slot_id=second, now=T0 + TTL)
    core.handle_task_activation_failed(
        "t1", token(core, "t1", PREPARING), FailureCode.ACTIVATION_FAILED, "x", T0 + TTL
    )
    third = reserve(core, "t2", now=T0 + TTL)
    assert len({first, second, third}) == 3
    # The stale ids are rejected even though the same slot index is ALLOCATED again.
    for stale, task_id in ((first, "t2"), (second, "t2"), (first, "t3"), (second, "t3")):
        err = error(core.handle_submit_task(task_input(task_id), stale, T0 + TTL))
        assert err.code is ErrorCode.INVALID_SLOT


def test_slot_ids_differ_across_incarnations() -> None:
    old = make_core(incarnation="boot-1")
    new = make_core(incarnation="boot-2")
    old_id = reserve(old, "t1")
    new_id = reserve(new, "t1")
    assert old_id != new_id
    # After a restart, a slot_id issued by the previous incarnation is invalid,
    # even though the same task_id holds the same slot index in the new one.
    err = error(new.handle_submit_task(task_input("t1"), old_id, T0))
    assert err.code is ErrorCode.INVALID_SLOT
    assert old_id in err.message
    assert new.task_phase("t1") is None


def test_request_slot_with_retained_result_answers_the_terminal_snapshot() -> None:
    core = make_core()
    done = succeed(core, now=T0)
    s = snap(core.handle_request_task_slot("t1", TTL, T0 + 10))
    assert s == TaskSnapshot(
        task_id="t1", slot_id=done.slot_id, state=TaskState.SUCCEEDED, result=done.result
    )
    assert counts(core) == (0, 0)  # no new allocation
    assert core.next_deadline_ms() == T0 + RETENTION


@pytest.mark.parametrize("tick", [True, False])
def test_request_slot_after_result_expired_allocates_a_new_slot(tick: bool) -> None:
    core = make_core()
    done = succeed(core, now=T0)
    later = T0 + RETENTION
    if tick:
        assert core.tick_timers(later) == []
    s = snap(core.handle_request_task_slot("t1", TTL, later))
    assert s.state is TaskState.ALLOCATED
    assert s.slot_id != done.slot_id
    assert s.result is None
    assert counts(core) == (1, 0)
    # ... and a second execution may run on it.
    submit(core, slot_id=s.slot_id, now=later)


@pytest.mark.parametrize("first", ["t1", "t2"])
def test_two_requests_racing_for_the_last_slot(first: str) -> None:
    core = make_core()
    reserve(core, "t0")  # one of the two slots is taken
    second = "t2" if first == "t1" else "t1"
    answers = [core.handle_request_task_slot(t, TTL, T0) for t in (first, second)]
    winners = [a for a in answers if isinstance(a, TaskSnapshot)]
    losers = [a for a in answers if isinstance(a, Refusal)]
    assert len(winners) == 1
    assert winners[0].task_id == first
    assert [e.code for e in losers] == [ErrorCode.NO_SLOT]
    assert counts(core) == (2, 0)


# ---- handle_submit_task ------------------------------------------------------------------


def test_submit_new_task_answers_running_with_one_prepare() -> None:
    core = make_core()
    slot_id = reserve(core)
    task = task_input(timeout_ms=60_000)
    snapshot, cmds = submitted(core.handle_submit_task(task, slot_id, T0 + 5))
    assert snapshot == TaskSnapshot(task_id="t1", slot_id=slot_id, state=TaskState.RUNNING)
    assert cmds == [
        PrepareTaskActivation(
            task_id="t1", task=task, deadline_ms=T0 + 5 + 60_000, token=current_token(core, "t1")
        )
    ]
    assert core.task_phase("t1") is PREPARING
    assert core.active_task_ids() == ["t1"]


SUBMIT_ERRORS = [
    # (name, task, ready, draining, slot, code): slot is "own", "other" (another task's
    # reservation), "none" or a literal slot_id. The specification's order: input errors, then
    # ready/draining, then slot checks.
    ("empty task_id", task_input(""), True, False, "none", ErrorCode.INVALID_ARGUMENT),
    ("empty id, not ready", task_input(""), False, True, "own", ErrorCode.INVALID_ARGUMENT),
    ("negative timeout", task_input(timeout_ms=-1), True, False, "own", ErrorCode.INVALID_ARGUMENT),
    (
        "timeout above max, draining",
        task_input(timeout_ms=MAX_TIMEOUT + 1),
        True,
        True,
        "own",
        ErrorCode.INVALID_ARGUMENT,
    ),
    (
        "bad timeout, bad slot",
        task_input(timeout_ms=-1),
        True,
        False,
        "nope",
        ErrorCode.INVALID_ARGUMENT,
    ),
    ("not ready", task_input(), False, False, "own", ErrorCode.UNAVAILABLE),
    ("draining", task_input(), True, True, "own", ErrorCode.UNAVAILABLE),
    ("draining, bad slot", task_input(), True, True, "nope", ErrorCode.UNAVAILABLE),
    ("unknown slot", task_input(), True, False, "nope", ErrorCode.INVALID_SLOT),
    ("another task's slot", task_input(), True, False, "other", ErrorCode.INVALID_SLOT),
]


@pytest.mark.parametrize(
    ("task", "ready", "draining", "slot", "code"),
    [case[1:] for case in SUBMIT_ERRORS],
    ids=[case[0] for case in SUBMIT_ERRORS],
)
def test_submit_errors(
    task: TaskInput, ready: bool, draining: bool, slot: str, code: ErrorCode
) -> None:
    core = make_core()
    own = reserve(core, "t1")
    other = reserve(core, "t2")
    slot_id = {"own": own, "other": other, "none": ""}.get(slot, slot)
    core.set_ready(ready)
    if draining:
        core.start_draining()
    err = error(core.handle_submit_task(task, slot_id, T0))
    assert err.code is code
    assert err.message
    # Nothing changed: both reservations are still there, nothing was submitted.
    assert counts(core) == (2, 0)
    assert core.active_task_ids() == []
    assert snap(core.handle_get_task_result("t1", T0)).state is TaskState.ALLOCATED
    assert snap(core.handle_get_task_result("t2", T0)).state is TaskState.ALLOCATED


INVALID_SLOT_CASES = [
    # (how the slot went wrong, what the message must mention)
    ("unknown", "does not exist"),
    ("another task", "another task"),
    ("expired", "does not exist"),
    ("converged", "does not exist"),
]


@pytest.mark.parametrize(("case", "mention"), INVALID_SLOT_CASES)
def test_submit_invalid_slot_has_a_message(case: str, mention: str) -> None:
    core = make_core(WorkerConfig(task_slots=3))
    now = T0
    if case == "unknown":
        slot_id = "inc-a-0-99"
    elif case == "another task":
        slot_id = reserve(core, "t2")
    elif case == "expired":
        slot_id = reserve(core, "t1")
        now = T0 + TTL
        assert core.tick_timers(now) == [SlotExpired(task_id="t1", slot_id=slot_id)]
    else:
        # The slot of t0's finished execution; t1 presents it.
        slot_id = succeed(core, "t0").slot_id
    err = error(core.handle_submit_task(task_input("t1"), slot_id, now))
    assert err.code is ErrorCode.INVALID_SLOT
    assert slot_id in err.message
    assert mention in err.message
    assert core.task_phase("t1") is None


@pytest.mark.parametrize("phase", [PREPARING, BUILDER, CALLS, WRITER])
@pytest.mark.parametrize("slot", ["own", "none", "bogus"])
def test_submit_same_task_while_running_never_starts_a_second_execution(
    phase: TaskPhase, slot: str
) -> None:
    core = make_core()
    slot_id = start(core, "t1", phase)
    before = counts(core)
    presented = {"own": slot_id, "none": "", "bogus": "not-a-slot"}[slot]
    for now in (T0, T0 + 1, T0 + 2):
        snapshot, cmds = submitted(core.handle_submit_task(task_input("t1"), presented, now))
        assert snapshot == TaskSnapshot(task_id="t1", slot_id=slot_id, state=TaskState.RUNNING)
        assert cmds == []
    assert core.task_phase("t1") is phase
    assert counts(core) == before


@pytest.mark.parametrize("slot", ["old", "none", "bogus"])
def test_submit_with_retained_result_answers_it(slot: str) -> None:
    core = make_core()
    done = succeed(core, now=T0)
    presented = {"old": done.slot_id, "none": "", "bogus": "not-a-slot"}[slot]
    snapshot, cmds = submitted(core.handle_submit_task(task_input("t1"), presented, T0 + 50))
    assert snapshot == TaskSnapshot(
        task_id="t1", slot_id=done.slot_id, state=TaskState.SUCCEEDED, result=done.result
    )
    assert cmds == []
    assert counts(core) == (0, 0)
    assert core.active_task_ids() == []


def test_submit_retained_failed_result_answers_failed() -> None:
    core = make_core()
    start(core, "t1", BUILDER)
    failure = PhaseFailed(failure=Failure(FailureCode.BUILDER_NOT_FOUND, "m", False))
    done = converged(core.handle_task_phase_finished("t1", token(core, "t1", BUILDER), failure, T0))
    snapshot, cmds = submitted(core.handle_submit_task(task_input("t1"), "", T0 + 1))
    assert (snapshot.state, snapshot.result, cmds) == (TaskState.FAILED, done.result, [])


def test_submit_without_slot_reserves_inline_with_default_ttl() -> None:
    core = make_core()
    task = task_input()
    snapshot, cmds = submitted(core.handle_submit_task(task, "", T0))
    assert snapshot.state is TaskState.RUNNING
    assert snapshot.slot_id
    assert cmds == [
        PrepareTaskActivation(
            task_id="t1", task=task, deadline_ms=T0 + TASK_DEADLINE, token=current_token(core, "t1")
        )
    ]
    assert counts(core) == (1, 0)  # ALLOCATED while PREPARING
    assert core.next_deadline_ms() == T0 + DEFAULT_TTL
    # The inline lease is DefaultTTLMs: it runs out at T0 + 5000.
    assert core.tick_timers(T0 + DEFAULT_TTL - 1) == []
    lost = converged(core.tick_timers(T0 + DEFAULT_TTL))
    assert lost.result.failure_code is FailureCode.SLOT_LOST


def test_submit_without_slot_uses_the_existing_reservation() -> None:
    core = make_core()
    slot_id = reserve(core, "t1", now=T0)
    snapshot, cmds = submitted(core.handle_submit_task(task_input(), "", T0 + 1))
    assert snapshot.slot_id == slot_id
    assert len(cmds) == 1
    assert counts(core) == (1, 0)
    assert core.next_deadline_ms() == T0 + TTL  # the reservation's lease, not a new one


def test_submit_without_slot_when_full_is_no_slot() -> None:
    core = make_core()
    reserve(core, "t1")
    start(core, "t2")
    err = error(core.handle_submit_task(task_input("t3"), "", T0))
    assert err.code is ErrorCode.NO_SLOT
    assert counts(core) == (1, 1)
    assert error(core.handle_get_task_result("t3", T0)).code is ErrorCode.NOT_FOUND


def test_submit_another_tasks_slot_leaves_it_reserved() -> None:
    core = make_core()
    other = reserve(core, "t2")
    assert error(core.handle_submit_task(task_input("t1"), other, T0)).code is (
        ErrorCode.INVALID_SLOT
    )
    # t2 can still use its slot.
    submit(core, "t2", slot_id=other)


# ---- the PREPARING window ------------------------------------------------------------------


def test_preparing_keeps_the_slot_allocated_until_activation_prepared() -> None:
    core = make_core()
    slot_id = submit(core, now=T0)
    assert core.task_phase("t1") is PREPARING
    assert core.slot_states().count(ALLOCATED) == 1
    assert counts(core) == (1, 0)  # reserved, not running
    assert snap(core.handle_get_task_result("t1", T0)).state is TaskState.RUNNING
    assert core.handle_task_activation_prepared("t1", token(core, "t1", PREPARING), T0 + 3) == [
        StartBuilderPhase(task_id="t1", token=current_token(core, "t1"))
    ]
    assert core.task_phase("t1") is BUILDER
    assert counts(core) == (0, 1)
    assert snap(core.handle_get_task_result("t1", T0 + 3)).slot_id == slot_id
    # The lease no longer matters once RUNNING: only the task deadline is pending.
    assert core.next_deadline_ms() == T0 + TASK_DEADLINE
    assert core.tick_timers(T0 + TTL) == []
    assert core.task_phase("t1") is BUILDER
    # A duplicate activation-prepared is ignored.
    assert core.handle_task_activation_prepared("t1", token(core, "t1", PREPARING), T0 + 4) == []
    assert core.task_phase("t1") is BUILDER


def test_lease_expiry_while_preparing_is_slot_lost() -> None:
    core = make_core()
    slot_id = reserve(core, ttl=100, now=T0)
    submit(core, slot_id=slot_id, now=T0 + 10)
    assert core.next_deadline_ms() == T0 + 100
    assert core.tick_timers(T0 + 99) == []
    cmds = core.tick_timers(T0 + 100)
    # The activation being prepared is stopped before the task converges.
    assert [type(c) for c in cmds] == [AbortTaskWork, TaskConverged]
    assert cmds[0] == AbortTaskWork(task_id="t1")
    lost = converged(cmds)
    assert lost.task_id == "t1"
    assert lost.slot_id == slot_id
    assert lost.state is TaskState.FAILED
    assert lost.result.success is False
    assert lost.result.failure_code is FailureCode.SLOT_LOST
    assert lost.result.retryable is True
    assert lost.result.failure_message
    assert core.slot_states() == [FREE, FREE]
    assert counts(core) == (0, 0)
    # An activation-prepared that arrives afterwards is ignored.
    assert core.handle_task_activation_prepared("t1", token(core, "t1", PREPARING), T0 + 101) == []
    assert core.task_phase("t1") is None
    assert counts(core) == (0, 0)
    got = snap(core.handle_get_task_result("t1", T0 + 101))
    assert (got.state, got.result) == (TaskState.FAILED, lost.result)


@pytest.mark.parametrize("code", [FailureCode.ACTIVATION_FAILED, FailureCode.IO_SCOPE_FAILED])
def test_activation_failed(code: FailureCode) -> None:
    core = make_core()
    slot_id = submit(core)
    cmds = core.handle_task_activation_failed(
        "t1", token(core, "t1", PREPARING), code, "epoch not found", T0 + 1
    )
    assert cmds == [
        TaskConverged(
            task_id="t1",
            slot_id=slot_id,
            state=TaskState.FAILED,
            result=TaskResult(
                success=False, failure_code=code, retryable=True, failure_message="epoch not found"
            ),
        )
    ]
    assert core.slot_states() == [FREE, FREE]  # ALLOCATED → FREE
    assert core.handle_task_activation_prepared("t1", token(core, "t1", PREPARING), T0 + 2) == []
    assert snap(core.handle_get_task_result("t1", T0 + 2)).state is TaskState.FAILED


@pytest.mark.parametrize("phase", [BUILDER, CALLS, WRITER])
def test_activation_answers_after_activation_are_ignored(phase: TaskPhase) -> None:
    core = make_core()
    start(core, "t1", phase)
    before = counts(core)
    assert (
        core.handle_task_activation_failed(
            "t1", token(core, "t1", PREPARING), FailureCode.ACTIVATION_FAILED, "x", T0
        )
        == []
    )
    assert core.handle_task_activation_prepared("t1", token(core, "t1", PREPARING), T0) == []
    assert core.task_phase("t1") is phase
    assert counts(core) == before


def test_activation_answers_for_unknown_tasks_are_ignored() -> None:
    core = make_core()
    reserve(core, "t1")  # reserved but never submitted
    assert core.handle_task_activation_prepared("t1", token(core, "t1", PREPARING), T0) == []
    assert (
        core.handle_task_activation_failed(
            "t1", token(core, "t1", PREPARING), FailureCode.IO_SCOPE_FAILED, "x", T0
        )
        == []
    )
    assert core.handle_task_activation_prepared("nope", token(core, "nope", PREPARING), T0) == []
    assert counts(core) == (1, 0)
    assert snap(core.handle_get_task_result("t1", T0)).state is TaskState.ALLOCATED


# ---- the three phases ----------------------------------------------------------------------


@pytest.mark.parametrize("handler", [HANDLER, None])
def test_phases_succeed_in_order(handler: PluginConfig | None) -> None:
    core = make_core()
    slot_id = submit(core, handler=handler)
    assert core.handle_task_activation_prepared("t1", token(core, "t1", PREPARING), T0) == [
        StartBuilderPhase(task_id="t1", token=current_token(core, "t1"))
    ]
    assert core.handle_task_phase_finished("t1", token(core, "t1", BUILDER), OK, T0 + 1) == [
        StartCallPhase(task_id="t1", token=current_token(core, "t1"))
    ]
    assert core.task_phase("t1") is CALLS
    # The writer phase always follows Calls, with or without a result handler.
    assert core.handle_task_phase_finished("t1", token(core, "t1", CALLS), OK, T0 + 2) == [
        StartWriterPhase(task_id="t1", token=current_token(core, "t1"))
    ]
    assert core.task_phase("t1") is WRITER
    plugin_results = (PLUGIN_OK,) if handler is not None else ()
    outcome = PhaseSucceeded(plugin_results=plugin_results)
    result = TaskResult(success=True, plugin_results=plugin_results)
    assert core.handle_task_phase_finished("t1", token(core, "t1", WRITER), outcome, T0 + 3) == [
        TaskConverged(task_id="t1", slot_id=slot_id, state=TaskState.SUCCEEDED, result=result)
    ]
    assert core.task_phase("t1") is None
    assert snap(core.handle_get_task_result("t1", T0 + 3)).result == result


F = FailureCode
PHASE_FAILURES = [
    # (phase, outcome failure_code, outcome retryable, expected code, expected retryable)
    (BUILDER, F.BUILDER_NOT_FOUND, True, F.BUILDER_NOT_FOUND, False),
    (BUILDER, F.BUILDER_FAILED, False, F.BUILDER_FAILED, False),
    (BUILDER, F.BUILDER_FAILED, True, F.BUILDER_FAILED, True),
    # No code: the phase crashed (PhaseCrashed), the phase's own code applies.
    (BUILDER, None, True, F.BUILDER_FAILED, True),
    (BUILDER, F.CANCELLED, False, F.CANCELLED, True),
    (CALLS, F.CALL_FAILED, True, F.CALL_FAILED, False),
    (CALLS, F.OUTPUT_BYTES_EXCEEDED, True, F.OUTPUT_BYTES_EXCEEDED, False),
    (CALLS, None, True, F.CALL_FAILED, False),
    (CALLS, F.CANCELLED, False, F.CANCELLED, True),
    (WRITER, F.PLUGIN_NOT_FOUND, True, F.PLUGIN_NOT_FOUND, False),
    (WRITER, F.PLUGIN_FAILED, True, F.PLUGIN_FAILED, True),
    (WRITER, F.PLUGIN_FAILED, False, F.PLUGIN_FAILED, False),
    (WRITER, None, True, F.PLUGIN_FAILED, True),
    (WRITER, F.CANCELLED, False, F.CANCELLED, True),
]


@pytest.mark.parametrize(
    ("phase", "code", "outcome_retryable", "expected_code", "expected_retryable"), PHASE_FAILURES
)
def test_phase_failure(
    phase: TaskPhase,
    code: FailureCode | None,
    outcome_retryable: bool,
    expected_code: FailureCode,
    expected_retryable: bool,
) -> None:
    core = make_core()
    slot_id = start(core, "t1", phase)
    plugin_results = (
        (
            PluginResult(
                plugin_name="ReturnValueResultHandler",
                success=False,
                failure_code=expected_code,
                failure_message="db down",
            ),
        )
        if phase is WRITER and code is not None  # a crash names no plug-in
        else ()
    )
    outcome: PhaseOutcome = (
        PhaseCrashed(message=f"{phase.value} broke")
        if code is None
        else PhaseFailed(
            failure=Failure(code, f"{phase.value} broke", outcome_retryable),
            plugin_results=plugin_results,
        )
    )
    cmds = core.handle_task_phase_finished("t1", token(core, "t1", phase), outcome, T0 + 7)
    result = TaskResult(
        success=False,
        failure_code=expected_code,
        retryable=expected_retryable,
        failure_message=f"{phase.value} broke",
        plugin_results=plugin_results,
    )
    assert cmds == [
        TaskConverged(task_id="t1", slot_id=slot_id, state=TaskState.FAILED, result=result)
    ]
    assert core.task_phase("t1") is None
    assert counts(core) == (0, 0)
    got = snap(core.handle_get_task_result("t1", T0 + 8))
    assert (got.state, got.result) == (TaskState.FAILED, result)


WRONG_PHASES = [
    (current, reported)
    for current in (PREPARING, BUILDER, CALLS, WRITER)
    for reported in (BUILDER, CALLS, WRITER)
    if reported is not current
]


@pytest.mark.parametrize("outcome", [OK, PhaseCrashed(message="x")])
def test_answering_an_activation_with_a_phase_outcome_is_misuse(outcome: PhaseOutcome) -> None:
    """Activation has its own events, and no token is ever issued for TERMINAL: a
    caller that answers PREPARING's token with a phase outcome has a bug, and the task
    is left as it was."""
    core = make_core()
    submit(core)
    with pytest.raises(BlockxUsageError, match="not a phase that finishes"):
        core.handle_task_phase_finished("t1", current_token(core, "t1"), outcome, T0 + 1)
    assert core.task_phase("t1") is PREPARING


def test_a_phase_failing_with_a_kind_that_is_no_task_failure_is_misuse() -> None:
    """A call's kind (USER_ERROR, ...) is not a task's failure code: the adapter maps it."""
    core = make_core()
    start(core, "t1", CALLS)
    failed = PhaseFailed(failure=Failure(CallFailureKind.USER_ERROR, "boom", False))
    with pytest.raises(BlockxUsageError, match="FailureCode"):
        core.handle_task_phase_finished("t1", current_token(core, "t1"), failed, T0 + 1)
    assert core.task_phase("t1") is CALLS


def test_plugin_not_found_in_the_calls_phase_is_misuse() -> None:
    core = make_core()
    start(core, "t1", CALLS)
    with pytest.raises(BlockxUsageError, match="not a phase that runs a plug-in"):
        core.handle_plugin_not_found("t1", current_token(core, "t1"), "none", T0 + 1)
    assert core.task_phase("t1") is CALLS


@pytest.mark.parametrize(("current", "reported"), WRONG_PHASES)
@pytest.mark.parametrize("success", [True, False])
def test_phase_finished_for_the_wrong_phase_is_ignored(
    current: TaskPhase, reported: TaskPhase, success: bool
) -> None:
    core = make_core()
    start(core, "t1", current)
    before = counts(core)
    outcome = OK if success else PhaseFailed(failure=Failure(F.CANCELLED, "", False))
    assert core.handle_task_phase_finished("t1", token(core, "t1", reported), outcome, T0 + 1) == []
    assert core.task_phase("t1") is current
    assert counts(core) == before
    assert snap(core.handle_get_task_result("t1", T0 + 1)).state is TaskState.RUNNING


@pytest.mark.parametrize("success", [True, False])
def test_phase_finished_after_convergence_is_ignored(success: bool) -> None:
    core = make_core()
    done = succeed(core, now=T0)
    outcome = OK if success else PhaseFailed(failure=Failure(F.CANCELLED, "", False))
    for phase in (BUILDER, CALLS, WRITER):
        assert (
            core.handle_task_phase_finished("t1", token(core, "t1", phase), outcome, T0 + 1) == []
        )
    assert (
        core.handle_task_phase_finished("never", token(core, "never", BUILDER), outcome, T0 + 1)
        == []
    )
    assert snap(core.handle_get_task_result("t1", T0 + 1)).result == done.result


@pytest.mark.parametrize(
    ("finished_at", "times_out"),
    [(T0 + 999, False), (T0 + 1_000, True), (T0 + 5_000, True)],
)
def test_deadline_is_checked_before_calls(finished_at: int, times_out: bool) -> None:
    core = make_core()
    slot_id = start(core, "t1", BUILDER, now=T0, timeout_ms=1_000)
    cmds = core.handle_task_phase_finished("t1", token(core, "t1", BUILDER), OK, finished_at)
    if not times_out:
        assert cmds == [StartCallPhase(task_id="t1", token=current_token(core, "t1"))]
        return
    assert not any(isinstance(c, StartCallPhase) for c in cmds)
    done = converged(cmds)
    assert cmds == [done]
    assert (done.slot_id, done.state) == (slot_id, TaskState.FAILED)
    assert done.result.failure_code is FailureCode.TIMED_OUT
    assert done.result.retryable is True
    assert "1000" in done.result.failure_message
    assert counts(core) == (0, 0)


# ---- convergence, retention, get_task_result ---------------------------------------------


def test_convergence_frees_the_slot_at_once_and_keeps_the_result() -> None:
    core = make_core(WorkerConfig(task_slots=1))
    start(core, "t1", WRITER, now=T0)
    assert counts(core) == (0, 1)
    outcome = PhaseSucceeded(plugin_results=(PLUGIN_OK,))
    done = converged(
        core.handle_task_phase_finished("t1", token(core, "t1", WRITER), outcome, T0 + 10)
    )
    assert counts(core) == (0, 0)  # the heartbeat drops immediately
    assert core.slot_states() == [FREE]
    # The freed slot is usable at once by another task, while t1's result is kept.
    t2 = reserve(core, "t2", now=T0 + 10)
    for now in (T0 + 10, T0 + 10 + RETENTION - 1):
        got = snap(core.handle_get_task_result("t1", now))
        assert got == TaskSnapshot(
            task_id="t1", slot_id=done.slot_id, state=TaskState.SUCCEEDED, result=done.result
        )
    # Purged once the retention window passed.
    expired_at = T0 + 10 + RETENTION
    assert core.tick_timers(T0 + 10 + TTL) == [SlotExpired(task_id="t2", slot_id=t2)]
    assert core.next_deadline_ms() == expired_at
    assert core.tick_timers(expired_at) == []
    assert core.next_deadline_ms() is None
    assert error(core.handle_get_task_result("t1", expired_at)).code is ErrorCode.NOT_FOUND


def test_result_is_not_found_after_retention_even_before_a_tick() -> None:
    core = make_core()
    done = succeed(core, now=T0)
    assert snap(core.handle_get_task_result("t1", T0 + RETENTION - 1)).result == done.result
    assert error(core.handle_get_task_result("t1", T0 + RETENTION)).code is ErrorCode.NOT_FOUND


GET_RESULT_CASES = [
    # (setup, expected state or NOT_FOUND)
    ("unknown", None),
    ("reserved", TaskState.ALLOCATED),
    ("preparing", TaskState.RUNNING),
    ("builder", TaskState.RUNNING),
    ("calls", TaskState.RUNNING),
    ("writer", TaskState.RUNNING),
    ("succeeded", TaskState.SUCCEEDED),
    ("failed", TaskState.FAILED),
    ("expired reservation", None),
    ("expired result", None),
]


@pytest.mark.parametrize(("setup", "expected"), GET_RESULT_CASES)
def test_get_task_result(setup: str, expected: TaskState | None) -> None:
    core = make_core()
    now = T0 + 1
    slot_id = ""
    result: TaskResult | None = None
    if setup == "reserved":
        slot_id = reserve(core)
    elif setup in ("preparing", "builder", "calls", "writer"):
        slot_id = start(core, "t1", TaskPhase[setup.upper()])
    elif setup == "succeeded":
        done = succeed(core)
        slot_id, result = done.slot_id, done.result
    elif setup == "failed":
        submit(core)
        done = converged(
            core.handle_task_activation_failed(
                "t1", token(core, "t1", PREPARING), F.IO_SCOPE_FAILED, "x", T0
            )
        )
        slot_id, result = done.slot_id, done.result
    elif setup == "expired reservation":
        reserve(core)
        now = T0 + TTL
        assert len(core.tick_timers(now)) == 1
    elif setup == "expired result":
        succeed(core)
        now = T0 + RETENTION
        assert core.tick_timers(now) == []
    got = core.handle_get_task_result("t1", now)
    if expected is None:
        err = error(got)
        assert err.code is ErrorCode.NOT_FOUND
        assert "t1" in err.message
        return
    s = snap(got)
    assert (s.task_id, s.slot_id, s.state, s.result) == ("t1", slot_id, expected, result)
    if setup == "reserved":
        assert s.lease_deadline_ms == T0 + TTL


# ---- tick_timers ---------------------------------------------------------------------------


def test_tick_reclaims_expired_reservations_only() -> None:
    core = make_core(WorkerConfig(task_slots=3))
    a = reserve(core, "a", ttl=100, now=T0)
    b = reserve(core, "b", ttl=200, now=T0)
    start(core, "c", BUILDER, now=T0)
    assert core.next_deadline_ms() == T0 + 100
    assert core.tick_timers(T0 + 99) == []
    assert core.tick_timers(T0 + 100) == [SlotExpired(task_id="a", slot_id=a)]
    assert counts(core) == (1, 1)
    assert core.next_deadline_ms() == T0 + 200
    assert core.tick_timers(T0 + 250) == [SlotExpired(task_id="b", slot_id=b)]
    assert counts(core) == (0, 1)
    assert core.slot_states().count(FREE) == 2
    assert core.tick_timers(T0 + 250) == []  # nothing twice
    assert core.task_phase("c") is BUILDER
    for task_id in ("a", "b"):
        assert error(core.handle_get_task_result(task_id, T0 + 250)).code is ErrorCode.NOT_FOUND


def test_tick_reclaims_several_expired_reservations_at_once() -> None:
    core = make_core()
    a = reserve(core, "a", ttl=100, now=T0)
    b = reserve(core, "b", ttl=50, now=T0)
    cmds = core.tick_timers(T0 + 100)
    assert sorted(cmds, key=repr) == sorted(
        [SlotExpired(task_id="a", slot_id=a), SlotExpired(task_id="b", slot_id=b)], key=repr
    )
    assert core.slot_states() == [FREE, FREE]


@pytest.mark.parametrize("phase", [PREPARING, BUILDER, CALLS, WRITER])
def test_tick_times_out_tasks_past_their_deadline(phase: TaskPhase) -> None:
    core = make_core()
    # A lease longer than the timeout, so that a PREPARING task times out, not SLOT_LOST.
    slot_id = reserve(core, ttl=10_000, now=T0)
    start(core, "t1", phase, slot_id=slot_id, now=T0, timeout_ms=1_000)
    assert core.next_deadline_ms() == T0 + 1_000
    assert core.tick_timers(T0 + 999) == []
    cmds = core.tick_timers(T0 + 1_000)
    assert len(cmds) == 2
    assert cmds[0] == AbortTaskWork(task_id="t1")
    done = converged(cmds[1:])
    assert (done.task_id, done.slot_id, done.state) == ("t1", slot_id, TaskState.FAILED)
    assert done.result.failure_code is FailureCode.TIMED_OUT
    assert done.result.retryable is True
    assert done.result.failure_message
    assert counts(core) == (0, 0)
    assert core.task_phase("t1") is None
    # A late phase answer is ignored.
    assert core.handle_task_phase_finished("t1", token(core, "t1", BUILDER), OK, T0 + 1_001) == []
    assert snap(core.handle_get_task_result("t1", T0 + 1_001)).result == done.result


def test_tick_with_default_timeout() -> None:
    core = make_core()
    start(core, "t1", CALLS, now=T0)
    assert core.tick_timers(T0 + TASK_DEADLINE - 1) == []
    cmds = core.tick_timers(T0 + TASK_DEADLINE)
    assert converged(cmds).result.failure_code is FailureCode.TIMED_OUT
    assert str(TASK_DEADLINE) in converged(cmds).result.failure_message


def watch_disconnected(cmds: Sequence[WorkerCommand], slot_id: str) -> None:
    assert len(cmds) == 2
    assert cmds[0] == AbortTaskWork(task_id="t1")
    done = converged(cmds[1:])
    assert (done.slot_id, done.state) == (slot_id, TaskState.FAILED)
    assert done.result.failure_code is FailureCode.WATCH_DISCONNECTED
    assert done.result.retryable is False
    assert str(GRACE) in done.result.failure_message


def test_watch_grace_starts_when_the_last_watch_detaches() -> None:
    core = make_core(WATCHED)
    slot_id = start(core, "t1", CALLS, now=T0)
    core.watch_attached("t1", T0 + 1)
    core.watch_attached("t1", T0 + 2)
    core.watch_detached("t1", T0 + 10)  # one watcher is left
    assert core.next_deadline_ms() == T0 + TASK_DEADLINE
    assert core.tick_timers(T0 + 10 + GRACE) == []
    core.watch_detached("t1", T0 + 100)  # the last one
    assert core.next_deadline_ms() == T0 + 100 + GRACE
    assert core.tick_timers(T0 + 100 + GRACE - 1) == []
    watch_disconnected(core.tick_timers(T0 + 100 + GRACE), slot_id)
    assert counts(core) == (0, 0)


def test_a_new_watch_cancels_the_grace() -> None:
    core = make_core(WATCHED)
    slot_id = start(core, "t1", BUILDER, now=T0)
    core.watch_attached("t1", T0)
    core.watch_detached("t1", T0 + 10)
    core.watch_attached("t1", T0 + 20)
    assert core.next_deadline_ms() == T0 + TASK_DEADLINE
    assert core.tick_timers(T0 + 10 + GRACE) == []
    assert core.tick_timers(T0 + 10 + 10 * GRACE) == []
    assert core.task_phase("t1") is BUILDER
    # Detaching again restarts the grace from the new detach.
    core.watch_detached("t1", T0 + 50_000)
    assert core.tick_timers(T0 + 50_000 + GRACE - 1) == []
    watch_disconnected(core.tick_timers(T0 + 50_000 + GRACE), slot_id)


WATCH_NO_EFFECT = [
    # (config, script of (action, time offset)); the task is never ruled WATCH_DISCONNECTED
    ("grace 0", CFG, [("attach", 0), ("detach", 10)]),
    ("never watched", WATCHED, []),
    ("detach without attach", WATCHED, [("detach", 10)]),
    ("still watched", WATCHED, [("attach", 0), ("attach", 1), ("detach", 10)]),
    ("reattached", WATCHED, [("attach", 0), ("detach", 10), ("attach", 20)]),
]


@pytest.mark.parametrize(
    ("config", "script"),
    [case[1:] for case in WATCH_NO_EFFECT],
    ids=[case[0] for case in WATCH_NO_EFFECT],
)
def test_watch_without_grace_expiry(config: WorkerConfig, script: list[tuple[str, int]]) -> None:
    core = make_core(config)
    start(core, "t1", CALLS, now=T0)
    for action, offset in script:
        if action == "attach":
            core.watch_attached("t1", T0 + offset)
        else:
            core.watch_detached("t1", T0 + offset)
    assert core.next_deadline_ms() == T0 + TASK_DEADLINE
    for now in (T0 + 10 + GRACE, T0 + TASK_DEADLINE - 1):
        assert core.tick_timers(now) == []
        assert core.task_phase("t1") is CALLS
    # Only the task deadline ends it.
    cmds = core.tick_timers(T0 + TASK_DEADLINE)
    assert converged(cmds).result.failure_code is FailureCode.TIMED_OUT


def test_watch_on_unknown_or_finished_tasks_is_ignored() -> None:
    core = make_core(WATCHED)
    done = succeed(core, now=T0)
    reserve(core, "t2", ttl=10 * GRACE, now=T0)
    for task_id in ("t1", "t2", "nope"):
        core.watch_attached(task_id, T0)
        core.watch_detached(task_id, T0 + 1)
    assert core.next_deadline_ms() == T0 + 10 * GRACE
    assert core.tick_timers(T0 + 1 + GRACE) == []
    assert snap(core.handle_get_task_result("t1", T0 + 1 + GRACE)).result == done.result


def test_timeout_wins_over_watch_grace_in_the_same_tick() -> None:
    core = make_core(WATCHED)
    start(core, "t1", BUILDER, now=T0, timeout_ms=1_000)
    core.watch_attached("t1", T0)
    core.watch_detached("t1", T0 + 100)
    cmds = core.tick_timers(T0 + 100 + GRACE)
    assert cmds[0] == AbortTaskWork(task_id="t1")
    assert converged(cmds).result.failure_code is FailureCode.TIMED_OUT


def test_watch_opened_while_allocated_arms_the_grace_after_submit() -> None:
    core = make_core(WATCHED)
    slot_id = reserve(core, now=T0)
    core.watch_attached("t1", T0)  # the client watches right after reserving
    submit(core, slot_id=slot_id, now=T0 + 1)
    advance_to(core, "t1", CALLS, now=T0 + 1)
    core.watch_detached("t1", T0 + 10)  # its only Watch stream is confirmed gone
    assert core.next_deadline_ms() == T0 + 10 + GRACE
    watch_disconnected(core.tick_timers(T0 + 10 + GRACE), slot_id)


def test_watch_closed_before_submit_starts_the_grace_at_submit() -> None:
    """A Watch opened alongside SubmitTask that is gone by the time the task runs:
    the grace starts with the run, and a new Watch within it cancels it."""
    core = make_core(WATCHED)
    slot_id = reserve(core, now=T0)
    core.watch_attached("t1", T0)
    core.watch_detached("t1", T0 + 1)  # reserved: nothing to rule on yet
    assert core.next_deadline_ms() == T0 + TTL
    submit(core, slot_id=slot_id, now=T0 + 5)
    advance_to(core, "t1", CALLS, now=T0 + 5)
    assert core.next_deadline_ms() == T0 + 5 + GRACE
    watch_disconnected(core.tick_timers(T0 + 5 + GRACE), slot_id)
    # The same, but the client watches again in time.
    slot_id = reserve(core, "t2", now=T0)
    core.watch_attached("t2", T0)
    core.watch_detached("t2", T0 + 1)
    submit(core, "t2", slot_id=slot_id, now=T0 + 5)
    advance_to(core, "t2", CALLS, now=T0 + 5)
    core.watch_attached("t2", T0 + 6)
    assert core.tick_timers(T0 + 5 + GRACE) == []
    assert core.task_phase("t2") is CALLS


def test_a_reserved_task_never_watched_runs_without_the_grace() -> None:
    core = make_core(WATCHED)
    slot_id = reserve(core, now=T0)
    submit(core, slot_id=slot_id, now=T0 + 5)
    advance_to(core, "t1", CALLS, now=T0 + 5)
    assert core.next_deadline_ms() == T0 + 5 + TASK_DEADLINE


NEXT_DEADLINE_CASES = [
    # (name, expected offset from T0, or None)
    ("nothing", None),
    ("reserved", TTL),
    ("preparing", TTL),  # lease (1000) before the task deadline (5000)
    ("running", 5_000),
    ("watch grace", 100 + GRACE),
    ("retained", 50 + RETENTION),
    ("everything", TTL),
]


@pytest.mark.parametrize(("case", "expected"), NEXT_DEADLINE_CASES)
def test_next_deadline_is_the_earliest_timer(case: str, expected: int | None) -> None:
    core = make_core(WorkerConfig(task_slots=5, watch_disconnect_grace_ms=GRACE))
    if case in ("reserved", "everything"):
        reserve(core, "r", now=T0)
    if case in ("preparing", "everything"):
        submit(core, "p", now=T0, timeout_ms=5_000)
    if case in ("running", "everything"):
        start(core, "b", BUILDER, now=T0, timeout_ms=5_000)
    if case in ("watch grace", "everything"):
        start(core, "w", CALLS, now=T0)
        core.watch_attached("w", T0)
        core.watch_detached("w", T0 + 100)
    if case in ("retained", "everything"):
        succeed(core, "s", now=T0 + 50)
    want = None if expected is None else T0 + expected
    assert core.next_deadline_ms() == want
    if want is not None:
        # aioquic-style: nothing to do just before the deadline, something at it.
        slots_before = core.slot_states()
        assert core.tick_timers(want - 1) == []
        assert core.slot_states() == slots_before
        assert core.tick_timers(want) != [] or case == "retained"
        assert core.next_deadline_ms() != want


# ---- draining ------------------------------------------------------------------------------


def test_draining_refuses_new_work_and_lets_running_tasks_converge() -> None:
    core = make_core(WorkerConfig(task_slots=3))
    slot_id = start(core, "run", CALLS, now=T0)
    reserved = reserve(core, "res", now=T0)
    done = succeed(core, "old", now=T0)
    core.start_draining()
    assert core.draining
    assert error(core.handle_request_task_slot("new", TTL, T0)).code is ErrorCode.UNAVAILABLE
    assert error(core.handle_submit_task(task_input("new"), "", T0)).code is ErrorCode.UNAVAILABLE
    assert error(core.handle_submit_task(task_input("res"), reserved, T0)).code is (
        ErrorCode.UNAVAILABLE
    )
    assert counts(core) == (1, 1)
    # GetTaskResult keeps working for every kind of task.
    assert snap(core.handle_get_task_result("run", T0)).state is TaskState.RUNNING
    assert snap(core.handle_get_task_result("res", T0)).state is TaskState.ALLOCATED
    assert snap(core.handle_get_task_result("old", T0)).result == done.result
    # The running task converges.
    assert core.handle_task_phase_finished("run", token(core, "run", CALLS), OK, T0 + 1) == [
        StartWriterPhase(task_id="run", token=current_token(core, "run"))
    ]
    outcome = PhaseSucceeded()
    finished = converged(
        core.handle_task_phase_finished("run", token(core, "run", WRITER), outcome, T0 + 2)
    )
    assert (finished.slot_id, finished.state) == (slot_id, TaskState.SUCCEEDED)
    assert snap(core.handle_get_task_result("run", T0 + 2)).state is TaskState.SUCCEEDED
    # Timers keep running: the reservation is reclaimed.
    assert core.tick_timers(T0 + TTL) == [SlotExpired(task_id="res", slot_id=reserved)]
    assert counts(core) == (0, 0)
    assert core.active_task_ids() == []


def test_draining_still_times_out_tasks() -> None:
    core = make_core()
    start(core, "t1", BUILDER, now=T0, timeout_ms=1_000)
    core.start_draining()
    cmds = core.tick_timers(T0 + 1_000)
    assert converged(cmds).result.failure_code is FailureCode.TIMED_OUT


def test_not_ready_then_ready() -> None:
    core = WorkerCore(CFG, "inc")
    assert (core.ready, core.draining) == (False, False)
    assert error(core.handle_request_task_slot("t1", TTL, T0)).code is ErrorCode.UNAVAILABLE
    core.set_ready(True)
    reserve(core, "t1")
    assert (core.ready, core.draining) == (True, False)


# ==== leases are honoured between timer ticks ====


def test_submit_at_the_lease_deadline_is_invalid_even_before_a_tick() -> None:
    core = make_core()
    slot_id = reserve(core, "t1", ttl=100, now=T0)
    err = error(core.handle_submit_task(task_input("t1"), slot_id, T0 + 100))
    assert err.code is ErrorCode.INVALID_SLOT
    assert "expired" in err.message
    # Just before the deadline it is still good.
    core2 = make_core()
    slot2 = reserve(core2, "t1", ttl=100, now=T0)
    submitted(core2.handle_submit_task(task_input("t1"), slot2, T0 + 99))


def test_activation_after_the_lease_ran_out_is_slot_lost_even_before_a_tick() -> None:
    core = make_core()
    slot_id = reserve(core, "t1", ttl=100, now=T0)
    submitted(core.handle_submit_task(task_input("t1"), slot_id, T0 + 50))
    commands = core.handle_task_activation_prepared("t1", token(core, "t1", PREPARING), T0 + 100)
    assert len(commands) == 1
    converged = commands[0]
    assert isinstance(converged, TaskConverged)
    assert converged.result.failure_code is FailureCode.SLOT_LOST
    assert converged.result.retryable
    assert counts(core) == (0, 0)


def test_get_task_result_of_a_preparing_task_reports_its_lease() -> None:
    core = make_core()
    slot_id = reserve(core, "t1", ttl=100, now=T0)
    submitted(core.handle_submit_task(task_input("t1"), slot_id, T0 + 10))
    got = snap(core.handle_get_task_result("t1", T0 + 20))
    assert (got.state, got.lease_deadline_ms) == (TaskState.RUNNING, T0 + 100)


# ---- CancelTask (a BlockX addition) ----------------------------------------------------
# The random interleavings (cancels among every other event) are in
# test_core_worker_stateful.py.

CANCELLED = TaskResult(
    success=False,
    failure_code=FailureCode.CANCELLED,
    retryable=False,
    failure_message=CANCELLED_BY_CLIENT,
)


def cancel(
    core: WorkerCore, task_id: str = "t1", now: int = T0
) -> tuple[CancelAnswer, list[WorkerCommand]]:
    answer = core.handle_cancel_task(task_id, now)
    assert not isinstance(answer, Refusal), answer
    return answer


@pytest.mark.parametrize("phase", [PREPARING, BUILDER, CALLS, WRITER])
def test_a_submitted_task_is_aborted_and_fails_cancelled_not_retryable(phase: TaskPhase) -> None:
    """PREPARING and BUILDER: its Builder never runs or is stopped; CALLS: its calls
    get CancelCall; WRITER (waiting for a writer slot): its writer never starts."""
    core = make_core()
    slot_id = start(core, "t1", phase)
    answer, cmds = cancel(core, "t1", T0 + 5)
    expected: list[WorkerCommand] = [
        AbortTaskWork(task_id="t1"),
        TaskConverged(task_id="t1", slot_id=slot_id, state=TaskState.FAILED, result=CANCELLED),
    ]
    assert cmds == expected
    snapshot = TaskSnapshot(task_id="t1", slot_id=slot_id, state=TaskState.FAILED, result=CANCELLED)
    assert answer == CancelAnswer(outcome=CancelOutcome.CANCELLED, snapshot=snapshot)
    # The slot is free at once; the result is retained like any other.
    assert counts(core) == (0, 0)
    assert core.active_task_ids() == []
    assert snap(core.handle_get_task_result("t1", T0 + 6)) == snapshot
    assert cancelled_by_client(snapshot.result)


@pytest.mark.parametrize("phase", [BUILDER, CALLS, WRITER])
def test_the_stopped_phase_reporting_late_changes_nothing(phase: TaskPhase) -> None:
    core = make_core()
    start(core, "t1", phase)
    cancel(core)
    outcome = PhaseFailed(failure=Failure(FailureCode.CANCELLED, "", True))
    assert core.handle_task_phase_finished("t1", token(core, "t1", phase), outcome, T0 + 1) == []
    assert core.handle_task_phase_finished("t1", token(core, "t1", phase), OK, T0 + 1) == []
    assert snap(core.handle_get_task_result("t1", T0 + 1)).result == CANCELLED


def test_twice_is_the_same_as_once() -> None:
    core = make_core()
    start(core, "t1", CALLS)
    first, cmds = cancel(core, "t1", T0)
    assert len(cmds) == 2
    assert cancel(core, "t1", T0 + 10) == (first, [])


def test_a_writer_that_is_writing_ends_with_its_own_outcome() -> None:
    """A write under way is not interrupted: a result partly written is never
    reported as cancelled with nothing written."""
    core = make_core()
    slot_id = start(core, "t1", WRITER)
    assert core.handle_writer_started("t1", token(core, "t1", WRITER), T0) == []
    running = TaskSnapshot(task_id="t1", slot_id=slot_id, state=TaskState.RUNNING)
    writing = CancelAnswer(outcome=CancelOutcome.WRITING, snapshot=running)
    assert cancel(core, "t1", T0 + 1) == (writing, [])
    assert cancel(core, "t1", T0 + 2) == (writing, [])
    assert counts(core) == (0, 1)
    outcome = PhaseSucceeded(plugin_results=(PLUGIN_OK,))
    done = converged(
        core.handle_task_phase_finished("t1", token(core, "t1", WRITER), outcome, T0 + 3)
    )
    assert done.state is TaskState.SUCCEEDED
    answer, cmds = cancel(core, "t1", T0 + 4)
    assert cmds == []
    assert answer.outcome is CancelOutcome.FINISHED
    assert answer.snapshot.result == done.result


@pytest.mark.parametrize("phase", [PREPARING, BUILDER, CALLS])
def test_writer_started_outside_the_writer_phase_is_ignored(phase: TaskPhase) -> None:
    core = make_core()
    start(core, "t1", phase)
    assert core.handle_writer_started("t1", token(core, "t1", WRITER), T0) == []
    assert cancel(core)[0].outcome is CancelOutcome.CANCELLED


def test_a_reserved_task_is_not_submitted_and_keeps_its_slot() -> None:
    core = make_core()
    slot_id = reserve(core, "t1", ttl=TTL, now=T0)
    refusal = error(core.handle_cancel_task("t1", T0 + 400))
    assert refusal.code is ErrorCode.NOT_SUBMITTED
    assert "not submitted" in refusal.message
    assert slot_id in refusal.message
    assert f"in {TTL - 400} ms" in refusal.message
    # Nothing changed: the slot is still reserved, and a submission still runs it.
    assert counts(core) == (1, 0)
    assert snap(core.handle_get_task_result("t1", T0 + 400)).state is TaskState.ALLOCATED


def test_a_finished_task_answers_its_state() -> None:
    core = make_core(WorkerConfig(task_slots=3))
    done = succeed(core, "ok", now=T0)
    start(core, "bad", CALLS)
    failed = converged(
        core.handle_task_phase_finished(
            "bad", token(core, "bad", CALLS), PhaseCrashed(message="boom"), T0
        )
    )
    for task_id, ended in (("ok", done), ("bad", failed)):
        answer, cmds = cancel(core, task_id, T0 + 1)
        assert cmds == []
        assert answer == CancelAnswer(
            outcome=CancelOutcome.FINISHED,
            snapshot=TaskSnapshot(
                task_id=task_id, slot_id=ended.slot_id, state=ended.state, result=ended.result
            ),
        )


def test_a_drains_cancellation_stays_retryable_and_is_not_a_clients() -> None:
    core = make_core()
    start(core, "t1", CALLS)
    outcome = PhaseFailed(
        failure=Failure(FailureCode.CANCELLED, "the worker is shutting down", False)
    )
    ended = converged(core.handle_task_phase_finished("t1", token(core, "t1", CALLS), outcome, T0))
    assert ended.result.failure_code is FailureCode.CANCELLED
    assert ended.result.retryable
    assert not cancelled_by_client(ended.result)
    assert cancel(core, "t1", T0 + 1)[0].outcome is CancelOutcome.FINISHED


def test_a_tombstone_still_says_a_client_cancelled_it() -> None:
    # A budget below one result's cost: every result becomes a tombstone at once.
    core = make_core(WorkerConfig(task_slots=2, result_retention_max_bytes=1))
    start(core, "t1", CALLS)
    cancel(core, "t1", T0)
    answer, cmds = cancel(core, "t1", T0 + 1)
    assert cmds == []
    assert answer.snapshot.outputs_dropped
    assert answer.outcome is CancelOutcome.CANCELLED


def test_cancel_works_while_draining() -> None:
    core = make_core()
    start(core, "t1", BUILDER)
    core.start_draining()
    assert cancel(core)[0].outcome is CancelOutcome.CANCELLED
    assert core.active_task_ids() == []


@pytest.mark.parametrize(
    ("task_id", "code"),
    [
        ("", ErrorCode.INVALID_ARGUMENT),
        ("x" * (MAX_TASK_ID_BYTES + 1), ErrorCode.INVALID_ARGUMENT),
        ("never-seen", ErrorCode.NOT_FOUND),
    ],
)
def test_cancel_refusals(task_id: str, code: ErrorCode) -> None:
    refusal = error(make_core().handle_cancel_task(task_id, T0))
    assert refusal.code is code
    assert refusal.message


def test_after_retention_the_task_is_not_found() -> None:
    core = make_core(CFG)
    start(core, "t1", CALLS)
    cancel(core, "t1", T0)
    assert error(core.handle_cancel_task("t1", T0 + RETENTION)).code is ErrorCode.NOT_FOUND
