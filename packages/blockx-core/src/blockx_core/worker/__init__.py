"""The Worker's sans-IO core: slot table, task lifecycle, results, timers."""

from blockx_core.worker._config import MAX_FAILED_TASKS_KEPT, WorkerConfig
from blockx_core.worker._core import WorkerCore
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
from blockx_core.worker._types import (
    AbortTaskWork,
    CancelAnswer,
    CancelOutcome,
    InvalidTransition,
    PhaseOutcome,
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

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "FAILURE_SUMMARY_CHARS",
    "MAX_FAILED_TASKS_KEPT",
    "MAX_PAGE_SIZE",
    "PROGRESS_INTERVAL_MS",
    "AbortTaskWork",
    "CallProgress",
    "CancelAnswer",
    "CancelOutcome",
    "InvalidTransition",
    "ListTasksQuery",
    "ListedTask",
    "PhaseOutcome",
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
    "WorkerCommand",
    "WorkerConfig",
    "WorkerCore",
    "result_bytes",
]
