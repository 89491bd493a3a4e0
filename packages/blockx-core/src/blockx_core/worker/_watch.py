"""Watch as a run credential: open streams per task and the grace after the last.

A task that has been watched at least once and then has no open Watch stream for
``watch_disconnect_grace_ms`` fails WATCH_DISCONNECTED; the grace deadlines sit
in a heap, so ruling on them costs nothing for tasks that are still watched.
"""

from __future__ import annotations

from collections.abc import Iterator

from blockx_core.deadlines import DeadlineHeap


class WatchCredentials:
    def __init__(self, grace_ms: int) -> None:
        self._grace_ms = grace_ms  # 0: Watch is not a run credential
        self._streams: dict[str, int] = {}
        self._watched: set[str] = set()  # watched at least once: the credential is armed
        self._deadlines: DeadlineHeap[str] = DeadlineHeap()

    def attached(self, task_id: str) -> None:
        self._streams[task_id] = self._streams.get(task_id, 0) + 1
        self._watched.add(task_id)
        self._deadlines.cancel(task_id)

    def detached(self, task_id: str, submitted: bool, now_ms: int) -> None:
        """A stream closed; the grace starts when it was the last one on a submitted
        task (a reserved one loses its slot by its lease instead)."""
        count = self._streams.get(task_id, 0)
        if count == 0:
            return
        if count > 1:
            self._streams[task_id] = count - 1
            return
        del self._streams[task_id]
        if submitted and task_id in self._watched and self._grace_ms > 0:
            self._deadlines.set(task_id, now_ms + self._grace_ms)

    def submitted(self, task_id: str, now_ms: int) -> None:
        """The reserved task was submitted: a Watch that opened on it while it was
        reserved and has closed since starts the grace now, as the task runs."""
        if task_id in self._watched and task_id not in self._streams and self._grace_ms > 0:
            self._deadlines.set(task_id, now_ms + self._grace_ms)

    def forget(self, task_id: str) -> None:
        """The task's slot is free again (converged or lease expired)."""
        self._streams.pop(task_id, None)
        self._watched.discard(task_id)
        self._deadlines.cancel(task_id)

    def lost(self, now_ms: int) -> Iterator[str]:
        """Tasks whose grace ended by ``now_ms``; each is removed before it is yielded."""
        return self._deadlines.pop_due(now_ms)

    def next_loss_ms(self) -> int | None:
        return self._deadlines.earliest_ms()
