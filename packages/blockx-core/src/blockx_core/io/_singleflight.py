"""Singleflight: identical reads in flight share one backend request.

A key -> waiters table. The first arrival leads (it performs the request); later
arrivals of the same key, until the leader completes, wait for its answer.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
W = TypeVar("W")


class Singleflight(Generic[K, W]):
    def __init__(self) -> None:
        self._waiters: dict[K, list[W]] = {}
        self.shared = 0

    def __len__(self) -> int:
        return len(self._waiters)

    def in_flight(self, key: K) -> bool:
        return key in self._waiters

    def arrive(self, key: K, waiter: W) -> bool:
        """True when this arrival leads; False when it joins a request in flight
        (``waiter`` is then handed back by ``complete``)."""
        waiters = self._waiters.get(key)
        if waiters is None:
            self._waiters[key] = []
            return True
        waiters.append(waiter)
        self.shared += 1
        return False

    def complete(self, key: K) -> list[W]:
        """The leader is done: the waiters that joined it, in arrival order. The next
        arrival of ``key`` leads a new request."""
        return self._waiters.pop(key, [])
