"""The Coordinator's gRPC servicers: decode, run the ReservationLoop, encode.

``coordinator.v1.CoordinatorService`` (the block cluster) and
``bundlecoordinator.v1.BundleCoordinatorService`` (the bundle cluster) are the
same loop under two service identities; each process registers only its own.
"""

from __future__ import annotations

from blockx_core.coordinator import Reservation, ReserveFailure
from blockx_core.ids import TaskId
from blockx_proto import bundlecoordinator_v1, coordinator_v1
from blockx_server.coordinator.convert import (
    bundle_reserve_response,
    refusal_to_grpc,
    reserve_response,
)
from blockx_server.coordinator.reservation import ReservationLoop


async def _reserve_or_raise(loop: ReservationLoop, task_id: TaskId) -> Reservation:
    result = await loop.reserve_worker_slot(task_id)
    if isinstance(result, ReserveFailure):
        raise refusal_to_grpc(result)
    return result


class CoordinatorService(coordinator_v1.CoordinatorServiceBase):
    """coordinator.v1.CoordinatorService (the block cluster)."""

    def __init__(self, loop: ReservationLoop) -> None:
        self._loop = loop

    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        return reserve_response(await _reserve_or_raise(self._loop, message.task_id))


class BundleCoordinatorService(bundlecoordinator_v1.BundleCoordinatorServiceBase):
    """bundlecoordinator.v1.BundleCoordinatorService: the same loop, its own identity."""

    def __init__(self, loop: ReservationLoop) -> None:
        self._loop = loop

    async def reserve_worker_slot(
        self, message: bundlecoordinator_v1.ReserveWorkerSlotRequest
    ) -> bundlecoordinator_v1.ReserveWorkerSlotResponse:
        return bundle_reserve_response(await _reserve_or_raise(self._loop, message.task_id))
