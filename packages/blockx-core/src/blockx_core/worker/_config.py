"""WorkerCore configuration; the defaults are the specification's."""

from __future__ import annotations

import msgspec

from blockx_core.errors import InvalidConfig

HOUR_MS = 3_600_000
# The most failed tasks a Worker remembers: each summary costs about 1 KB.
MAX_FAILED_TASKS_KEPT = 1_000_000


class WorkerConfig(msgspec.Struct, frozen=True, kw_only=True):
    task_slots: int = 50
    # TTL of the slot SubmitTask reserves inline when it has no slot_id.
    default_ttl_ms: int = 5_000
    # The longest lease RequestTaskSlot grants: a larger ttl_ms is refused, so no
    # caller can hold every slot until a restart.
    max_slot_ttl_ms: int = 60_000
    # Effective task timeout when task_timeout_ms is 0.
    task_deadline_ms: int = 300_000
    max_task_timeout_ms: int = 8 * HOUR_MS
    result_retention_ms: int = 300_000
    # Retained results past this many bytes drop their outputs, oldest first, and
    # leave a tombstone; at most result_tombstones_max tombstones are kept.
    result_retention_max_bytes: int = 1 << 30
    result_tombstones_max: int = 100_000
    # The last this many failed tasks are remembered (a summary, no outputs) after
    # their results expire, for ListTasks with include_expired; 0 keeps none.
    failed_tasks_kept: int = 1_000
    # 0 disables Watch as a run credential.
    watch_disconnect_grace_ms: int = 0

    def validate(self) -> None:
        for name in (
            "task_slots",
            "default_ttl_ms",
            "max_slot_ttl_ms",
            "task_deadline_ms",
            "max_task_timeout_ms",
            "result_retention_ms",
            "result_retention_max_bytes",
            "result_tombstones_max",
        ):
            if getattr(self, name) < 1:
                raise InvalidConfig(name, f"must be >= 1 (got {getattr(self, name)})")
        if not 0 <= self.failed_tasks_kept <= MAX_FAILED_TASKS_KEPT:
            raise InvalidConfig(
                "failed_tasks_kept",
                f"must be 0 to {MAX_FAILED_TASKS_KEPT} (got {self.failed_tasks_kept})",
            )
        if self.watch_disconnect_grace_ms < 0:
            raise InvalidConfig(
                "watch_disconnect_grace_ms", f"must be >= 0 (got {self.watch_disconnect_grace_ms})"
            )
        if self.default_ttl_ms > self.max_slot_ttl_ms:
            raise InvalidConfig(
                "default_ttl_ms",
                f"must be <= max_slot_ttl_ms ({self.default_ttl_ms} > {self.max_slot_ttl_ms})",
            )
        if self.task_deadline_ms > self.max_task_timeout_ms:
            raise InvalidConfig(
                "task_deadline_ms",
                f"must be <= max_task_timeout_ms ({self.task_deadline_ms} > "
                f"{self.max_task_timeout_ms})",
            )
