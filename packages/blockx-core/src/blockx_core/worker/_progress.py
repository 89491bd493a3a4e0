"""Call progress: how far each task's Calls phase is, and when Watch streams that
asked for it are told.

The adapter counts a task's root calls (the dispatcher knows them) whenever some
of them finish and hands the counts in with ``counted``; this board keeps the
latest per task (ListTasks and the Watch snapshots show it) and decides when a
``PublishProgress`` goes out to the task's progress watchers:

* only when the counts differ from the last ones published for the task, and only
  once some call has finished (or failed): the counts at the start say nothing
  the snapshot does not;
* the first such change goes out at once; after that at most one per
  ``PROGRESS_INTERVAL_MS`` per task: a change within the interval is held and
  published when it ends (coalesced: only the latest counts go out), so a task
  with 100k calls sends a few updates a second, not 100k;
* counts with every call done are held for an interval: the terminal update
  follows and carries them, so they go out on their own only when the task is
  still not terminal by then (a long Writer phase); a task of one quick call
  sends no progress update at all;
* nothing is kept or timed for a task nobody watches with progress.

Invariants: a task has a publish deadline in ``_due`` only while it has progress
watchers and holds counts newer than the ones it last published; everything about
a task is forgotten when its slot is released (converged or lease expired).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import msgspec

from blockx_core.deadlines import DeadlineHeap

# The shortest time between two progress updates of one task.
PROGRESS_INTERVAL_MS: Final = 200


class CallProgress(msgspec.Struct, frozen=True, kw_only=True):
    """How far a task's Calls phase is: root calls done of the ``calls_total`` known
    so far (all of them once ``total_known``; a streaming Builder's total grows while
    it reads) and failed call attempts so far (retried ones included)."""

    calls_done: int = 0
    calls_total: int = 0
    total_known: bool = False
    calls_failed: int = 0

    def shown(self) -> str:
        """``40/100``, or ``40/60 so far`` while the total is not known yet."""
        text = f"{self.calls_done}/{self.calls_total}"
        return text if self.total_known else f"{text} so far"


class _Published:
    __slots__ = ("at_ms", "progress")

    def __init__(self, progress: CallProgress, at_ms: int) -> None:
        self.progress = progress
        self.at_ms = at_ms


class ProgressBoard:
    """See the module docstring."""

    def __init__(self, interval_ms: int = PROGRESS_INTERVAL_MS) -> None:
        self._interval_ms = interval_ms
        self._latest: dict[str, CallProgress] = {}
        self._watchers: dict[str, int] = {}  # task -> open streams that asked for progress
        self._published: dict[str, _Published] = {}
        self._due: DeadlineHeap[str] = DeadlineHeap()

    def latest(self, task_id: str) -> CallProgress | None:
        return self._latest.get(task_id)

    def counted(self, task_id: str, progress: CallProgress, now_ms: int) -> bool:
        """New counts for a task in its Calls phase; whether to publish them now
        (otherwise they may be due later, see ``due``)."""
        self._latest[task_id] = progress
        if task_id not in self._watchers:
            return False
        published = self._published.get(task_id)
        if published is not None and published.progress == progress:
            self._due.cancel(task_id)  # back to what the watchers have seen
            return False
        if progress.calls_done == 0 and progress.calls_failed == 0:
            return False  # nothing has finished yet
        if progress.total_known and progress.calls_done >= progress.calls_total:
            self._due.set(task_id, now_ms + self._interval_ms)  # the terminal update may beat it
            return False
        if published is None or now_ms >= published.at_ms + self._interval_ms:
            self._publish(task_id, progress, now_ms)
            return True
        if self._due.get(task_id) is None:
            self._due.set(task_id, published.at_ms + self._interval_ms)
        return False

    def watch_attached(self, task_id: str) -> None:
        self._watchers[task_id] = self._watchers.get(task_id, 0) + 1

    def watch_detached(self, task_id: str) -> None:
        count = self._watchers.get(task_id, 0)
        if count > 1:
            self._watchers[task_id] = count - 1
        elif count == 1:
            del self._watchers[task_id]
            self._published.pop(task_id, None)
            self._due.cancel(task_id)

    def due(self, now_ms: int) -> Iterator[tuple[str, CallProgress]]:
        """The held counts whose interval ended by ``now_ms``, each marked published."""
        for task_id in list(self._due.pop_due(now_ms)):
            progress = self._latest[task_id]
            self._publish(task_id, progress, now_ms)
            yield task_id, progress

    def next_due_ms(self) -> int | None:
        return self._due.earliest_ms()

    def forget(self, task_id: str) -> None:
        """The task's slot is free again: its watchers get the terminal update."""
        self._latest.pop(task_id, None)
        self._watchers.pop(task_id, None)
        self._published.pop(task_id, None)
        self._due.cancel(task_id)

    def _publish(self, task_id: str, progress: CallProgress, now_ms: int) -> None:
        self._published[task_id] = _Published(progress, now_ms)
