"""ReservationLoop: performs the RequestTaskSlot calls a ReservationCore asks for.

Every decision of a ReserveWorkerSlot (validation, readiness, which worker,
retry on the same worker or move on, the final answer and its metrics label) is
``blockx_core.coordinator.ReservationCore``'s. This loop only reads the clock,
performs each ``TrySlot`` through a ``SlotReserver``, feeds the answer back and
reports what happened to an observer.

The cores are touched only from this event loop, between awaits, so no lock is
needed around them.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Final, Protocol, assert_never

import msgspec
from opentelemetry.trace import SpanKind

from blockx_core.coordinator import (
    CoordinatorCore,
    PlacementExplanation,
    Reservation,
    ReservationCore,
    ReserveFailure,
    ReserveOutcome,
    SlotAttemptResult,
    TrySlot,
    classify_slot_answer,
    describe_slot_answer,
)
from blockx_core.ids import TaskId, WorkerAddr
from blockx_server.coordinator.placement import RECENT_REFUSALS, PlacementSnapshot, RecentRefusal
from blockx_server.coordinator.slot_reserver import SlotReserver
from blockx_server.runtime.clock import Clock
from blockx_server.runtime.tracing import TRACER, incoming_context

log = logging.getLogger(__name__)


class HandlerConfig(msgspec.Struct, frozen=True, kw_only=True):
    # Same-worker retries after an uncertain outcome; 0 allowed.
    max_timeout_retries: int = 1


class ReserveObserver(Protocol):
    """Receives what the loop did; metrics implement it."""

    def reserve_finished(self, outcome: ReserveOutcome, seconds: float, reason: str) -> None:
        """``reason``: how the last worker asked answered (a SlotAttemptResult), or
        NONE_TRIED when no worker was asked."""

    def slot_attempt(self, result: SlotAttemptResult) -> None: ...


NONE_TRIED: Final = "none_tried"


class _NoObserver:
    def reserve_finished(self, outcome: ReserveOutcome, seconds: float, reason: str) -> None:
        pass

    def slot_attempt(self, result: SlotAttemptResult) -> None:
        pass


class ReservationLoop:
    """ReserveWorkerSlot over a CoordinatorCore and a SlotReserver."""

    def __init__(
        self,
        core: CoordinatorCore,
        reserver: SlotReserver,
        clock: Clock,
        config: HandlerConfig | None = None,
        observer: ReserveObserver | None = None,
    ) -> None:
        self._core = core
        self._reserver = reserver
        self._clock = clock
        self._config = config or HandlerConfig()
        self._observer = observer or _NoObserver()
        self._refusals: collections.deque[RecentRefusal] = collections.deque(maxlen=RECENT_REFUSALS)

    async def reserve_worker_slot(self, task_id: TaskId) -> Reservation | ReserveFailure:
        result, _ = await self.reserve_explained(task_id)
        return result

    async def reserve_explained(
        self, task_id: TaskId
    ) -> tuple[Reservation | ReserveFailure, PlacementExplanation | None]:
        """The answer, and for a refusal for want of a slot what each worker answered
        or why it was not asked (None for a grant or an invalid request, whose message
        says it all). ExplainPlacement recalls every refusal past the Coordinator's own
        validation, with its explanation."""
        started = time.perf_counter()
        reservation = ReservationCore(
            self._core, max_timeout_retries=self._config.max_timeout_retries
        )
        last: list[SlotAttemptResult] = []
        explanation = None
        # Current while it runs: each RequestTaskSlot carries it to the Worker.
        with TRACER.start_as_current_span(
            "ReserveWorkerSlot",
            context=incoming_context(),
            kind=SpanKind.SERVER,
            attributes={"blockx.task_id": task_id},
        ) as span:
            result = await self._run(reservation, task_id, last)
            if isinstance(result, Reservation):
                outcome = ReserveOutcome.RESERVED
            else:
                outcome = result.outcome
                # A Worker asked, or no invalid task_id: past the Coordinator's validation.
                if outcome is not ReserveOutcome.INVALID_ARGUMENT or last:
                    now_ms = self._clock.now_ms()
                    recalled = reservation.explain(now_ms)
                    self._refusals.appendleft(RecentRefusal(task_id, now_ms, result, recalled))
                    if outcome is not ReserveOutcome.INVALID_ARGUMENT:
                        explanation = recalled
            reason = last[-1].value if last else NONE_TRIED
            span.set_attributes({"blockx.outcome": outcome.value, "blockx.reason": reason})
        self._observer.reserve_finished(outcome, time.perf_counter() - started, reason)
        return result, explanation

    def explain(self, worker_addr: WorkerAddr | None = None) -> PlacementSnapshot:
        """Every worker's eligibility now (or only ``worker_addr``'s), for ExplainPlacement."""
        now_ms = self._clock.now_ms()
        core = self._core
        reasons = core.explain(now_ms, worker_addr)
        views = [core.worker(r.worker_addr) for r in reasons]
        return PlacementSnapshot(
            now_ms=now_ms,
            not_ready=core.not_ready_reason(now_ms),
            workers=[(r, v) for r, v in zip(reasons, views, strict=True) if v is not None],
            recent_refusals=tuple(self._refusals),
        )

    async def _run(
        self, reservation: ReservationCore, task_id: TaskId, attempts: list[SlotAttemptResult]
    ) -> Reservation | ReserveFailure:
        command = reservation.start(task_id, self._clock.now_ms())
        while True:
            match command:
                case TrySlot(worker_addr=addr, task_id=task_id, ttl_ms=ttl_ms):
                    answer = await self._reserver.request_task_slot(addr, task_id, ttl_ms)
                    result = classify_slot_answer(answer)
                    self._observer.slot_attempt(result)
                    attempts.append(result)
                    if result is SlotAttemptResult.UNCERTAIN:
                        log.warning(
                            "uncertain RequestTaskSlot on %s for task %s: %s",
                            addr,
                            task_id,
                            describe_slot_answer(answer),
                        )
                    command = reservation.attempt_answered(answer, self._clock.now_ms())
                case Reservation() | ReserveFailure():
                    return command
                case _:
                    assert_never(command)
