"""Deadlines by key in a heap, so the earliest one costs O(log n), not a scan.

Invariants: ``_due[key]`` is the one live deadline of ``key``; the heap holds it
plus stale entries (a deadline moved or cancelled), which are dropped lazily
when they reach the top. An entry is live exactly when ``_due`` still maps its key
to its deadline. The heap is rebuilt when stale entries outnumber live ones, so
its size stays O(live keys) whatever the pattern of changes.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# Below this size a rebuild is not worth its cost.
_MIN_REBUILD = 64


class DeadlineHeap(Generic[K]):
    """One deadline per key; ``set`` replaces, ``cancel`` removes, ``pop_due`` fires."""

    __slots__ = ("_due", "_heap", "_seq")

    def __init__(self) -> None:
        self._due: dict[K, int] = {}
        # (deadline_ms, insertion order, key): equal deadlines fire in insertion order
        # and keys are never compared.
        self._heap: list[tuple[int, int, K]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def get(self, key: K) -> int | None:
        return self._due.get(key)

    def set(self, key: K, deadline_ms: int) -> None:
        if self._due.get(key) == deadline_ms:
            return
        self._due[key] = deadline_ms
        heapq.heappush(self._heap, (deadline_ms, next(self._seq), key))
        self._compact()

    def cancel(self, key: K) -> None:
        if self._due.pop(key, None) is not None:
            self._compact()

    def earliest_ms(self) -> int | None:
        """The earliest live deadline, or None when there is none."""
        heap = self._heap
        while heap:
            deadline_ms, _, key = heap[0]
            if self._due.get(key) == deadline_ms:
                return deadline_ms
            heapq.heappop(heap)
        return None

    def pop_due(self, now_ms: int) -> Iterator[K]:
        """Remove and yield every key whose deadline is ``<= now_ms``, earliest first.

        Each key is removed before it is yielded, so the caller may set or cancel
        any deadline (this key's included) while iterating."""
        while True:
            earliest = self.earliest_ms()
            if earliest is None or earliest > now_ms:
                return
            _, _, key = heapq.heappop(self._heap)
            del self._due[key]
            yield key

    def _compact(self) -> None:
        """Drop stale entries once they outnumber live ones (amortised O(1) per change)."""
        if len(self._heap) <= max(_MIN_REBUILD, 2 * len(self._due)):
            return
        due = self._due
        self._heap = [entry for entry in self._heap if due.get(entry[2]) == entry[0]]
        heapq.heapify(self._heap)
