"""ExplainPlacement: every registered worker's eligibility, as a coordinator sees it.

``Client.explain_placement`` asks the block coordinator (read-only: it reserves
nothing and asks no worker); ``blockx why`` prints the answer.
"""

from __future__ import annotations

import dataclasses

from blockx_client.transport import Transport
from blockx_proto import coordinator_v1


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerEligibility:
    """One worker as the coordinator judges it now. ``kind`` is a
    ``blockx_core.coordinator.ReasonKind`` value; ``reason`` says it in words."""

    worker_addr: str
    eligible: bool
    kind: str
    reason: str
    task_slots: int
    used_slots: int
    cpu_fraction: float
    memory_fraction: float
    error_rate: float
    heartbeat_age_ms: int
    breaker_remaining_ms: int
    recent_failures: int


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementReport:
    """Eligible workers first, in the order the coordinator would choose them."""

    coordinator: str
    view_trusted: bool
    not_ready_reason: str
    now_ms: int
    workers: tuple[WorkerEligibility, ...]

    @property
    def eligible(self) -> tuple[WorkerEligibility, ...]:
        return tuple(w for w in self.workers if w.eligible)


async def explain_placement(
    transport: Transport, addr: str, timeout_s: float, worker_addr: str | None = None
) -> PlacementReport:
    stub = coordinator_v1.CoordinatorServiceStub(transport.channel(addr))
    request = coordinator_v1.ExplainPlacementRequest(worker_addr=worker_addr or "")
    reply = await transport.unary(addr, stub.explain_placement(request, timeout=timeout_s))
    return PlacementReport(
        coordinator=addr,
        view_trusted=reply.view_trusted,
        not_ready_reason=reply.not_ready_reason,
        now_ms=reply.now_ms,
        workers=tuple(
            WorkerEligibility(
                worker_addr=w.worker_addr,
                eligible=w.eligible,
                kind=w.kind,
                reason=w.reason,
                task_slots=w.task_slots,
                used_slots=w.used_slots,
                cpu_fraction=w.cpu_fraction,
                memory_fraction=w.memory_fraction,
                error_rate=w.error_rate,
                heartbeat_age_ms=w.heartbeat_age_ms,
                breaker_remaining_ms=w.breaker_remaining_ms,
                recent_failures=w.recent_failures,
            )
            for w in reply.workers
        ),
    )
