"""The Coordinator's sans-IO core: configuration, worker view, candidate selection,
and the decisions of one ReserveWorkerSlot."""

from blockx_core.coordinator._config import CoordinatorConfig
from blockx_core.coordinator._core import (
    Candidate,
    CoordinatorCore,
    SelectResult,
    validate_reserve_request,
)
from blockx_core.coordinator._index import CandidateIndex, rank_key
from blockx_core.coordinator._reservation import (
    Reservation,
    ReservationCore,
    ReservationEvent,
    ReservationState,
    ReserveCommand,
    ReserveFailure,
    ReserveOutcome,
    TrySlot,
)
from blockx_core.coordinator._slot import (
    SlotAnswer,
    SlotAttemptResult,
    SlotError,
    SlotGranted,
    classify_slot_answer,
    describe_slot_answer,
)
from blockx_core.coordinator._view import WorkerView

__all__ = [
    "Candidate",
    "CandidateIndex",
    "CoordinatorConfig",
    "CoordinatorCore",
    "Reservation",
    "ReservationCore",
    "ReservationEvent",
    "ReservationState",
    "ReserveCommand",
    "ReserveFailure",
    "ReserveOutcome",
    "SelectResult",
    "SlotAnswer",
    "SlotAttemptResult",
    "SlotError",
    "SlotGranted",
    "TrySlot",
    "WorkerView",
    "classify_slot_answer",
    "describe_slot_answer",
    "rank_key",
    "validate_reserve_request",
]
