"""What ExplainPlacement answers: every worker's eligibility now, and the
ReserveWorkerSlot refusals the Coordinator recalls (``ReservationLoop`` keeps
them; ``convert.explain_response`` puts them on the wire)."""

from __future__ import annotations

import dataclasses
from typing import Final

from blockx_core.coordinator import PlacementExplanation, ReserveFailure, WorkerReason, WorkerView
from blockx_core.errors import Refusal

# Refusals ExplainPlacement recalls, newest first; kept in memory only.
RECENT_REFUSALS: Final = 20


@dataclasses.dataclass(frozen=True, slots=True)
class RecentRefusal:
    """A refused ReserveWorkerSlot past validation, with the explanation it carried."""

    task_id: str
    at_ms: int
    refusal: ReserveFailure
    explanation: PlacementExplanation | None


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementSnapshot:
    """What ExplainPlacement answers: each reason with the view it was judged on,
    and the most recent refusals (newest first)."""

    now_ms: int
    not_ready: Refusal | None
    workers: list[tuple[WorkerReason, WorkerView]]
    recent_refusals: tuple[RecentRefusal, ...] = ()
