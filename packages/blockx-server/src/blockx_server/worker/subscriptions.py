"""Watch subscriptions: who is waiting for which task's terminal state."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable

import msgspec

from blockx_core.task import TaskResult, TaskState


class TaskEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A terminal update: a converged task (state + result) or an ``error``
    ("not_found", "slot_expired") for a task that will never run here."""

    task_id: str
    state: TaskState | None = None
    result: TaskResult | None = None
    error: str = ""
    timestamp_ms: int = 0


class Subscription:
    def __init__(self, task_ids: Iterable[str]) -> None:
        self.task_ids = frozenset(task_ids)
        self.queue: asyncio.Queue[TaskEvent] = asyncio.Queue()


class SubscriptionManager:
    """The specification's SubscriptionManager: ``publish`` pushes a terminal event once to every
    stream subscribed to that task_id."""

    def __init__(self) -> None:
        self._by_task: dict[str, set[Subscription]] = defaultdict(set)

    def subscribe(self, task_ids: Iterable[str]) -> Subscription:
        subscription = Subscription(task_ids)
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

    def watched(self, task_id: str) -> int:
        return len(self._by_task.get(task_id, ()))
