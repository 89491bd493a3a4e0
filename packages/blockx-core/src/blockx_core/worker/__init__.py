"""The Worker's sans-IO core: slot table, task lifecycle, results, timers."""

from typing import TYPE_CHECKING

from blockx_core.worker._config import MAX_FAILED_TASKS_KEPT, WorkerConfig
from blockx_core.worker._description import WorkerDescription
from blockx_core.worker._listing import (
    DEFAULT_PAGE_SIZE,
    FAILURE_SUMMARY_CHARS,
    MAX_PAGE_SIZE,
    ListedTask,
    ListTasksQuery,
    RunningTask,
    TaskListing,
)
from blockx_core.worker._progress import PROGRESS_INTERVAL_MS, CallProgress
from blockx_core.worker._retention import result_bytes
from blockx_core.worker._rules import WORKER_FAULTS, is_worker_fault
from blockx_core.worker._types import (
    AbortTaskWork,
    CancelAnswer,
    CancelOutcome,
    InvalidTransition,
    PhaseCrashed,
    PhaseFailed,
    PhaseOutcome,
    PhaseStart,
    PhaseSucceeded,
    PrepareTaskActivation,
    PublishProgress,
    RetentionStats,
    SlotExpired,
    SlotState,
    StartBuilderPhase,
    StartCallPhase,
    StartWriterPhase,
    TaskConverged,
    TaskPhase,
    TaskSnapshot,
    WorkerCommand,
)
from blockx_core.worker._watch_stream import UnknownTask, WatchedTask, WatchStart, WatchStream

if TYPE_CHECKING:
    from blockx_core.worker._core import WorkerCore


def __getattr__(name: str) -> object:
    # The engine is loaded on first use: a client that reads only the listing and
    # description types (the CLI) never pays for it.
    if name == "WorkerCore":
        from blockx_core.worker._core import WorkerCore

        return WorkerCore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_PAGE_SIZE",
    "FAILURE_SUMMARY_CHARS",
    "MAX_FAILED_TASKS_KEPT",
    "MAX_PAGE_SIZE",
    "PROGRESS_INTERVAL_MS",
    "WORKER_FAULTS",
    "AbortTaskWork",
    "CallProgress",
    "CancelAnswer",
    "CancelOutcome",
    "InvalidTransition",
    "ListTasksQuery",
    "ListedTask",
    "PhaseCrashed",
    "PhaseFailed",
    "PhaseOutcome",
    "PhaseStart",
    "PhaseSucceeded",
    "PrepareTaskActivation",
    "PublishProgress",
    "RetentionStats",
    "RunningTask",
    "SlotExpired",
    "SlotState",
    "StartBuilderPhase",
    "StartCallPhase",
    "StartWriterPhase",
    "TaskConverged",
    "TaskListing",
    "TaskPhase",
    "TaskSnapshot",
    "UnknownTask",
    "WatchStart",
    "WatchStream",
    "WatchedTask",
    "WorkerCommand",
    "WorkerConfig",
    "WorkerCore",
    "WorkerDescription",
    "is_worker_fault",
    "result_bytes",
]
