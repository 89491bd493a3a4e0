"""Dispatcher configuration: windows, budgets, the retry policy."""

from __future__ import annotations

import msgspec

from blockx_core.backoff import Backoff
from blockx_core.errors import InvalidConfig
from blockx_core.failures import CallFailureKind


class CallRetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Bounded per-call attempt retries (no task-level retry)."""

    max_attempts: int = 3
    backoff_ms: int = 100
    backoff_max_ms: int = 2_000
    retry_on: frozenset[CallFailureKind] = frozenset({CallFailureKind.EXECUTOR_LOST})

    def backoff_for(self, failed_attempt: int) -> int:
        """Delay before the attempt after ``failed_attempt`` (1-based): the back-off's
        ceiling, without jitter (a call's retry is one of a task's, not one of many
        clients' coming back at once)."""
        schedule = Backoff(initial_s=self.backoff_ms, max_s=self.backoff_max_ms)
        return int(schedule.ceiling(min(failed_attempt, 32)))

    def validate(self) -> None:
        if self.max_attempts < 1:
            raise InvalidConfig("max_attempts", f"must be >= 1 (got {self.max_attempts})")
        if self.backoff_ms < 0:
            raise InvalidConfig("backoff_ms", f"must be >= 0 (got {self.backoff_ms})")
        if self.backoff_max_ms < self.backoff_ms:
            raise InvalidConfig(
                "backoff_max_ms",
                f"must be >= backoff_ms ({self.backoff_max_ms} < {self.backoff_ms})",
            )


class DispatchConfig(msgspec.Struct, frozen=True, kw_only=True):
    # Calls in flight per task, reached by doubling from initial_window.
    task_max_inflight_calls: int = 1024
    initial_window: int = 64
    # CPU + IO budget of one call attempt (CallDeadlineMs).
    call_deadline_ms: int = 5_000
    # Sum of the root calls' outputs (JSON bytes) a task may collect.
    max_collected_output_bytes: int = 64 * 1024 * 1024
    # An executor that has not heartbeated for this long is killed.
    executor_heartbeat_timeout_ms: int = 3_000
    # At most this many calls in one ExecuteCalls batch.
    max_batch_calls: int = 512
    retry: CallRetryPolicy = CallRetryPolicy()
    # Wall time one call attempt may hold its executor (running, not suspended on
    # IO or a sub-call), measured by the Worker; None = 3 x call_deadline_ms.
    call_wall_limit_ms: int | None = None
    # A call told to stop (CancelCalls) that still holds its executor this much
    # later gets the executor killed.
    cancel_grace_ms: int = 500
    # An executor is retired (replaced once idle) after this many calls, or when its
    # resident memory stays above executor_max_rss_bytes between calls.
    executor_max_calls: int = 100_000
    executor_max_rss_bytes: int = 1 << 30
    # The CPUs the executors run on: a task whose calls keep their executors busy
    # sends its root calls to this many of them (``_lanes.py``); 0: to all of them.
    cpu_lanes: int = 0

    @property
    def wall_limit_ms(self) -> int:
        if self.call_wall_limit_ms is None:
            return 3 * self.call_deadline_ms
        return self.call_wall_limit_ms

    def validate(self) -> None:
        for name in (
            "task_max_inflight_calls",
            "initial_window",
            "call_deadline_ms",
            "max_collected_output_bytes",
            "executor_heartbeat_timeout_ms",
            "max_batch_calls",
            "wall_limit_ms",
            "cancel_grace_ms",
            "executor_max_calls",
            "executor_max_rss_bytes",
        ):
            if getattr(self, name) < 1:
                raise InvalidConfig(name, f"must be >= 1 (got {getattr(self, name)})")
        if self.cpu_lanes < 0:
            raise InvalidConfig("cpu_lanes", f"must be >= 0 (got {self.cpu_lanes})")
        self.retry.validate()
