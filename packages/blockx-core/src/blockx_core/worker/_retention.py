"""Terminal results kept for ``result_retention_ms``, purged by a deadline heap."""

from __future__ import annotations

from blockx_core.deadlines import DeadlineHeap
from blockx_core.task import TaskResult, TaskState
from blockx_core.worker._types import TaskSnapshot


class _Retained:
    __slots__ = ("result", "slot_id", "state")

    def __init__(self, state: TaskState, result: TaskResult, slot_id: str) -> None:
        self.state = state
        self.result = result
        self.slot_id = slot_id


class RetainedResults:
    """A result is answered while ``now_ms`` is before its end of retention, even if
    the purge has not run yet; ``purge`` frees the memory."""

    def __init__(self) -> None:
        self._results: dict[str, _Retained] = {}
        self._until: DeadlineHeap[str] = DeadlineHeap()

    def keep(
        self, task_id: str, state: TaskState, result: TaskResult, slot_id: str, until_ms: int
    ) -> None:
        self._results[task_id] = _Retained(state, result, slot_id)
        self._until.set(task_id, until_ms)

    def snapshot(self, task_id: str, now_ms: int) -> TaskSnapshot | None:
        """The terminal result of a task that ran here, while it is still kept."""
        retained = self._results.get(task_id)
        until_ms = self._until.get(task_id)
        if retained is None or until_ms is None or until_ms <= now_ms:
            return None
        return TaskSnapshot(
            task_id=task_id, slot_id=retained.slot_id, state=retained.state, result=retained.result
        )

    def purge(self, now_ms: int) -> None:
        for task_id in self._until.pop_due(now_ms):
            del self._results[task_id]

    def next_purge_ms(self) -> int | None:
        return self._until.earliest_ms()
