"""Watch subscriptions: who is waiting for which task's terminal state, and which
of them also asked for its call progress."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable

import msgspec

from blockx_core.task import TaskResult, TaskState
from blockx_core.worker import CallProgress


class TaskEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A terminal update: a converged task (state + result) or an ``error``
    ("not_found", "slot_expired") for a task that will never run here; or, with
    ``is_terminal`` false, a running task's call progress."""

    task_id: str
    state: TaskState | None = None
    result: TaskResult | None = None
    error: str = ""
    timestamp_ms: int = 0
    # A progress update's counts, or a converged task's last ones (None when it
    # never reached its Calls phase).
    progress: CallProgress | None = None
    is_terminal: bool = True


class Subscription:
    def __init__(self, task_ids: Iterable[str], *, progress: bool = False) -> None:
        self.task_ids = frozenset(task_ids)
        self.progress = progress
        self.queue: asyncio.Queue[TaskEvent] = asyncio.Queue()


class SubscriptionManager:
    """The specification's SubscriptionManager: ``publish`` pushes a terminal event once to every
    stream subscribed to that task_id; ``publish_progress`` pushes call progress to
    the ones that asked for it."""

    def __init__(self) -> None:
        self._by_task: dict[str, set[Subscription]] = defaultdict(set)

    def subscribe(self, task_ids: Iterable[str], *, progress: bool = False) -> Subscription:
        subscription = Subscription(task_ids, progress=progress)
        for task_id in subscription.task_ids:
            self._by_task[task_id].add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        for task_id in subscription.task_ids:
            subs = self._by_task.get(task_id)
            if subs is not None:
                subs.discard(subscription)
                if not subs:
                    del self._by_task[task_id]

    def publish(self, event: TaskEvent) -> None:
        for subscription in self._by_task.get(event.task_id, ()):
            subscription.queue.put_nowait(event)

    def publish_progress(self, event: TaskEvent) -> None:
        """Only to the streams that asked for progress; the others never see it."""
        for subscription in self._by_task.get(event.task_id, ()):
            if subscription.progress:
                subscription.queue.put_nowait(event)

    def watched(self, task_id: str) -> int:
        return len(self._by_task.get(task_id, ()))
