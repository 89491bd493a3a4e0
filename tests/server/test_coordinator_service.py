"""The ReservationLoop (ReserveWorkerSlot) against a scripted SlotReserver."""

from __future__ import annotations

from collections import defaultdict

import pytest
from support import FakeClock, heartbeat

from blockx_core.coordinator import (
    CoordinatorConfig,
    CoordinatorCore,
    Reservation,
    ReserveFailure,
    ReserveOutcome,
    SlotAnswer,
    SlotAttemptResult,
    SlotError,
    SlotGranted,
)
from blockx_core.errors import ErrorCode
from blockx_server.coordinator.reservation import HandlerConfig, ReservationLoop

GRANT = SlotGranted("slot-1")
EMPTY_GRANT = SlotGranted("")
NO_SLOT = SlotError(ErrorCode.NO_SLOT, "RESOURCE_EXHAUSTED: no free slot", may_have_allocated=False)
REFUSED = SlotError(ErrorCode.UNAVAILABLE, "cannot connect", may_have_allocated=False)
INVALID = SlotError(ErrorCode.INVALID_ARGUMENT, "bad ttl", may_have_allocated=False)
TIMEOUT = SlotError(ErrorCode.SLOT_UNCERTAIN, "timed out", may_have_allocated=True)
INVALID_ARGUMENT = ReserveOutcome.INVALID_ARGUMENT


class ScriptedReserver:
    """Answers each worker's RequestTaskSlot calls from a script, in order."""

    def __init__(self, script: dict[str, list[SlotAnswer]]) -> None:
        self.script = {addr: list(outcomes) for addr, outcomes in script.items()}
        self.calls: list[tuple[str, str, int]] = []

    async def request_task_slot(self, worker_addr: str, task_id: str, ttl_ms: int) -> SlotAnswer:
        self.calls.append((worker_addr, task_id, ttl_ms))
        return self.script[worker_addr].pop(0)


class RecordingObserver:
    def __init__(self) -> None:
        self.outcomes: list[ReserveOutcome] = []
        self.attempts: dict[SlotAttemptResult, int] = defaultdict(int)

    def reserve_finished(self, outcome: ReserveOutcome, seconds: float, reason: str) -> None:
        assert seconds >= 0
        self.outcomes.append(outcome)

    def slot_attempt(self, result: SlotAttemptResult) -> None:
        self.attempts[result] += 1


def make(
    script: dict[str, list[SlotAnswer]],
    *,
    free: dict[str, int] | None = None,
    retries: int = 1,
    config: CoordinatorConfig | None = None,
) -> tuple[ReservationLoop, CoordinatorCore, ScriptedReserver, RecordingObserver, FakeClock]:
    """Workers a, b, c... ranked in script order (more free slots first)."""
    clock = FakeClock()
    core = CoordinatorCore(config or CoordinatorConfig())
    free = free or {addr: 10 - i for i, addr in enumerate(script)}
    core.apply_full_worker_list(
        [heartbeat(a, slots=n, at_ms=clock.now) for a, n in free.items()], clock.now
    )
    reserver = ScriptedReserver(script)
    observer = RecordingObserver()
    server = ReservationLoop(
        core, reserver, clock, HandlerConfig(max_timeout_retries=retries), observer
    )
    return server, core, reserver, observer, clock


async def test_first_candidate_grants() -> None:
    server, _, reserver, observer, _ = make({"a:1": [GRANT], "b:1": []})
    result = await server.reserve_worker_slot("t1")
    assert result == Reservation("t1", "a:1", "slot-1")
    assert reserver.calls == [("a:1", "t1", 5000)]
    assert observer.outcomes == [ReserveOutcome.RESERVED]


async def test_slot_ttl_is_passed_to_the_worker() -> None:
    server, _, reserver, _, _ = make({"a:1": [GRANT]}, config=CoordinatorConfig(slot_ttl_ms=1234))
    await server.reserve_worker_slot("t1")
    assert reserver.calls[0][2] == 1234


async def test_empty_task_id_is_invalid_before_readiness() -> None:
    clock = FakeClock()
    core = CoordinatorCore()  # never initialized: not ready
    reserver = ScriptedReserver({})
    server = ReservationLoop(core, reserver, clock)
    result = await server.reserve_worker_slot("")
    assert isinstance(result, ReserveFailure)
    assert result.code is ErrorCode.INVALID_ARGUMENT
    assert reserver.calls == []


async def test_not_ready_contacts_no_worker() -> None:
    clock = FakeClock()
    core = CoordinatorCore()
    reserver = ScriptedReserver({})
    server = ReservationLoop(core, reserver, clock)
    result = await server.reserve_worker_slot("t1")
    assert isinstance(result, ReserveFailure)
    assert (result.code, result.outcome) == (ErrorCode.UNAVAILABLE, ReserveOutcome.UNAVAILABLE)
    assert "not initialized" in result.message
    assert reserver.calls == []


async def test_watch_lost_beyond_grace_is_unavailable() -> None:
    server, core, reserver, _, clock = make({"a:1": [GRANT]})
    core.mark_watch_disconnected(clock.now)
    clock.advance(core.config.watch_grace_period_ms + 1)
    result = await server.reserve_worker_slot("t1")
    assert isinstance(result, ReserveFailure)
    assert result.code is ErrorCode.UNAVAILABLE
    assert reserver.calls == []


async def test_no_free_capacity_is_no_executable_slot_without_contact() -> None:
    server, _, reserver, observer, _ = make({"a:1": []}, free={"a:1": 0})
    result = await server.reserve_worker_slot("t1")
    assert isinstance(result, ReserveFailure)
    assert result.code is ErrorCode.NO_EXECUTABLE_SLOT
    assert result.outcome is ReserveOutcome.NO_EXECUTABLE_SLOT
    assert reserver.calls == []
    assert observer.outcomes == [ReserveOutcome.NO_EXECUTABLE_SLOT]


@pytest.mark.parametrize(
    ("first", "failure_count", "attempt"),
    [
        (NO_SLOT, 0, SlotAttemptResult.BACKPRESSURE),  # backpressure: no penalty
        (REFUSED, 1, SlotAttemptResult.REJECTED),
    ],
)
async def test_definite_rejection_switches_to_next_candidate(
    first: SlotError, failure_count: int, attempt: SlotAttemptResult
) -> None:
    server, core, reserver, observer, _ = make({"a:1": [first], "b:1": [GRANT]})
    result = await server.reserve_worker_slot("t1")
    assert result == Reservation("t1", "b:1", "slot-1")
    assert [c[0] for c in reserver.calls] == ["a:1", "b:1"]
    view = core.worker("a:1")
    assert view is not None
    assert view.recent_failure_count == failure_count
    assert observer.attempts[attempt] == 1
    assert observer.attempts[SlotAttemptResult.GRANTED] == 1


async def test_a_workers_invalid_argument_ends_the_reservation_without_penalty() -> None:
    server, core, reserver, observer, _ = make({"a:1": [INVALID, INVALID], "b:1": [GRANT]})
    for task_id in ("t1", "t2"):
        result = await server.reserve_worker_slot(task_id)
        assert result == ReserveFailure(
            ErrorCode.INVALID_ARGUMENT, "a:1 answered bad ttl", INVALID_ARGUMENT
        )
    assert [c[0] for c in reserver.calls] == ["a:1", "a:1"]  # b:1 would refuse it too
    view = core.worker("a:1")
    assert view is not None
    assert (view.recent_failure_count, view.penalty) == (0, 0.0)
    assert observer.attempts[SlotAttemptResult.INVALID] == 2
    assert observer.outcomes == [INVALID_ARGUMENT, INVALID_ARGUMENT]
    # Past the Coordinator's own validation: kept for ExplainPlacement with the answer.
    [latest, _] = server.explain().recent_refusals
    assert latest.task_id == "t2"
    assert latest.explanation is not None
    assert latest.explanation.workers[0].detail == "bad ttl"


async def test_uncertain_then_granted_on_same_worker() -> None:
    server, core, reserver, observer, _ = make({"a:1": [TIMEOUT, GRANT], "b:1": []})
    result = await server.reserve_worker_slot("t1")
    assert result == Reservation("t1", "a:1", "slot-1")
    assert reserver.calls == [("a:1", "t1", 5000), ("a:1", "t1", 5000)]
    view = core.worker("a:1")
    assert view is not None
    assert view.recent_failure_count == 0
    assert observer.attempts[SlotAttemptResult.UNCERTAIN] == 1


async def test_uncertain_after_retries_is_aborted_and_never_switches() -> None:
    server, core, reserver, observer, _ = make({"a:1": [TIMEOUT, TIMEOUT], "b:1": [GRANT]})
    result = await server.reserve_worker_slot("t1")
    assert isinstance(result, ReserveFailure)
    assert result.code is ErrorCode.SLOT_UNCERTAIN
    assert result.message.startswith("unable to confirm slot reservation")
    assert [c[0] for c in reserver.calls] == ["a:1", "a:1"]  # b:1 never contacted
    view = core.worker("a:1")
    assert view is not None
    assert view.recent_failure_count == 1
    assert observer.outcomes == [ReserveOutcome.SLOT_UNCERTAIN]


async def test_zero_timeout_retries_aborts_after_one_attempt() -> None:
    server, _, reserver, _, _ = make({"a:1": [TIMEOUT], "b:1": [GRANT]}, retries=0)
    result = await server.reserve_worker_slot("t1")
    assert isinstance(result, ReserveFailure)
    assert result.code is ErrorCode.SLOT_UNCERTAIN
    assert len(reserver.calls) == 1


async def test_empty_slot_id_is_uncertain_and_retried() -> None:
    server, _, reserver, _, _ = make({"a:1": [EMPTY_GRANT, GRANT]})
    result = await server.reserve_worker_slot("t1")
    assert result == Reservation("t1", "a:1", "slot-1")
    assert len(reserver.calls) == 2


async def test_empty_slot_id_every_time_is_aborted() -> None:
    server, _, _, _, _ = make({"a:1": [EMPTY_GRANT, EMPTY_GRANT]})
    result = await server.reserve_worker_slot("t1")
    assert isinstance(result, ReserveFailure)
    assert result.code is ErrorCode.SLOT_UNCERTAIN
    assert "without a slot_id" in result.message


async def test_rejection_during_retries_moves_to_next_candidate() -> None:
    server, core, reserver, _, _ = make({"a:1": [TIMEOUT, REFUSED], "b:1": [GRANT]})
    result = await server.reserve_worker_slot("t1")
    assert result == Reservation("t1", "b:1", "slot-1")
    assert [c[0] for c in reserver.calls] == ["a:1", "a:1", "b:1"]
    view = core.worker("a:1")
    assert view is not None
    assert view.recent_failure_count == 1


async def test_all_candidates_rejected_is_resource_exhausted() -> None:
    server, _, reserver, observer, _ = make(
        {"a:1": [NO_SLOT], "b:1": [REFUSED], "c:1": [NO_SLOT], "d:1": [GRANT]}
    )
    result = await server.reserve_worker_slot("t1")
    assert isinstance(result, ReserveFailure)
    assert result.code is ErrorCode.NO_EXECUTABLE_SLOT
    assert result.message.startswith("all candidates rejected")
    assert "a:1" in result.message
    assert "b:1" in result.message
    # MaxCandidates = 3: d:1 is never tried.
    assert [c[0] for c in reserver.calls] == ["a:1", "b:1", "c:1"]
    assert observer.outcomes == [ReserveOutcome.ALL_CANDIDATES_REJECTED]


async def test_candidates_run_out_before_max_candidates() -> None:
    server, _, reserver, _, _ = make({"a:1": [NO_SLOT], "b:1": [NO_SLOT]})
    result = await server.reserve_worker_slot("t1")
    assert isinstance(result, ReserveFailure)
    assert result.outcome is ReserveOutcome.ALL_CANDIDATES_REJECTED
    assert len(reserver.calls) == 2


async def test_repeated_rejections_open_the_breaker() -> None:
    server, core, reserver, _, clock = make(
        {"a:1": [REFUSED, REFUSED, REFUSED], "b:1": [GRANT, GRANT, GRANT, GRANT]},
        config=CoordinatorConfig(circuit_breaker_threshold=3),
    )
    for i in range(3):
        assert isinstance(await server.reserve_worker_slot(f"t{i}"), Reservation)
    reserver.calls.clear()
    assert await server.reserve_worker_slot("t9") == Reservation("t9", "b:1", "slot-1")
    assert [c[0] for c in reserver.calls] == ["b:1"]  # a:1 is circuit-broken
    view = core.worker("a:1")
    assert view is not None
    assert view.breaker_open(clock.now)


async def test_success_resets_failures() -> None:
    server, core, _, _, _ = make({"a:1": [TIMEOUT, TIMEOUT, TIMEOUT, GRANT]}, retries=1)
    assert isinstance(await server.reserve_worker_slot("t1"), ReserveFailure)
    view = core.worker("a:1")
    assert view is not None
    assert view.recent_failure_count == 1
    assert isinstance(await server.reserve_worker_slot("t1"), Reservation)
    assert view.recent_failure_count == 0
    assert view.penalty == 0.0
