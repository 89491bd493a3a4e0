"""The call records a Worker keeps: those of the root calls that failed its tasks,
for ``GetCallRecord`` (``blockx replay``).

A record is kept as its JSON document, from the moment its call fails the task,
for as long as the task's result is retained (RESULT_RETENTION_MS; the service
asks the Worker core whether the task still is, so a record never outlives its
result). Bounded: at most ``PER_TASK`` records per task and ``MAX_BYTES`` in all;
past that the oldest records go first. What a call records while it runs is
bounded by CALL_RECORD_MAX_BYTES; a call that succeeds keeps nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from blockx_core.ids import shown

# Records kept per task (a task fails on its first failed root call, so one is the
# rule) and in all, per Worker: 16 records of the default 4 MiB.
PER_TASK: Final = 4
MAX_BYTES: Final = 64 * 1024 * 1024


class _TaskRecords:
    __slots__ = ("records", "until_ms")

    def __init__(self, until_ms: int) -> None:
        self.until_ms = until_ms
        self.records: dict[int, bytes] = {}  # root index -> record document


class CallRecordStore:
    """Failed calls' records by task and root index; see the module docstring."""

    def __init__(
        self,
        record_max_bytes: int,
        retention_ms: int,
        *,
        max_bytes: int = MAX_BYTES,
        per_task: int = PER_TASK,
    ) -> None:
        # CALL_RECORD_MAX_BYTES, what each call records (0: recording is off).
        self.record_max_bytes = record_max_bytes
        self.retention_ms = retention_ms
        self.max_bytes = max_bytes
        self.per_task = per_task
        self.size = 0
        self._tasks: OrderedDict[str, _TaskRecords] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return sum(len(kept.records) for kept in self._tasks.values())

    def keep(self, task_id: str, index: int, record: bytes, now_ms: int) -> None:
        """Keep ``record`` of root call ``index`` of ``task_id``, dropping the oldest
        records for room; one larger than the whole bound is not kept."""
        self.expire(now_ms)
        if len(record) > self.max_bytes:
            return
        kept = self._tasks.get(task_id)
        if kept is None:
            kept = self._tasks[task_id] = _TaskRecords(now_ms + self.retention_ms)
        if index in kept.records or len(kept.records) >= self.per_task:
            return
        kept.records[index] = record
        self.size += len(record)
        while self.size > self.max_bytes:
            self._drop_oldest()

    def get(self, task_id: str, index: int | None, now_ms: int) -> tuple[int, bytes] | str:
        """The record of root call ``index`` (None: the first kept) of a task that
        failed, with its index, or why there is none, for people."""
        self.expire(now_ms)
        kept = self._tasks.get(task_id)
        if kept is None or not kept.records:
            if not self.record_max_bytes:
                return "this Worker records no calls (CALL_RECORD_MAX_BYTES=0)"
            return (
                f"no call record is kept for task {shown(task_id)}: no call of it ran and "
                "failed it (its Builder or Writer did, or its function does not exist), "
                "or its record was dropped to keep this Worker's records within "
                f"{self.max_bytes} bytes"
            )
        if index is None:
            index = min(kept.records)
        record = kept.records.get(index)
        if record is None:
            failed = ", ".join(str(i) for i in sorted(kept.records))
            return (
                f"call {index} of task {shown(task_id)} did not fail it: only failed calls "
                f"are recorded (the failed call: {failed})"
            )
        return index, record

    def forget(self, task_id: str) -> None:
        kept = self._tasks.pop(task_id, None)
        if kept is not None:
            self.size -= sum(len(r) for r in kept.records.values())

    def expire(self, now_ms: int) -> None:
        """Drop the records past the retention of their tasks' results."""
        tasks = self._tasks
        while tasks:
            task_id, kept = next(iter(tasks.items()))
            if kept.until_ms > now_ms:
                return
            self.forget(task_id)

    def _drop_oldest(self) -> None:
        task_id, kept = next(iter(self._tasks.items()))
        index = min(kept.records)
        self.size -= len(kept.records.pop(index))
        if not kept.records:
            del self._tasks[task_id]
