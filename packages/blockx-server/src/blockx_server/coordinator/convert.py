"""The Coordinator's only protobuf (and gRPC status) conversion.

Core values on one side, ``blockx_proto`` messages and ``GRPCError`` on the
other: the servicers and the slot reserver call these and build no message
themselves.
"""

from __future__ import annotations

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from blockx_core.coordinator import Reservation, SlotGranted
from blockx_core.errors import Refusal
from blockx_core.ids import TaskId
from blockx_proto import bundlecoordinator_v1, coordinator_v1, worker_v1
from blockx_server.runtime.status import COORDINATOR_STATUS


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
    return GRPCError(COORDINATOR_STATUS.get(refusal.code, Status.INTERNAL), refusal.message)
