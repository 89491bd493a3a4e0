"""TaskIoScope: a task's one door to IO, opened at activation, closed at convergence.

Every read of a Builder, every read of a function (an executor's IO request) and
every write of a Writer Plugin goes through the scope of its task. A scope opened
for functions and Builders is read-only (a write fails WRITE_FORBIDDEN); the
Writer Plugin's scope may write. The scope counts the task's requests, backend
time and bytes; task-level policies (singleflight, IO windows) live here.
"""

from __future__ import annotations

from typing import Any

import msgspec

from blockx_server.io.errors import IoErrorKind, IoOutcome, failure
from blockx_server.io.router import IoRouter


class IoStats(msgspec.Struct, kw_only=True):
    """What one task's IO cost: requests, failed requests, backend time, answer bytes."""

    requests: int = 0
    failures: int = 0
    backend_us: int = 0
    bytes: int = 0


class TaskIoScope:
    def __init__(self, router: IoRouter, task_id: str, *, writes: bool = False) -> None:
        self._router = router
        self.task_id = task_id
        self.writes = writes
        self.stats = IoStats()
        self._closed = False
        # A writer scope lives and dies with the task's scope it was opened from.
        self._parent: TaskIoScope | None = None

    @property
    def closed(self) -> bool:
        return self._closed or (self._parent is not None and self._parent.closed)

    def writer(self) -> TaskIoScope:
        """The same task's scope for its Writer Plugin: it may write, it counts into
        the same statistics, and it closes when this scope closes."""
        scope = TaskIoScope(self._router, self.task_id, writes=True)
        scope.stats = self.stats
        scope._parent = self
        return scope

    async def request(
        self, backend: str, op: str, args: list[Any], kwargs: dict[str, Any] | None = None
    ) -> IoOutcome:
        if self.closed:
            return failure(IoErrorKind.UNAVAILABLE, "the task's IO scope is closed")
        outcome = await self._router.execute(backend, op, args, kwargs or {}, writes=self.writes)
        stats = self.stats
        stats.requests += 1
        stats.backend_us += outcome.io_us
        if outcome.ok:
            stats.bytes += len(outcome.value_json)
        else:
            stats.failures += 1
        return outcome

    def close(self) -> None:
        self._closed = True
