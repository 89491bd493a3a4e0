"""CandidateIndex: routable workers kept in ranking order.

The ranking (the specification's ``candidateRanksBefore``) is: more free capacity, then newer
heartbeat, then lower penalty, then the smaller address. Keeping the routable
workers in a sorted list under exactly that key makes a heartbeat update
O(log n) and a selection usually O(log n) too, instead of a scan of every worker.

Workers whose heartbeat alone rules them out (a red line crossed, no free
capacity) and workers parked behind an open breaker are not in the index. The
two filters that depend on the request are applied while walking it: the
excluded set (at most MaxCandidates entries) and heartbeat staleness. Within one
free-capacity group the entries run from the newest heartbeat to the oldest, so
the first stale entry of a group means the whole rest of the group is stale and
the walk jumps to the next group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Set
from typing import Final, TypeAlias

from sortedcontainers import SortedList

from blockx_core.coordinator._view import WorkerView

# (-free capacity, -lastHeartbeatMs, penalty, workerAddr): ascending = best first.
RankKey: TypeAlias = tuple[int, int, float, str]

# Below any -lastHeartbeatMs: heartbeats are int64 (decode_heartbeat enforces it).
_BELOW_ANY_HEARTBEAT: Final = -(1 << 127)


def rank_key(view: WorkerView) -> RankKey:
    hb = view.heartbeat
    return (-hb.free_capacity, -hb.last_heartbeat_ms, view.penalty, hb.worker_addr)


def _first_key_of_next_group(key: RankKey) -> RankKey:
    """The smallest possible key with one less free capacity than ``key``."""
    return (key[0] + 1, _BELOW_ANY_HEARTBEAT, -math.inf, "")


class CandidateIndex:
    """The routable workers, best candidate first."""

    __slots__ = ("_key_of", "_keys")

    def __init__(self) -> None:
        self._keys: SortedList[RankKey] = SortedList()
        self._key_of: dict[str, RankKey] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, worker_addr: object) -> bool:
        return worker_addr in self._key_of

    def put(self, view: WorkerView) -> None:
        """Insert ``view`` or move it to where its current fields rank it."""
        key = rank_key(view)
        old = self._key_of.get(view.worker_addr)
        if old == key:
            return
        if old is not None:
            self._keys.remove(old)
        self._keys.add(key)
        self._key_of[view.worker_addr] = key

    def discard(self, worker_addr: str) -> None:
        old = self._key_of.pop(worker_addr, None)
        if old is not None:
            self._keys.remove(old)

    def rebuild(self, views: list[WorkerView]) -> None:
        keys = [rank_key(v) for v in views]
        self._keys = SortedList(keys)
        self._key_of = {key[3]: key for key in keys}

    def first(
        self,
        *,
        fresh_since_ms: int,
        exclude: Set[str],
        blocked: Callable[[str], bool],
    ) -> str | None:
        """The best worker whose heartbeat is at or after ``fresh_since_ms``, that is
        not in ``exclude`` and not ``blocked``; None when there is none."""
        keys = self._keys
        start = 0
        while start < len(keys):
            for key in keys.islice(start):
                if -key[1] < fresh_since_ms:
                    start = keys.bisect_left(_first_key_of_next_group(key))
                    break
                addr = key[3]
                if addr in exclude or blocked(addr):
                    continue
                return addr
            else:
                return None
        return None

    def ranked(self) -> list[str]:
        """Every indexed address in ranking order (for inspection and tests)."""
        return [key[3] for key in self._keys]
