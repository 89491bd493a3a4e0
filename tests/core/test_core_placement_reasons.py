"""Placement explanations in the core: each worker's reason, its words, the size bound.

Tables for the derivation and the wording; hypothesis for the two invariants
(a worker is ELIGIBLE exactly when selection would pick it; an explanation never
exceeds its byte budget and accounts for every worker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx_core.coordinator import (
    PLACEMENT_MAX_BYTES,
    Candidate,
    CoordinatorConfig,
    CoordinatorCore,
    PlacementExplanation,
    ReasonKind,
    ReservationCore,
    ReserveFailure,
    SlotAnswer,
    SlotError,
    TrySlot,
    WorkerReason,
    WorkerView,
    decode_explanation,
    describe_explanation,
    describe_reason,
    encode_explanation,
    every_worker_full,
    fit_explanation,
    worker_reason,
)
from blockx_core.errors import ErrorCode
from blockx_core.heartbeat import WorkerHeartbeat

NOW = 1_000_000
CONFIG = CoordinatorConfig()


def hb(
    addr: str = "w:1",
    *,
    slots: int = 10,
    used: int = 0,
    age_ms: int = 0,
    cpu: float = 0.0,
    memory: float = 0.0,
    errors: float = 0.0,
) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_addr=addr,
        task_slots=slots,
        reserved_slots=used,
        cpu_percent=cpu,
        memory_percent=memory,
        error_rate=errors,
        last_heartbeat_ms=NOW - age_ms,
    )


def view(heartbeat: WorkerHeartbeat, breaker_until_ms: int = 0) -> WorkerView:
    v = WorkerView(heartbeat)
    v.circuit_breaker_deadline_ms = breaker_until_ms
    return v


def reason(kind: ReasonKind, **figures: object) -> WorkerReason:
    return WorkerReason(worker_addr="w:1", kind=kind, **figures)  # type: ignore[arg-type]


# (view, expected reason, its words)
DERIVATION: list[tuple[WorkerView, WorkerReason, str]] = [
    (
        view(hb(used=3)),
        reason(ReasonKind.ELIGIBLE, used_slots=3, task_slots=10),
        "eligible 3/10",
    ),
    (
        view(hb(age_ms=12_300)),
        reason(ReasonKind.STALE_HEARTBEAT, heartbeat_age_ms=12_300, heartbeat_timeout_ms=10_000),
        "stale heartbeat 12.3 s (timeout 10 s)",
    ),
    # The heartbeat timeout itself is still fresh (strictly older is stale).
    (
        view(hb(age_ms=10_000, used=10)),
        reason(ReasonKind.FULL, used_slots=10, task_slots=10),
        "full 10/10",
    ),
    (
        view(hb(cpu=0.97)),
        reason(ReasonKind.CPU_RED_LINE, measured=0.97, red_line=0.90),
        "cpu 0.97 > red line 0.90",
    ),
    (view(hb(cpu=0.90)), reason(ReasonKind.ELIGIBLE, task_slots=10), "eligible 0/10"),
    (
        view(hb(memory=0.95)),
        reason(ReasonKind.MEMORY_RED_LINE, measured=0.95, red_line=0.90),
        "memory 0.95 > red line 0.90",
    ),
    (
        view(hb(errors=0.75)),
        reason(ReasonKind.ERROR_RATE_RED_LINE, measured=0.75, red_line=0.50),
        "error rate 0.75 > red line 0.50",
    ),
    (
        view(hb(), breaker_until_ms=NOW + 4_200),
        reason(ReasonKind.BREAKER_OPEN, breaker_remaining_ms=4_200),
        "breaker open for 4.2 s",
    ),
    (view(hb(), breaker_until_ms=NOW), reason(ReasonKind.ELIGIBLE, task_slots=10), "eligible 0/10"),
    (
        view(hb(slots=50, used=50)),
        reason(ReasonKind.FULL, used_slots=50, task_slots=50),
        "full 50/50",
    ),
    # The first filter in selection order wins: stale before cpu before breaker before full.
    (
        view(hb(age_ms=60_000, cpu=1.0, used=10), breaker_until_ms=NOW + 1),
        reason(ReasonKind.STALE_HEARTBEAT, heartbeat_age_ms=60_000, heartbeat_timeout_ms=10_000),
        "stale heartbeat 60.0 s (timeout 10 s)",
    ),
    (
        view(hb(cpu=1.0, memory=1.0, used=10), breaker_until_ms=NOW + 1),
        reason(ReasonKind.CPU_RED_LINE, measured=1.0, red_line=0.90),
        "cpu 1.00 > red line 0.90",
    ),
    (
        view(hb(used=10), breaker_until_ms=NOW + 1_000),
        reason(ReasonKind.BREAKER_OPEN, breaker_remaining_ms=1_000),
        "breaker open for 1.0 s",
    ),
]


@pytest.mark.parametrize(("worker", "expected", "words"), DERIVATION)
def test_reason_derivation(worker: WorkerView, expected: WorkerReason, words: str) -> None:
    derived = worker_reason(worker, CONFIG, NOW)
    assert derived == expected
    assert describe_reason(derived) == words


ANSWER_WORDS: list[tuple[WorkerReason, str]] = [
    (
        reason(ReasonKind.ANSWERED, code=ErrorCode.NO_SLOT, detail="RESOURCE_EXHAUSTED: no slot"),
        "answered RESOURCE_EXHAUSTED: no slot",
    ),
    (reason(ReasonKind.ANSWERED, code=ErrorCode.REJECTED), "answered Rejected"),
    (
        reason(ReasonKind.UNREACHABLE, code=ErrorCode.UNAVAILABLE, detail="cannot connect: x"),
        "unreachable: cannot connect: x",
    ),
    (
        reason(ReasonKind.UNCERTAIN, code=ErrorCode.SLOT_UNCERTAIN, attempts=2, detail="timed out"),
        "uncertain after 2 tries (timed out)",
    ),
    (
        reason(ReasonKind.NOT_TRIED, used_slots=1, task_slots=4),
        "not tried (eligible 1/4)",
    ),
]


@pytest.mark.parametrize(("worker", "words"), ANSWER_WORDS)
def test_answer_words(worker: WorkerReason, words: str) -> None:
    assert describe_reason(worker) == words


def test_every_kind_has_words() -> None:
    for kind in ReasonKind:
        assert describe_reason(reason(kind))


# ---- what one ReserveWorkerSlot explains -------------------------------------------------

NO_SLOT = SlotError(ErrorCode.NO_SLOT, "RESOURCE_EXHAUSTED: no free slot", may_have_allocated=False)
REFUSED = SlotError(
    ErrorCode.UNAVAILABLE, "cannot connect: refused", may_have_allocated=False, reached=False
)
TIMEOUT = SlotError(ErrorCode.SLOT_UNCERTAIN, "timed out", may_have_allocated=True)


def run(
    heartbeats: Sequence[WorkerHeartbeat],
    script: Mapping[str, Sequence[SlotAnswer]],
    config: CoordinatorConfig = CONFIG,
) -> tuple[ReserveFailure, PlacementExplanation]:
    core = CoordinatorCore(config)
    core.apply_full_worker_list(heartbeats, NOW)
    pending = {addr: list(answers) for addr, answers in script.items()}
    reservation = ReservationCore(core, max_timeout_retries=1)
    command = reservation.start("t1", NOW)
    while isinstance(command, TrySlot):
        command = reservation.attempt_answered(pending[command.worker_addr].pop(0), NOW)
    assert isinstance(command, ReserveFailure)
    return command, reservation.explain(NOW)


def kinds(explanation: PlacementExplanation) -> list[tuple[str, ReasonKind]]:
    return [(r.worker_addr, r.kind) for r in explanation.workers]


def test_asked_workers_come_first_with_their_answers() -> None:
    _, explanation = run(
        [hb("a", slots=9), hb("b", slots=8), hb("c", age_ms=20_000), hb("d", used=10)],
        {"a": [NO_SLOT], "b": [REFUSED]},
    )
    assert kinds(explanation)[:2] == [("a", ReasonKind.ANSWERED), ("b", ReasonKind.UNREACHABLE)]
    assert sorted(kinds(explanation)[2:]) == [
        ("c", ReasonKind.STALE_HEARTBEAT),
        ("d", ReasonKind.FULL),
    ]
    assert explanation.omitted == 0
    assert describe_reason(explanation.workers[0]) == "answered RESOURCE_EXHAUSTED: no free slot"


def test_eligible_workers_past_max_candidates_are_not_tried() -> None:
    _, explanation = run(
        [hb("a", slots=9), hb("b", slots=8), hb("c", slots=7)],
        {"a": [NO_SLOT], "b": [NO_SLOT]},
        CoordinatorConfig(max_candidates=2),
    )
    assert kinds(explanation) == [
        ("a", ReasonKind.ANSWERED),
        ("b", ReasonKind.ANSWERED),
        ("c", ReasonKind.NOT_TRIED),
    ]
    assert every_worker_full(explanation) is False


def test_an_uncertain_worker_says_how_many_tries() -> None:
    failure, explanation = run([hb("a")], {"a": [TIMEOUT, TIMEOUT]})
    assert failure.code is ErrorCode.SLOT_UNCERTAIN
    [only] = explanation.workers
    assert describe_reason(only) == "uncertain after 2 tries (timed out)"


def test_nothing_asked_lists_every_filter() -> None:
    failure, explanation = run([hb("a", used=10), hb("b", cpu=0.99)], {})
    assert failure.code is ErrorCode.NO_EXECUTABLE_SLOT
    assert sorted(kinds(explanation)) == [("a", ReasonKind.FULL), ("b", ReasonKind.CPU_RED_LINE)]


def test_every_worker_full_is_busy() -> None:
    _, explanation = run([hb("a", used=10), hb("b", slots=3)], {"b": [NO_SLOT]})
    assert every_worker_full(explanation)
    assert not every_worker_full(PlacementExplanation())


def test_a_long_worker_message_is_cut() -> None:
    chatty = SlotError(ErrorCode.REJECTED, "x" * 10_000, may_have_allocated=False)
    _, explanation = run([hb("a")], {"a": [chatty]})
    assert len(explanation.workers[0].detail) == 160


def test_the_explain_rpc_ranks_eligible_workers_first() -> None:
    core = CoordinatorCore(CONFIG)
    core.apply_full_worker_list(
        [hb("z", used=10), hb("b", slots=5), hb("a", cpu=0.95), hb("c", slots=7)], NOW
    )
    assert [(r.worker_addr, r.kind) for r in core.explain(NOW)] == [
        ("c", ReasonKind.ELIGIBLE),
        ("b", ReasonKind.ELIGIBLE),
        ("a", ReasonKind.CPU_RED_LINE),
        ("z", ReasonKind.FULL),
    ]


def test_the_explain_rpc_can_ask_about_one_worker() -> None:
    core = CoordinatorCore(CONFIG)
    core.apply_full_worker_list([hb("a", used=10), hb("b")], NOW)
    assert [r.kind for r in core.explain(NOW, "a")] == [ReasonKind.FULL]
    assert core.explain(NOW, "unknown:1") == []


def test_describe_explanation_counts_the_rest() -> None:
    explanation = PlacementExplanation(
        workers=(
            WorkerReason(worker_addr="a", kind=ReasonKind.FULL, used_slots=2, task_slots=2),
            WorkerReason(worker_addr="b", kind=ReasonKind.FULL, used_slots=1, task_slots=1),
        ),
        omitted=3,
    )
    assert describe_explanation(explanation, limit=1) == "a: full 2/2 (+4 more workers)"
    assert describe_explanation(PlacementExplanation()) == "no worker registered"


def test_encoding_round_trips_and_omits_unset_figures() -> None:
    explanation = PlacementExplanation(
        workers=(WorkerReason(worker_addr="a", kind=ReasonKind.FULL, used_slots=2, task_slots=2),),
    )
    raw = encode_explanation(explanation)
    assert decode_explanation(raw) == explanation
    assert b"heartbeat_age_ms" not in raw


# ---- properties --------------------------------------------------------------------------

fractions = st.sampled_from([0.0, 0.5, 0.89, 0.9, 0.91, 1.0])
heartbeats = st.builds(
    hb,
    addr=st.just("w:1"),
    slots=st.integers(0, 4),
    used=st.integers(0, 4),
    age_ms=st.integers(-1_000, 20_000),
    cpu=fractions,
    memory=fractions,
    errors=fractions,
)


@given(heartbeat=heartbeats, breaker=st.integers(0, 2_000), other=heartbeats)
def test_eligible_exactly_when_selection_picks_it(
    heartbeat: WorkerHeartbeat, breaker: int, other: WorkerHeartbeat
) -> None:
    core = CoordinatorCore(CONFIG)
    # A second, always-fresh worker keeps "no live worker" out of the picture.
    fresh = msgspec.structs.replace(other, worker_addr="w:2", last_heartbeat_ms=NOW)
    core.apply_full_worker_list([heartbeat, fresh], NOW - 1_000)
    for _ in range(CONFIG.circuit_breaker_threshold if breaker else 0):
        core.record_slot_rejection("w:1", NOW - 1_000 - 10_000 + breaker)
    worker = core.worker("w:1")
    assert worker is not None
    derived = worker_reason(worker, CONFIG, NOW)
    picked = core.select_candidate("t", {"w:2"}, NOW) == Candidate("w:1")
    assert (derived.kind is ReasonKind.ELIGIBLE) == picked
    assert describe_reason(derived)


reasons = st.builds(
    WorkerReason,
    worker_addr=st.text(min_size=1, max_size=80),
    kind=st.sampled_from(ReasonKind),
    used_slots=st.integers(0, 2**31),
    task_slots=st.integers(0, 2**31),
    detail=st.text(max_size=160),
)


@given(
    workers=st.lists(reasons, max_size=300),
    extra=st.integers(0, 10**6),
    budget=st.integers(40, PLACEMENT_MAX_BYTES),
)
def test_fit_keeps_within_the_budget_and_counts_every_worker(
    workers: list[WorkerReason], extra: int, budget: int
) -> None:
    total = len(workers) + extra
    fitted = fit_explanation(iter(workers), total, budget)
    assert len(encode_explanation(fitted)) <= budget
    assert fitted.workers == tuple(workers[: len(fitted.workers)])
    assert len(fitted.workers) + fitted.omitted == total
    assert decode_explanation(encode_explanation(fitted)) == fitted
