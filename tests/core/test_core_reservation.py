"""ReservationCore: the decisions of one ReserveWorkerSlot, driven by hand.

Each case scripts what every worker answers, runs the core to its end and
compares the commands it returned. Time is an integer argument; nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from blockx_core.coordinator import (
    CoordinatorConfig,
    CoordinatorCore,
    ReasonKind,
    Reservation,
    ReservationCore,
    ReservationState,
    ReserveCommand,
    ReserveFailure,
    ReserveOutcome,
    SlotAnswer,
    SlotAttemptResult,
    SlotError,
    SlotGranted,
    TrySlot,
    classify_slot_answer,
    describe_slot_answer,
)
from blockx_core.errors import BlockxUsageError, ErrorCode, Refusal
from blockx_core.heartbeat import WorkerHeartbeat

NOW = 1_000_000
TTL = 5_000  # default slot_ttl_ms

GRANT = SlotGranted("slot-1")
EMPTY = SlotGranted("")
NO_SLOT = SlotError(ErrorCode.NO_SLOT, "no free slot", may_have_allocated=False)
REFUSED = SlotError(ErrorCode.UNAVAILABLE, "cannot connect", may_have_allocated=False)
TIMEOUT = SlotError(ErrorCode.SLOT_UNCERTAIN, "timed out", may_have_allocated=True)
INVALID = SlotError(
    ErrorCode.INVALID_ARGUMENT,
    "INVALID_ARGUMENT: ttl_ms 5000 exceeds MAX_SLOT_TTL_MS (3000)",
    may_have_allocated=False,
)
NO_SLOT_ID = "the worker answered without a slot_id"


def hb(addr: str, slots: int) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_addr=addr, task_slots=slots, last_heartbeat_ms=NOW)


def ready_core(workers: Sequence[str], config: CoordinatorConfig | None = None) -> CoordinatorCore:
    """Workers ranked in the given order (more free slots first)."""
    core = CoordinatorCore(config or CoordinatorConfig())
    core.apply_full_worker_list([hb(a, 10 - i) for i, a in enumerate(workers)], NOW)
    return core


def run(
    core: CoordinatorCore,
    script: Mapping[str, Sequence[SlotAnswer]],
    *,
    task_id: str = "t1",
    retries: int = 1,
) -> list[ReserveCommand]:
    """Every command the core returned, answering each TrySlot from ``script``."""
    pending = {addr: list(answers) for addr, answers in script.items()}
    reservation = ReservationCore(core, max_timeout_retries=retries)
    commands = [reservation.start(task_id, NOW)]
    while isinstance(commands[-1], TrySlot):
        answer = pending[commands[-1].worker_addr].pop(0)
        commands.append(reservation.attempt_answered(answer, NOW))
    assert reservation.state is ReservationState.DONE
    return commands


def try_slot(addr: str, attempt: int = 1) -> TrySlot:
    return TrySlot(task_id="t1", worker_addr=addr, ttl_ms=TTL, attempt=attempt)


def all_rejected(*reasons: str) -> ReserveFailure:
    return ReserveFailure(
        ErrorCode.NO_EXECUTABLE_SLOT,
        "all candidates rejected (" + "; ".join(reasons) + ")",
        ReserveOutcome.ALL_CANDIDATES_REJECTED,
    )


def invalid(addr: str) -> ReserveFailure:
    return ReserveFailure(
        ErrorCode.INVALID_ARGUMENT,
        f"{addr} answered {INVALID.message}",
        ReserveOutcome.INVALID_ARGUMENT,
    )


def uncertain(addr: str, attempts: int, last: str) -> ReserveFailure:
    return ReserveFailure(
        ErrorCode.SLOT_UNCERTAIN,
        f"unable to confirm slot reservation on {addr} after {attempts} attempt(s) ({last}); "
        f"a slot may be held for this task_id until its TTL ({TTL} ms) passes: retry with "
        "the same task_id after that",
        ReserveOutcome.SLOT_UNCERTAIN,
    )


# (workers in rank order, script, same-worker retries, expected commands)
CASES: list[tuple[list[str], dict[str, list[SlotAnswer]], int, list[ReserveCommand]]] = [
    (["a", "b"], {"a": [GRANT]}, 1, [try_slot("a"), Reservation("t1", "a", "slot-1")]),
    (
        ["a", "b"],
        {"a": [NO_SLOT], "b": [GRANT]},
        1,
        [try_slot("a"), try_slot("b"), Reservation("t1", "b", "slot-1")],
    ),
    (
        ["a", "b"],
        {"a": [TIMEOUT, GRANT]},
        1,
        [try_slot("a"), try_slot("a", 2), Reservation("t1", "a", "slot-1")],
    ),
    (
        ["a", "b"],
        {"a": [TIMEOUT, TIMEOUT], "b": [GRANT]},
        1,
        [try_slot("a"), try_slot("a", 2), uncertain("a", 2, "timed out")],
    ),
    (["a", "b"], {"a": [TIMEOUT]}, 0, [try_slot("a"), uncertain("a", 1, "timed out")]),
    (
        ["a"],
        {"a": [EMPTY, EMPTY]},
        1,
        [try_slot("a"), try_slot("a", 2), uncertain("a", 2, NO_SLOT_ID)],
    ),
    (
        ["a", "b"],
        {"a": [TIMEOUT, REFUSED], "b": [GRANT]},
        1,
        [try_slot("a"), try_slot("a", 2), try_slot("b"), Reservation("t1", "b", "slot-1")],
    ),
    (
        ["a", "b", "c", "d"],
        {"a": [NO_SLOT], "b": [REFUSED], "c": [NO_SLOT], "d": [GRANT]},
        1,
        [
            try_slot("a"),
            try_slot("b"),
            try_slot("c"),
            all_rejected("a: no free slot", "b: cannot connect", "c: no free slot"),
        ],
    ),
    (
        ["a", "b"],
        {"a": [NO_SLOT], "b": [NO_SLOT]},
        1,
        [try_slot("a"), try_slot("b"), all_rejected("a: no free slot", "b: no free slot")],
    ),
    # The request's fault: it ends with the Worker's message, no other Worker is asked.
    (["a", "b"], {"a": [INVALID], "b": [GRANT]}, 1, [try_slot("a"), invalid("a")]),
    (
        ["a", "b", "c"],
        {"a": [NO_SLOT], "b": [INVALID], "c": [GRANT]},
        1,
        [try_slot("a"), try_slot("b"), invalid("b")],
    ),
    (
        ["a", "b"],
        {"a": [TIMEOUT, INVALID], "b": [GRANT]},
        1,
        [try_slot("a"), try_slot("a", 2), invalid("a")],
    ),
]


@pytest.mark.parametrize(("workers", "script", "retries", "expected"), CASES)
def test_reservation(
    workers: list[str],
    script: dict[str, list[SlotAnswer]],
    retries: int,
    expected: list[ReserveCommand],
) -> None:
    assert run(ready_core(workers), script, retries=retries) == expected


def test_empty_task_id_is_invalid_before_readiness() -> None:
    core = CoordinatorCore()  # never listed: not ready either
    [command] = run(core, {}, task_id="")
    assert command == ReserveFailure(
        ErrorCode.INVALID_ARGUMENT, "task_id is required", ReserveOutcome.INVALID_ARGUMENT
    )


def test_not_ready_asks_no_worker() -> None:
    [command] = run(CoordinatorCore(), {})
    assert isinstance(command, ReserveFailure)
    assert (command.code, command.outcome) == (ErrorCode.UNAVAILABLE, ReserveOutcome.UNAVAILABLE)


def test_no_free_capacity_asks_no_worker() -> None:
    core = CoordinatorCore()
    core.apply_full_worker_list([hb("a", 0)], NOW)
    [command] = run(core, {})
    assert isinstance(command, ReserveFailure)
    assert command.outcome is ReserveOutcome.NO_EXECUTABLE_SLOT


def test_every_stale_worker_is_unavailable() -> None:
    core = CoordinatorCore()
    core.apply_full_worker_list([hb("a", 4)], NOW)
    reservation = ReservationCore(core, max_timeout_retries=1)
    command = reservation.start("t1", NOW + core.config.heartbeat_timeout_ms + 1)
    assert isinstance(command, ReserveFailure)
    assert command.outcome is ReserveOutcome.UNAVAILABLE


def test_the_ttl_comes_from_the_config() -> None:
    core = ready_core(["a"], CoordinatorConfig(slot_ttl_ms=1234))
    command = ReservationCore(core, max_timeout_retries=1).start("t1", NOW)
    assert command == TrySlot(task_id="t1", worker_addr="a", ttl_ms=1234, attempt=1)


@pytest.mark.parametrize(
    ("answer", "failures"),
    # NoSlot is backpressure and INVALID_ARGUMENT the request's fault: no penalty.
    [(NO_SLOT, 0), (REFUSED, 1), (INVALID, 0)],
)
def test_a_rejection_is_recorded_on_the_coordinator_core(answer: SlotError, failures: int) -> None:
    core = ready_core(["a", "b"])
    run(core, {"a": [answer], "b": [GRANT]})
    view = core.worker("a")
    assert view is not None
    assert view.recent_failure_count == failures


def test_invalid_requests_never_open_the_breaker() -> None:
    """A Coordinator whose ttl_ms a Worker refuses: however many times, the Worker keeps
    being asked (no penalty, no breaker), and a request it grants still reaches it."""
    core = ready_core(["a", "b"])
    threshold = core.config.circuit_breaker_threshold
    for _ in range(threshold + 2):
        assert run(core, {"a": [INVALID]}) == [try_slot("a"), invalid("a")]
    view = core.worker("a")
    assert view is not None
    assert (view.recent_failure_count, view.penalty, view.circuit_breaker_deadline_ms) == (0, 0, 0)
    assert run(core, {"a": [GRANT]}) == [try_slot("a"), Reservation("t1", "a", "slot-1")]


def test_an_invalid_request_is_explained_by_the_worker_that_refused_it() -> None:
    core = ready_core(["a", "b"])
    reservation = ReservationCore(core, max_timeout_retries=1)
    reservation.start("t1", NOW)
    assert reservation.attempt_answered(INVALID, NOW) == invalid("a")
    reasons = {r.worker_addr: r for r in reservation.explain(NOW).workers}
    assert (reasons["a"].kind, reasons["a"].code) == (ReasonKind.ANSWERED, INVALID.code)
    assert reasons["a"].detail == INVALID.message
    assert reasons["b"].kind is ReasonKind.NOT_TRIED


def test_uncertain_to_the_end_is_recorded_as_a_timeout_and_success_resets() -> None:
    core = ready_core(["a"])
    run(core, {"a": [TIMEOUT, TIMEOUT]})
    view = core.worker("a")
    assert view is not None
    assert view.recent_failure_count == 1
    run(core, {"a": [GRANT]})
    assert view.recent_failure_count == 0


def test_events_out_of_order_are_a_usage_error() -> None:
    reservation = ReservationCore(ready_core(["a"]), max_timeout_retries=1)
    with pytest.raises(BlockxUsageError):
        reservation.attempt_answered(GRANT, NOW)  # nothing asked yet
    reservation.start("t1", NOW)
    with pytest.raises(BlockxUsageError):
        reservation.start("t1", NOW)
    reservation.attempt_answered(GRANT, NOW)
    assert reservation.state is ReservationState.DONE
    with pytest.raises(BlockxUsageError):
        reservation.attempt_answered(GRANT, NOW)


def test_negative_retries_are_a_usage_error() -> None:
    with pytest.raises(BlockxUsageError):
        ReservationCore(CoordinatorCore(), max_timeout_retries=-1)


# How a definite refusal counts, for every code: only these two spare the Worker.
REFUSAL_RESULTS: dict[ErrorCode, SlotAttemptResult] = {
    ErrorCode.NO_SLOT: SlotAttemptResult.BACKPRESSURE,
    ErrorCode.INVALID_ARGUMENT: SlotAttemptResult.INVALID,
    ErrorCode.UNAVAILABLE: SlotAttemptResult.REJECTED,
    ErrorCode.INVALID_SLOT: SlotAttemptResult.REJECTED,
    ErrorCode.NOT_FOUND: SlotAttemptResult.REJECTED,
    ErrorCode.REJECTED: SlotAttemptResult.REJECTED,
    ErrorCode.INTERNAL: SlotAttemptResult.REJECTED,
    ErrorCode.NO_EXECUTABLE_SLOT: SlotAttemptResult.REJECTED,
    ErrorCode.SLOT_UNCERTAIN: SlotAttemptResult.REJECTED,
    # CancelTask's answer, never RequestTaskSlot's: were it sent, a rejection like any other.
    ErrorCode.NOT_SUBMITTED: SlotAttemptResult.REJECTED,
    # The Sync Invoker's, never a Worker's: were it sent, a rejection like any other.
    ErrorCode.CHAIN_NOT_SERVED: SlotAttemptResult.REJECTED,
}


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_refusal_code_is_classified(code: ErrorCode) -> None:
    assert (
        classify_slot_answer(SlotError(code, "m", may_have_allocated=False))
        is (REFUSAL_RESULTS[code])
    )
    # Whatever the code, an answer that may have allocated is retried first.
    uncertain_answer = SlotError(code, "m", may_have_allocated=True)
    assert classify_slot_answer(uncertain_answer) is SlotAttemptResult.UNCERTAIN


@pytest.mark.parametrize(
    ("answer", "result"),
    [
        (GRANT, SlotAttemptResult.GRANTED),
        (EMPTY, SlotAttemptResult.UNCERTAIN),
        (TIMEOUT, SlotAttemptResult.UNCERTAIN),
        (NO_SLOT, SlotAttemptResult.BACKPRESSURE),
        (REFUSED, SlotAttemptResult.REJECTED),
        # An uncertain NoSlot is still uncertain: the flag decides, not the code.
        (SlotError(ErrorCode.NO_SLOT, "?", may_have_allocated=True), SlotAttemptResult.UNCERTAIN),
    ],
)
def test_classify_slot_answer(answer: SlotAnswer, result: SlotAttemptResult) -> None:
    assert classify_slot_answer(answer) is result


def test_refusals_share_one_base() -> None:
    assert isinstance(NO_SLOT, Refusal)
    assert isinstance(all_rejected(), Refusal)
    assert describe_slot_answer(NO_SLOT) == "no free slot"
