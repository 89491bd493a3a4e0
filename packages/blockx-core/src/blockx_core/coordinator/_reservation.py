"""ReservationCore: the decisions of one ReserveWorkerSlot, without IO.

Lifecycle of one request (one ReservationCore per request)::

    NEW --start--> AWAITING_ANSWER --attempt_answered--> AWAITING_ANSWER ...
       \\                          \\
        `--> DONE                  `--> DONE

``start`` validates the task_id (even before readiness), then checks that the
worker view is trusted (no Worker is contacted when it is not), then picks the
first candidate. Each ``attempt_answered`` feeds back what the Worker said:

* a grant with a slot_id ends the request with a ``Reservation``;
* a definite rejection excludes that Worker and moves on to the next candidate,
  up to ``max_candidates`` of them, serially and never hedged;
* an INVALID_ARGUMENT ends the request with the Worker's message: the request is
  at fault, not the Worker (no penalty, no breaker), and the next one would
  refuse it too;
* an uncertain answer (or a grant without a slot_id) retries the SAME Worker
  with the SAME task_id up to ``max_timeout_retries`` times and then ends with
  SLOT_UNCERTAIN: switching Workers could leave two slots for one task.

Every command is either ``TrySlot`` (perform one RequestTaskSlot and call
``attempt_answered`` with its answer) or a terminal ``Reservation`` /
``ReserveFailure``. Penalties and the breaker are recorded on the
``CoordinatorCore`` as the answers arrive. After a failure, ``explain`` says for
each worker what it answered or why it was not asked.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Final, assert_never

import msgspec

from blockx_core.coordinator._core import Candidate, CoordinatorCore, validate_reserve_request
from blockx_core.coordinator._explain import (
    PLACEMENT_MAX_BYTES,
    PlacementExplanation,
    ReasonKind,
    WorkerReason,
    answer_reason,
    fit_explanation,
)
from blockx_core.coordinator._slot import (
    SlotAnswer,
    SlotAttemptResult,
    SlotError,
    SlotGranted,
    classify_slot_answer,
    describe_slot_answer,
)
from blockx_core.errors import BlockxUsageError, ErrorCode, Refusal
from blockx_core.ids import SlotId, TaskId, WorkerAddr


class ReserveOutcome(enum.StrEnum):
    """How one ReserveWorkerSlot ended (the metrics label)."""

    RESERVED = "reserved"
    # The task_id is invalid, or a Worker found the request invalid.
    INVALID_ARGUMENT = "invalid_argument"
    UNAVAILABLE = "unavailable"
    NO_EXECUTABLE_SLOT = "no_executable_slot"
    ALL_CANDIDATES_REJECTED = "all_candidates_rejected"
    SLOT_UNCERTAIN = "slot_uncertain"


class TrySlot(msgspec.Struct, frozen=True, kw_only=True):
    """Ask ``worker_addr`` for a slot; ``attempt`` counts from 1 on that worker."""

    task_id: TaskId
    worker_addr: WorkerAddr
    ttl_ms: int
    attempt: int


class Reservation(msgspec.Struct, frozen=True):
    """The request is granted: the answer to send, unchanged from the Worker."""

    task_id: TaskId
    worker_addr: WorkerAddr
    slot_id: SlotId


class ReserveFailure(Refusal, frozen=True):
    """The request ends without a slot; ``outcome`` is its metrics label."""

    outcome: ReserveOutcome


ReserveCommand = TrySlot | Reservation | ReserveFailure


class ReservationState(enum.Enum):
    NEW = "new"
    AWAITING_ANSWER = "awaiting_answer"
    DONE = "done"


class ReservationEvent(enum.Enum):
    START = "start"
    ATTEMPT_ANSWERED = "attempt_answered"


# The one event each state accepts. The state after it follows from the command
# returned: TrySlot waits for an answer, anything else is final.
_ACCEPTS: Final[Mapping[ReservationState, ReservationEvent]] = {
    ReservationState.NEW: ReservationEvent.START,
    ReservationState.AWAITING_ANSWER: ReservationEvent.ATTEMPT_ANSWERED,
}


def _refusal_outcome(refusal: Refusal) -> ReserveOutcome:
    """The label of a selection that found no candidate before any Worker was asked."""
    if refusal.code is ErrorCode.UNAVAILABLE:
        return ReserveOutcome.UNAVAILABLE
    return ReserveOutcome.NO_EXECUTABLE_SLOT


class ReservationCore:
    """One ReserveWorkerSlot over a CoordinatorCore. See the module docstring."""

    def __init__(self, core: CoordinatorCore, *, max_timeout_retries: int) -> None:
        if max_timeout_retries < 0:
            raise BlockxUsageError(f"max_timeout_retries must be >= 0 (got {max_timeout_retries})")
        self._core = core
        self._attempts_per_worker = 1 + max_timeout_retries
        self._state = ReservationState.NEW
        self._task_id: TaskId = ""
        self._excluded: set[WorkerAddr] = set()
        self._rejections: list[str] = []
        self._candidates_tried = 0
        self._current: TrySlot | None = None
        # What each worker asked answered, in the order they were asked.
        self._answers: dict[WorkerAddr, WorkerReason] = {}

    @property
    def state(self) -> ReservationState:
        return self._state

    @property
    def excluded(self) -> frozenset[WorkerAddr]:
        """Workers that definitely rejected this request."""
        return frozenset(self._excluded)

    # ---- events ----------------------------------------------------------------------

    def start(self, task_id: TaskId, now_ms: int) -> ReserveCommand:
        self._accept(ReservationEvent.START)
        self._task_id = task_id
        invalid = validate_reserve_request(task_id)
        if invalid is not None:
            return self._finish(
                ReserveFailure(invalid.code, invalid.message, ReserveOutcome.INVALID_ARGUMENT)
            )
        not_ready = self._core.not_ready_reason(now_ms)
        if not_ready is not None:
            return self._finish(
                ReserveFailure(not_ready.code, not_ready.message, ReserveOutcome.UNAVAILABLE)
            )
        return self._next_candidate(now_ms)

    def attempt_answered(self, answer: SlotAnswer, now_ms: int) -> ReserveCommand:
        """What the Worker of the last ``TrySlot`` answered, and when."""
        self._accept(ReservationEvent.ATTEMPT_ANSWERED)
        current = self._current
        assert current is not None  # AWAITING_ANSWER always has a TrySlot out
        addr = current.worker_addr
        core = self._core
        match classify_slot_answer(answer):
            case SlotAttemptResult.GRANTED:
                assert isinstance(answer, SlotGranted)
                core.record_slot_success(addr, now_ms)
                return self._finish(Reservation(self._task_id, addr, answer.slot_id))
            case SlotAttemptResult.BACKPRESSURE:
                core.record_slot_backpressure(addr, now_ms)
                return self._rejected(addr, answer, now_ms)
            case SlotAttemptResult.REJECTED:
                core.record_slot_rejection(addr, now_ms)
                return self._rejected(addr, answer, now_ms)
            case SlotAttemptResult.INVALID:
                assert isinstance(answer, SlotError)
                self._note_refusal(addr, answer)
                return self._finish(
                    ReserveFailure(
                        ErrorCode.INVALID_ARGUMENT,
                        f"{addr} answered {answer.message}",
                        ReserveOutcome.INVALID_ARGUMENT,
                    )
                )
            case SlotAttemptResult.UNCERTAIN:
                if current.attempt < self._attempts_per_worker:
                    return self._try(addr, current.attempt + 1)
                core.record_slot_timeout(addr, now_ms)
                self._answers[addr] = answer_reason(
                    addr,
                    ReasonKind.UNCERTAIN,
                    ErrorCode.SLOT_UNCERTAIN,
                    describe_slot_answer(answer),
                    current.attempt,
                )
                return self._finish(
                    ReserveFailure(
                        ErrorCode.SLOT_UNCERTAIN,
                        f"unable to confirm slot reservation on {addr} after "
                        f"{current.attempt} attempt(s) ({describe_slot_answer(answer)}); "
                        "a slot may be held for this task_id until its TTL "
                        f"({core.slot_ttl_ms} ms) passes: retry with the same task_id "
                        "after that",
                        ReserveOutcome.SLOT_UNCERTAIN,
                    )
                )
            case _ as unreachable:
                assert_never(unreachable)

    def explain(self, now_ms: int, max_bytes: int = PLACEMENT_MAX_BYTES) -> PlacementExplanation:
        """Each worker's part in this request: what the ones asked answered (first, in
        the order asked), then why each other one was not asked, within ``max_bytes``."""
        answers = self._answers
        core = self._core
        still_known = sum(1 for addr in answers if core.worker(addr) is not None)
        total = core.worker_count + len(answers) - still_known

        def reasons() -> Iterator[WorkerReason]:
            yield from answers.values()
            for reason in core.worker_reasons(now_ms):
                if reason.worker_addr in answers:
                    continue
                if reason.kind is ReasonKind.ELIGIBLE:
                    reason = msgspec.structs.replace(reason, kind=ReasonKind.NOT_TRIED)
                yield reason

        return fit_explanation(reasons(), total, max_bytes)

    # ---- internals -------------------------------------------------------------------

    def _accept(self, event: ReservationEvent) -> None:
        if _ACCEPTS.get(self._state) is not event:
            raise BlockxUsageError(f"{event.value} is not allowed in state {self._state.value}")

    def _note_refusal(self, addr: WorkerAddr, answer: SlotError) -> None:
        """What ``addr`` answered, for ``explain``."""
        assert self._current is not None
        kind = ReasonKind.ANSWERED if answer.reached else ReasonKind.UNREACHABLE
        self._answers[addr] = answer_reason(
            addr, kind, answer.code, answer.message, self._current.attempt
        )

    def _rejected(self, addr: WorkerAddr, answer: SlotAnswer, now_ms: int) -> ReserveCommand:
        assert isinstance(answer, SlotError)  # a grant is never a rejection
        self._note_refusal(addr, answer)
        self._excluded.add(addr)
        self._rejections.append(f"{addr}: {describe_slot_answer(answer)}")
        return self._next_candidate(now_ms)

    def _next_candidate(self, now_ms: int) -> ReserveCommand:
        if self._candidates_tried < self._core.config.max_candidates:
            choice = self._core.select_candidate(self._task_id, self._excluded, now_ms)
            if isinstance(choice, Candidate):
                self._candidates_tried += 1
                return self._try(choice.worker_addr, 1)
            if not self._rejections:
                return self._finish(
                    ReserveFailure(choice.code, choice.message, _refusal_outcome(choice))
                )
        return self._finish(
            ReserveFailure(
                ErrorCode.NO_EXECUTABLE_SLOT,
                "all candidates rejected (" + "; ".join(self._rejections) + ")",
                ReserveOutcome.ALL_CANDIDATES_REJECTED,
            )
        )

    def _try(self, addr: WorkerAddr, attempt: int) -> TrySlot:
        self._state = ReservationState.AWAITING_ANSWER
        self._current = TrySlot(
            task_id=self._task_id,
            worker_addr=addr,
            ttl_ms=self._core.slot_ttl_ms,
            attempt=attempt,
        )
        return self._current

    def _finish(self, command: Reservation | ReserveFailure) -> Reservation | ReserveFailure:
        self._state = ReservationState.DONE
        self._current = None
        return command
