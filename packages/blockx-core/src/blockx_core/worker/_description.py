"""What a Worker is doing now, as DescribeWorker answers it (see docs/worker.md):
the Worker builds it from its parts, a client decodes the answer into it."""

from __future__ import annotations

import msgspec

from blockx_core.dispatch import CallsWaiting, ExecutorState
from blockx_core.load_series import LoadPoint
from blockx_core.worker._listing import ListedTask, RunningTask


class WorkerDescription(msgspec.Struct, frozen=True, kw_only=True):
    """One Worker now: its slots, executors and the calls they hold, the tasks it
    runs (the first ``running`` asked for, oldest first), its last failed tasks
    (newest first), its limits and its load series. Times are on its own clock."""

    worker_addr: str
    program: str
    now_ms: int
    started_ms: int
    ready: bool
    draining: bool
    task_slots: int
    reserved_slots: int
    running_tasks: int
    executors_configured: int
    executors: tuple[ExecutorState, ...]
    executor_restarts: int
    calls_waiting: CallsWaiting
    calls_in_flight: int
    code_epoch: int
    process_rss_bytes: int
    call_deadline_ms: int
    call_wall_limit_ms: int
    running: tuple[RunningTask, ...]
    recent_failures: tuple[ListedTask, ...]
    failed_tasks_kept: int
    result_retention_ms: int
    load_interval_ms: int
    load: tuple[LoadPoint, ...]

    @property
    def executors_busy(self) -> int:
        return sum(1 for e in self.executors if e.busy)
