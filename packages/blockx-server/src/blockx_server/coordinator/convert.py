"""The Coordinator's only protobuf (and gRPC status) conversion.

Core values on one side, ``blockx_proto`` messages and ``GRPCError`` on the
other: the servicers and the slot reserver call these and build no message
themselves.
"""

from __future__ import annotations

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from blockx_core.coordinator import (
    PLACEMENT_METADATA_KEY,
    PlacementExplanation,
    ReasonKind,
    Reservation,
    SlotGranted,
    WorkerReason,
    WorkerView,
    describe_reason,
    encode_explanation,
)
from blockx_core.errors import Refusal
from blockx_core.ids import TaskId
from blockx_proto import bundlecoordinator_v1, coordinator_v1, worker_v1
from blockx_server.coordinator.placement import PlacementSnapshot, RecentRefusal
from blockx_server.runtime.status import COORDINATOR_STATUS, status_error


def request_task_slot_request(task_id: TaskId, ttl_ms: int) -> worker_v1.RequestTaskSlotRequest:
    return worker_v1.RequestTaskSlotRequest(task_id=task_id, ttl_ms=ttl_ms)


def slot_granted_from(snapshot: worker_v1.TaskSnapshot) -> SlotGranted:
    """The Worker's answer as it came; an empty slot_id stays empty (not a grant)."""
    return SlotGranted(snapshot.slot_id, snapshot.lease_deadline_ms)


def reserve_response(reservation: Reservation) -> coordinator_v1.ReserveWorkerSlotResponse:
    return coordinator_v1.ReserveWorkerSlotResponse(
        task_id=reservation.task_id,
        worker_addr=reservation.worker_addr,
        slot_id=reservation.slot_id,
    )


def bundle_reserve_response(
    reservation: Reservation,
) -> bundlecoordinator_v1.ReserveWorkerSlotResponse:
    return bundlecoordinator_v1.ReserveWorkerSlotResponse(
        task_id=reservation.task_id,
        worker_addr=reservation.worker_addr,
        slot_id=reservation.slot_id,
    )


def refusal_to_grpc(refusal: Refusal) -> GRPCError:
    """The status of a refused ReserveWorkerSlot, from the one Coordinator table."""
    return status_error(refusal_status(refusal), refusal.message)


def refusal_status(refusal: Refusal) -> Status:
    return COORDINATOR_STATUS.get(refusal.code, Status.INTERNAL)


def placement_metadata(explanation: PlacementExplanation | None) -> list[tuple[str, bytes]]:
    """The trailing metadata of a refused ReserveWorkerSlot (none without workers)."""
    if explanation is None or not (explanation.workers or explanation.omitted):
        return []
    return [(PLACEMENT_METADATA_KEY, encode_explanation(explanation))]


def _eligibility(
    reason: WorkerReason, view: WorkerView, now_ms: int
) -> coordinator_v1.WorkerEligibility:
    hb = view.heartbeat
    return coordinator_v1.WorkerEligibility(
        worker_addr=reason.worker_addr,
        eligible=reason.kind is ReasonKind.ELIGIBLE,
        kind=reason.kind.value,
        reason=describe_reason(reason),
        task_slots=hb.task_slots,
        used_slots=hb.used_total,
        cpu_fraction=hb.cpu_percent,
        memory_fraction=hb.memory_percent,
        error_rate=hb.error_rate,
        heartbeat_age_ms=now_ms - hb.last_heartbeat_ms,
        breaker_remaining_ms=max(0, view.circuit_breaker_deadline_ms - now_ms),
        recent_failures=view.recent_failure_count,
    )


def explain_response(snapshot: PlacementSnapshot) -> coordinator_v1.ExplainPlacementResponse:
    return coordinator_v1.ExplainPlacementResponse(
        view_trusted=snapshot.not_ready is None,
        not_ready_reason="" if snapshot.not_ready is None else snapshot.not_ready.message,
        workers=[_eligibility(r, v, snapshot.now_ms) for r, v in snapshot.workers],
        now_ms=snapshot.now_ms,
        recent_refusals=[_recent_refusal(r) for r in snapshot.recent_refusals],
    )


def _recent_refusal(recent: RecentRefusal) -> coordinator_v1.RecentRefusal:
    explanation = recent.explanation or PlacementExplanation()
    return coordinator_v1.RecentRefusal(
        task_id=recent.task_id,
        at_ms=recent.at_ms,
        code=recent.refusal.code.value,
        message=recent.refusal.message,
        workers=[
            coordinator_v1.RefusedWorker(
                worker_addr=w.worker_addr, kind=w.kind.value, reason=describe_reason(w)
            )
            for w in explanation.workers
        ],
        omitted=explanation.omitted,
    )
