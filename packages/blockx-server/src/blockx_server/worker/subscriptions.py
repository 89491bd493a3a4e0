"""Watch subscriptions: who is waiting for which task's terminal state, and which
of them also asked for its call progress."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable

import msgspec

from blockx_core.task import TaskResult, TaskState
from blockx_core.worker import CallProgress


class Converged(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The task converged: its terminal state and result, with the last counts of its
    Calls phase (None when it never reached it)."""

    task_id: str
    state: TaskState
    result: TaskResult
    timestamp_ms: int
    progress: CallProgress | None = None


class SlotExpired(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The task's slot expired before SubmitTask: it will never run here."""

    task_id: str
    timestamp_ms: int


class NotFound(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The task is unknown here (never submitted, or its result expired)."""

    task_id: str
    timestamp_ms: int


class Progress(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A running task's call counts (not terminal)."""

    task_id: str
    progress: CallProgress
    timestamp_ms: int


# What a Watch stream hears of a task: the three terminal updates, and progress.
TaskEvent = Converged | SlotExpired | NotFound | Progress


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

    def publish(self, event: Converged | SlotExpired | NotFound) -> None:
        for subscription in self._by_task.get(event.task_id, ()):
            subscription.queue.put_nowait(event)

    def publish_progress(self, event: Progress) -> None:
        """Only to the streams that asked for progress; the others never see it."""
        for subscription in self._by_task.get(event.task_id, ()):
            if subscription.progress:
                subscription.queue.put_nowait(event)

    def watched(self, task_id: str) -> int:
        return len(self._by_task.get(task_id, ()))
