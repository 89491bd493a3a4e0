"""ReserveWorkerSlot: the Coordinator's orchestration loop and its gRPC services.

The loop follows the seeds' order exactly: validate (even before readiness) →
readiness (no worker is contacted when the view is not trusted) → up to
MaxCandidates serial candidates, no hedging. For each candidate, RequestTaskSlot
with SlotTTLMs; a definite rejection moves on to the next candidate; an
uncertain outcome is retried on the SAME worker with the SAME task_id up to
MaxTimeoutRetries times and then answered with ABORTED, because switching
workers could leave two slots for one task.

The core is touched only from this event loop, between awaits, so the seeds'
RWMutex has no equivalent here.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from blockx_core.coordinator import Candidate, CoordinatorCore, validate_reserve_request
from blockx_core.errors import ErrorCode
from blockx_core.ids import SlotId, TaskId, WorkerAddr
from blockx_proto import bundlecoordinator_v1, coordinator_v1
from blockx_server.coordinator.slot_reserver import SlotError, SlotGranted, SlotReserver
from blockx_server.runtime.clock import Clock
from blockx_server.runtime.status import COORDINATOR_STATUS

log = logging.getLogger(__name__)


class HandlerConfig(msgspec.Struct, frozen=True, kw_only=True):
    # Same-worker retries after an uncertain outcome; 0 allowed.
    max_timeout_retries: int = 1


class ReserveOutcome(enum.StrEnum):
    """How one ReserveWorkerSlot ended (the metrics label)."""

    RESERVED = "reserved"
    INVALID_ARGUMENT = "invalid_argument"
    UNAVAILABLE = "unavailable"
    NO_EXECUTABLE_SLOT = "no_executable_slot"
    ALL_CANDIDATES_REJECTED = "all_candidates_rejected"
    SLOT_UNCERTAIN = "slot_uncertain"


class SlotAttemptResult(enum.StrEnum):
    """How one RequestTaskSlot to a worker ended (the metrics label)."""

    GRANTED = "granted"
    BACKPRESSURE = "no_slot"
    REJECTED = "rejected"
    UNCERTAIN = "uncertain"


class Reservation(msgspec.Struct, frozen=True):
    task_id: TaskId
    worker_addr: WorkerAddr
    slot_id: SlotId


class ReserveFailure(msgspec.Struct, frozen=True):
    code: ErrorCode
    message: str
    outcome: ReserveOutcome


class ReserveObserver(Protocol):
    """Receives what the loop did; metrics implement it."""

    def reserve_finished(self, outcome: ReserveOutcome, seconds: float) -> None: ...
    def slot_attempt(self, result: SlotAttemptResult) -> None: ...


class _NoObserver:
    def reserve_finished(self, outcome: ReserveOutcome, seconds: float) -> None:
        pass

    def slot_attempt(self, result: SlotAttemptResult) -> None:
        pass


class CoordinatorServer:
    """The orchestration loop over a CoordinatorCore and a SlotReserver."""

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

    async def reserve_worker_slot(self, task_id: TaskId) -> Reservation | ReserveFailure:
        started = time.perf_counter()
        result = await self._reserve(task_id)
        outcome = ReserveOutcome.RESERVED if isinstance(result, Reservation) else result.outcome
        self._observer.reserve_finished(outcome, time.perf_counter() - started)
        return result

    async def _reserve(self, task_id: TaskId) -> Reservation | ReserveFailure:
        core = self._core
        invalid = validate_reserve_request(task_id)
        if invalid is not None:
            return ReserveFailure(invalid.code, invalid.message, ReserveOutcome.INVALID_ARGUMENT)
        not_ready = core.not_ready_reason(self._clock.now_ms())
        if not_ready is not None:
            return ReserveFailure(not_ready.code, not_ready.message, ReserveOutcome.UNAVAILABLE)

        excluded: set[WorkerAddr] = set()
        rejections: list[str] = []
        for _ in range(core.config.max_candidates):
            choice = core.select_candidate(task_id, excluded, self._clock.now_ms())
            if not isinstance(choice, Candidate):
                if rejections:
                    break
                outcome = (
                    ReserveOutcome.UNAVAILABLE
                    if choice.code is ErrorCode.UNAVAILABLE
                    else ReserveOutcome.NO_EXECUTABLE_SLOT
                )
                return ReserveFailure(choice.code, choice.message, outcome)
            addr = choice.worker_addr
            attempt = await self._reserve_on(addr, task_id)
            if isinstance(attempt, Reservation | ReserveFailure):
                return attempt
            excluded.add(addr)
            rejections.append(f"{addr}: {attempt.message}")
        return ReserveFailure(
            ErrorCode.NO_EXECUTABLE_SLOT,
            "all candidates rejected (" + "; ".join(rejections) + ")",
            ReserveOutcome.ALL_CANDIDATES_REJECTED,
        )

    async def _reserve_on(
        self, addr: WorkerAddr, task_id: TaskId
    ) -> Reservation | ReserveFailure | SlotError:
        """Reserve on one worker; a SlotError return is a definite rejection."""
        core = self._core
        attempts = 1 + self._config.max_timeout_retries
        last = ""
        for _ in range(attempts):
            outcome = await self._reserver.request_task_slot(addr, task_id, core.slot_ttl_ms)
            now_ms = self._clock.now_ms()
            if isinstance(outcome, SlotGranted):
                if outcome.slot_id:
                    core.record_slot_success(addr, now_ms)
                    self._observer.slot_attempt(SlotAttemptResult.GRANTED)
                    return Reservation(task_id, addr, outcome.slot_id)
                last = "the worker answered without a slot_id"
            elif outcome.may_have_allocated:
                last = outcome.message
            else:
                if outcome.code is ErrorCode.NO_SLOT:
                    core.record_slot_backpressure(addr, now_ms)
                    self._observer.slot_attempt(SlotAttemptResult.BACKPRESSURE)
                else:
                    core.record_slot_rejection(addr, now_ms)
                    self._observer.slot_attempt(SlotAttemptResult.REJECTED)
                return outcome
            self._observer.slot_attempt(SlotAttemptResult.UNCERTAIN)
            log.warning("uncertain RequestTaskSlot on %s for task %s: %s", addr, task_id, last)
        core.record_slot_timeout(addr, self._clock.now_ms())
        return ReserveFailure(
            ErrorCode.SLOT_UNCERTAIN,
            f"unable to confirm slot reservation on {addr} after {attempts} attempt(s) "
            f"({last}); a slot may be held for this task_id until its TTL "
            f"({core.slot_ttl_ms} ms) passes: retry with the same task_id after that",
            ReserveOutcome.SLOT_UNCERTAIN,
        )


def failure_to_grpc(failure: ReserveFailure) -> GRPCError:
    return GRPCError(COORDINATOR_STATUS.get(failure.code, Status.INTERNAL), failure.message)


ReserveFn = Callable[[TaskId], Awaitable[Reservation | ReserveFailure]]


async def _reserve_or_raise(reserve: ReserveFn, task_id: TaskId) -> Reservation:
    result = await reserve(task_id)
    if isinstance(result, ReserveFailure):
        raise failure_to_grpc(result)
    return result


class CoordinatorService(coordinator_v1.CoordinatorServiceBase):
    """coordinator.v1.CoordinatorService (the block cluster)."""

    def __init__(self, server: CoordinatorServer) -> None:
        self._server = server

    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        r = await _reserve_or_raise(self._server.reserve_worker_slot, message.task_id)
        return coordinator_v1.ReserveWorkerSlotResponse(
            task_id=r.task_id, worker_addr=r.worker_addr, slot_id=r.slot_id
        )


class BundleCoordinatorService(bundlecoordinator_v1.BundleCoordinatorServiceBase):
    """bundlecoordinator.v1.BundleCoordinatorService: the same loop, its own identity."""

    def __init__(self, server: CoordinatorServer) -> None:
        self._server = server

    async def reserve_worker_slot(
        self, message: bundlecoordinator_v1.ReserveWorkerSlotRequest
    ) -> bundlecoordinator_v1.ReserveWorkerSlotResponse:
        r = await _reserve_or_raise(self._server.reserve_worker_slot, message.task_id)
        return bundlecoordinator_v1.ReserveWorkerSlotResponse(
            task_id=r.task_id, worker_addr=r.worker_addr, slot_id=r.slot_id
        )
