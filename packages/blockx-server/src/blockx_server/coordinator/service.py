"""The Coordinator's gRPC servicers: decode, run the ReservationLoop, encode.

``coordinator.v1.CoordinatorService`` (the block cluster) and
``bundlecoordinator.v1.BundleCoordinatorService`` (the bundle cluster) are the
same loop under two service identities; each process registers only its own.

ReserveWorkerSlot is served from the stream rather than through the generated
method, because a refusal carries the placement explanation in its trailing
metadata (``blockx-placement-bin``), which a raised GRPCError cannot.
ExplainPlacement answers every worker's eligibility (read-only); both services
serve it, with coordinator.v1's messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol, TypeVar

import grpclib.const
from grpclib.server import Stream

from blockx_core.coordinator import Reservation, ReserveFailure
from blockx_core.ids import TaskId
from blockx_proto import bundlecoordinator_v1, coordinator_v1
from blockx_server.coordinator.convert import (
    bundle_reserve_response,
    explain_response,
    placement_metadata,
    refusal_status,
    refusal_to_grpc,
    reserve_response,
)
from blockx_server.coordinator.reservation import ReservationLoop

_RESERVE: Final = "/coordinator.v1.CoordinatorService/ReserveWorkerSlot"
_BUNDLE_RESERVE: Final = "/bundlecoordinator.v1.BundleCoordinatorService/ReserveWorkerSlot"


class _ReserveRequest(Protocol):
    task_id: str


Req = TypeVar("Req", bound=_ReserveRequest)
Resp = TypeVar("Resp")


async def _reserve_or_raise(loop: ReservationLoop, task_id: TaskId) -> Reservation:
    result = await loop.reserve_worker_slot(task_id)
    if isinstance(result, ReserveFailure):
        raise refusal_to_grpc(result)
    return result


async def _serve_reserve(
    loop: ReservationLoop, stream: Stream[Req, Resp], respond: Callable[[Reservation], Resp]
) -> None:
    """One ReserveWorkerSlot: the grant, or the refusal with its explanation."""
    request = await stream.recv_message()
    assert request is not None  # grpclib only calls a unary handler with a message
    result, explanation = await loop.reserve_explained(request.task_id)
    if isinstance(result, ReserveFailure):
        await stream.send_trailing_metadata(
            status=refusal_status(result),
            status_message=result.message,
            metadata=placement_metadata(explanation),
        )
        return
    await stream.send_message(respond(result))


def _with_reserve(
    mapping: dict[str, grpclib.const.Handler],
    route: str,
    handler: Callable[[Stream[Req, Resp]], object],
) -> dict[str, grpclib.const.Handler]:
    mapping[route] = mapping[route]._replace(func=handler)
    return mapping


class CoordinatorService(coordinator_v1.CoordinatorServiceBase):
    """coordinator.v1.CoordinatorService (the block cluster)."""

    def __init__(self, loop: ReservationLoop) -> None:
        self._loop = loop

    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        return reserve_response(await _reserve_or_raise(self._loop, message.task_id))

    async def explain_placement(
        self, message: coordinator_v1.ExplainPlacementRequest
    ) -> coordinator_v1.ExplainPlacementResponse:
        return explain_response(self._loop.explain(message.worker_addr or None))

    async def _reserve_stream(
        self,
        stream: Stream[
            coordinator_v1.ReserveWorkerSlotRequest, coordinator_v1.ReserveWorkerSlotResponse
        ],
    ) -> None:
        await _serve_reserve(self._loop, stream, reserve_response)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return _with_reserve(super().__mapping__(), _RESERVE, self._reserve_stream)


class BundleCoordinatorService(bundlecoordinator_v1.BundleCoordinatorServiceBase):
    """bundlecoordinator.v1.BundleCoordinatorService: the same loop, its own identity."""

    def __init__(self, loop: ReservationLoop) -> None:
        self._loop = loop

    async def reserve_worker_slot(
        self, message: bundlecoordinator_v1.ReserveWorkerSlotRequest
    ) -> bundlecoordinator_v1.ReserveWorkerSlotResponse:
        return bundle_reserve_response(await _reserve_or_raise(self._loop, message.task_id))

    async def explain_placement(
        self, message: coordinator_v1.ExplainPlacementRequest
    ) -> coordinator_v1.ExplainPlacementResponse:
        return explain_response(self._loop.explain(message.worker_addr or None))

    async def _reserve_stream(
        self,
        stream: Stream[
            bundlecoordinator_v1.ReserveWorkerSlotRequest,
            bundlecoordinator_v1.ReserveWorkerSlotResponse,
        ],
    ) -> None:
        await _serve_reserve(self._loop, stream, bundle_reserve_response)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return _with_reserve(super().__mapping__(), _BUNDLE_RESERVE, self._reserve_stream)
