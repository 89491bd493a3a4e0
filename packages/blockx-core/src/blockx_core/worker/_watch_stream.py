"""One WatchTasks stream as the core sees it.

``WorkerCore.handle_open_watch`` checks the request (at most ``MAX_WATCH_TASK_IDS``
task ids, each a valid one; repeats count once), answers what the stream is told
first of each task (``WatchedTask``: its snapshot, with its call counts when the
stream asked for progress; ``UnknownTask``), and makes each task not yet terminal a
run credential of the stream. Then the stream decides, per update the Worker
publishes, whether it is sent:

* a task's terminal update once, and only for a task it still waits for;
* a progress update only for a task it waits for, and only when the counts differ
  from the last ones this stream sent of the task (its snapshot's included).

The stream ends when it waits for no task; ``WorkerCore.handle_close_watch`` releases
the credentials of the tasks it still waited for (their watch grace may start).
"""

from __future__ import annotations

from collections.abc import Sequence, Set

import msgspec

from blockx_core.worker._progress import CallProgress
from blockx_core.worker._types import TaskSnapshot


class WatchedTask(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A task known here: its snapshot, and its call counts when the stream asked for
    progress and its Calls phase has started."""

    snapshot: TaskSnapshot
    progress: CallProgress | None = None


class UnknownTask(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A task unknown here (never submitted, or its result expired): terminal at once."""

    task_id: str


WatchStart = WatchedTask | UnknownTask


class WatchStream:
    """See the module docstring. Made by ``WorkerCore.handle_open_watch``."""

    __slots__ = ("_pending", "_sent", "first", "task_ids", "with_progress")

    def __init__(
        self, task_ids: tuple[str, ...], first: Sequence[WatchStart], *, progress: bool
    ) -> None:
        self.task_ids = task_ids
        self.with_progress = progress
        # What the stream is told first, one per task id in order.
        self.first = tuple(first)
        self._pending: set[str] = set()  # the tasks whose terminal update is still due
        self._sent: dict[str, CallProgress] = {}  # the counts last sent per task
        for start in self.first:
            if isinstance(start, WatchedTask):
                task_id = start.snapshot.task_id
                if start.progress is not None:
                    self._sent[task_id] = start.progress
                if not start.snapshot.state.is_terminal:
                    self._pending.add(task_id)

    @property
    def waiting(self) -> bool:
        """Whether some task has not had its terminal update yet."""
        return bool(self._pending)

    @property
    def pending(self) -> Set[str]:
        """The tasks whose terminal update is still due."""
        return self._pending

    def progress(self, task_id: str, progress: CallProgress) -> bool:
        """Whether to send these counts of ``task_id`` (then they count as sent)."""
        if task_id not in self._pending or self._sent.get(task_id) == progress:
            return False
        self._sent[task_id] = progress
        return True

    def ended(self, task_id: str) -> bool:
        """Whether to send ``task_id``'s terminal update (once: it is waited for no more)."""
        if task_id not in self._pending:
            return False
        self._pending.discard(task_id)
        self._sent.pop(task_id, None)
        return True
