"""ReservationCore against a direct-style model of ReserveWorkerSlot.

The model is the orchestration written as one plain loop (validate, readiness,
serial candidates, same-worker retries on an uncertain answer). Hypothesis
draws views, per-worker answer scripts and settings, runs several requests in a
row on each of two identical CoordinatorCores (so penalties and the breaker
carry over), and checks that the state machine asks the same workers in the
same order, ends with the same answer and leaves the same penalties.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from blockx_core.coordinator import (
    Candidate,
    CoordinatorConfig,
    CoordinatorCore,
    Reservation,
    ReservationCore,
    ReserveCommand,
    ReserveFailure,
    ReserveOutcome,
    SlotAnswer,
    SlotError,
    SlotGranted,
    TrySlot,
    validate_reserve_request,
)
from blockx_core.errors import ErrorCode
from blockx_core.heartbeat import WorkerHeartbeat

NOW = 1_000_000

ANSWERS: list[SlotAnswer] = [
    SlotGranted("s"),
    SlotGranted(""),
    SlotError(ErrorCode.NO_SLOT, "no slot", may_have_allocated=False),
    SlotError(ErrorCode.REJECTED, "refused", may_have_allocated=False),
    SlotError(ErrorCode.INVALID_ARGUMENT, "bad ttl", may_have_allocated=False),
    SlotError(ErrorCode.SLOT_UNCERTAIN, "timed out", may_have_allocated=True),
]

# Indexes into ANSWERS, answered round and round by one worker.
SCRIPT = st.lists(st.integers(0, len(ANSWERS) - 1), min_size=1, max_size=6)

Answerer = Callable[[str], SlotAnswer]


def model(core: CoordinatorCore, task_id: str, retries: int, answer: Answerer) -> list[object]:
    """ReserveWorkerSlot as one loop: the commands it would have sent, in order."""
    out: list[object] = []
    invalid = validate_reserve_request(task_id)
    if invalid is not None:
        return [ReserveFailure(invalid.code, invalid.message, ReserveOutcome.INVALID_ARGUMENT)]
    not_ready = core.not_ready_reason(NOW)
    if not_ready is not None:
        return [ReserveFailure(not_ready.code, not_ready.message, ReserveOutcome.UNAVAILABLE)]
    excluded: set[str] = set()
    rejections: list[str] = []
    for _ in range(core.config.max_candidates):
        choice = core.select_candidate(task_id, excluded, NOW)
        if not isinstance(choice, Candidate):
            if rejections:
                break
            outcome = (
                ReserveOutcome.UNAVAILABLE
                if choice.code is ErrorCode.UNAVAILABLE
                else ReserveOutcome.NO_EXECUTABLE_SLOT
            )
            return [*out, ReserveFailure(choice.code, choice.message, outcome)]
        addr = choice.worker_addr
        last = ""
        rejected: SlotError | None = None
        for attempt in range(1, retries + 2):
            out.append(
                TrySlot(task_id=task_id, worker_addr=addr, ttl_ms=core.slot_ttl_ms, attempt=attempt)
            )
            got = answer(addr)
            if isinstance(got, SlotGranted):
                if got.slot_id:
                    core.record_slot_success(addr, NOW)
                    return [*out, Reservation(task_id, addr, got.slot_id)]
                last = "the worker answered without a slot_id"
            elif got.may_have_allocated:
                last = got.message
            elif got.code is ErrorCode.INVALID_ARGUMENT:
                # The request's fault: nothing recorded, and no other worker asked.
                return [
                    *out,
                    ReserveFailure(
                        got.code,
                        f"{addr} answered {got.message}",
                        ReserveOutcome.INVALID_ARGUMENT,
                    ),
                ]
            else:
                if got.code is ErrorCode.NO_SLOT:
                    core.record_slot_backpressure(addr, NOW)
                else:
                    core.record_slot_rejection(addr, NOW)
                rejected = got
                break
        if rejected is None:
            core.record_slot_timeout(addr, NOW)
            return [
                *out,
                ReserveFailure(
                    ErrorCode.SLOT_UNCERTAIN,
                    f"unable to confirm slot reservation on {addr} after {retries + 1} "
                    f"attempt(s) ({last}); a slot may be held for this task_id until its TTL "
                    f"({core.slot_ttl_ms} ms) passes: retry with the same task_id after that",
                    ReserveOutcome.SLOT_UNCERTAIN,
                ),
            ]
        excluded.add(addr)
        rejections.append(f"{addr}: {rejected.message}")
    return [
        *out,
        ReserveFailure(
            ErrorCode.NO_EXECUTABLE_SLOT,
            "all candidates rejected (" + "; ".join(rejections) + ")",
            ReserveOutcome.ALL_CANDIDATES_REJECTED,
        ),
    ]


def machine(core: CoordinatorCore, task_id: str, retries: int, answer: Answerer) -> list[object]:
    reservation = ReservationCore(core, max_timeout_retries=retries)
    commands: list[ReserveCommand] = [reservation.start(task_id, NOW)]
    while isinstance(commands[-1], TrySlot):
        commands.append(reservation.attempt_answered(answer(commands[-1].worker_addr), NOW))
    return list(commands)


def answerer(scripts: dict[str, list[int]]) -> Answerer:
    """Each worker answers from its own script, round and round."""
    cycles: dict[str, Iterator[int]] = {a: itertools.cycle(s) for a, s in scripts.items()}
    return lambda addr: ANSWERS[next(cycles[addr])]


def build(free: list[int], config: CoordinatorConfig) -> CoordinatorCore:
    core = CoordinatorCore(config)
    core.apply_full_worker_list(
        [
            WorkerHeartbeat(worker_addr=f"w{i}", task_slots=n, last_heartbeat_ms=NOW)
            for i, n in enumerate(free)
        ],
        NOW,
    )
    return core


@settings(max_examples=300, deadline=None)
@given(
    free=st.lists(st.integers(0, 3), max_size=5),
    scripts=st.lists(SCRIPT, min_size=5, max_size=5),
    task_ids=st.lists(st.sampled_from(["t1", "t2", ""]), min_size=1, max_size=4),
    max_candidates=st.integers(1, 4),
    threshold=st.integers(1, 3),
    retries=st.integers(0, 2),
)
def test_machine_matches_the_loop(
    free: list[int],
    scripts: list[list[int]],
    task_ids: list[str],
    max_candidates: int,
    threshold: int,
    retries: int,
) -> None:
    config = CoordinatorConfig(max_candidates=max_candidates, circuit_breaker_threshold=threshold)
    by_worker = {f"w{i}": scripts[i] for i in range(len(free))}
    expected_core, core = build(free, config), build(free, config)
    expected_answers, answers = answerer(by_worker), answerer(by_worker)
    for task_id in task_ids:
        expected = model(expected_core, task_id, retries, expected_answers)
        got = machine(core, task_id, retries, answers)
        assert got == expected
        # Never another worker after an uncertain answer: a retry names the same one.
        for before, after in itertools.pairwise(got):
            if isinstance(after, TrySlot) and after.attempt > 1:
                assert isinstance(before, TrySlot)
                assert before.worker_addr == after.worker_addr
        assert len({c.worker_addr for c in got if isinstance(c, TrySlot)}) <= max_candidates
    for view in expected_core.workers():
        mine = core.worker(view.worker_addr)
        assert mine is not None
        assert (mine.recent_failure_count, mine.circuit_breaker_deadline_ms) == (
            view.recent_failure_count,
            view.circuit_breaker_deadline_ms,
        )
