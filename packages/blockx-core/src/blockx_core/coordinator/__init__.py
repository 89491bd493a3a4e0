"""The Coordinator's sans-IO core: configuration, worker view, candidate selection."""

from blockx_core.coordinator._config import CoordinatorConfig
from blockx_core.coordinator._core import (
    Candidate,
    CoordinatorCore,
    CoordinatorError,
    SelectResult,
    validate_reserve_request,
)
from blockx_core.coordinator._index import CandidateIndex, rank_key
from blockx_core.coordinator._view import WorkerView

__all__ = [
    "Candidate",
    "CandidateIndex",
    "CoordinatorConfig",
    "CoordinatorCore",
    "CoordinatorError",
    "SelectResult",
    "WorkerView",
    "rank_key",
    "validate_reserve_request",
]
