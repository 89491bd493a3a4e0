"""Follow woken by the block database: a commit of ingest's wakes follow at once.

The block database's ``changes()`` (PostgreSQL ``LISTEN``/``NOTIFY``; for SQLite the
wake sockets of ``blockx_chain.store.wake``) sets an Event at every ingest commit.
Follow clears it before each look and waits for it beside its poll interval and
its tasks: a push only wakes follow sooner, what changed is read from the
database as a poll reads it, and where no push comes the poll goes on.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Pushes:
    """The wake-ups of one follow run; ``changed`` None: it polls only."""

    def __init__(self, changed: asyncio.Event | None) -> None:
        self._changed = changed
        self._waiter: asyncio.Future[Any] | None = None

    def looking(self) -> None:
        """A look begins: what is committed from now on wakes the next wait."""
        if self._changed is not None:
            self._changed.clear()

    def waiters(self) -> set[asyncio.Future[Any]]:
        """What the wait between looks ends on, beside its tasks and timeout."""
        if self._changed is None:
            return set()
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.ensure_future(self._changed.wait())
        return {self._waiter}

    def close(self) -> None:
        if self._waiter is not None:
            self._waiter.cancel()
