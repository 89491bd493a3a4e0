"""RegistryMerge: one worker view out of several registry prefixes.

During a registry migration a Worker may publish under a legacy prefix and a v2
prefix at once, and a Coordinator may watch both. Entries are merged by
workerAddr: the newer ``lastHeartbeatMs`` wins, then v2 over legacy, then the
lexicographically smaller prefix. A worker leaves the merged view only when it
is gone under every prefix. Sans-IO: the etcd watcher feeds it and forwards the
changes it returns to the CoordinatorCore.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from blockx_core.heartbeat import WorkerHeartbeat
from blockx_core.ids import WorkerAddr
from blockx_core.registry import RegistryFormat, RegistryPrefix, parse_registry_prefix


class WorkerUpserted(msgspec.Struct, frozen=True):
    """The merged heartbeat of a worker changed (or the worker appeared)."""

    heartbeat: WorkerHeartbeat


class WorkerRemoved(msgspec.Struct, frozen=True):
    """The worker is gone under every prefix."""

    worker_addr: WorkerAddr


MergeChange = WorkerUpserted | WorkerRemoved


class RegistryMerge:
    """Per-prefix heartbeat tables and the merged view over them."""

    def __init__(self, prefixes: Sequence[str]) -> None:
        if not prefixes:
            raise ValueError("at least one registry prefix is required")
        self._prefixes: dict[str, RegistryPrefix] = {p: parse_registry_prefix(p) for p in prefixes}
        self._tables: dict[str, dict[WorkerAddr, WorkerHeartbeat]] = {p: {} for p in prefixes}
        self._merged: dict[WorkerAddr, WorkerHeartbeat] = {}

    @property
    def prefixes(self) -> list[str]:
        return list(self._prefixes)

    def merged(self) -> list[WorkerHeartbeat]:
        return list(self._merged.values())

    def worker_count_by_format(self) -> dict[RegistryFormat, int]:
        """Distinct workers registered under prefixes of each format."""
        seen: dict[RegistryFormat, set[WorkerAddr]] = {f: set() for f in RegistryFormat}
        for prefix, table in self._tables.items():
            seen[self._prefixes[prefix].format].update(table)
        return {fmt: len(addrs) for fmt, addrs in seen.items()}

    def replace_prefix(
        self, prefix: str, heartbeats: Iterable[WorkerHeartbeat]
    ) -> list[MergeChange]:
        """A fresh list of one prefix replaces everything known under it."""
        table = self._table(prefix)
        new = {hb.worker_addr: hb for hb in heartbeats}
        touched = set(table) | set(new)
        table.clear()
        table.update(new)
        return [c for addr in sorted(touched) if (c := self._remerge(addr)) is not None]

    def put(self, prefix: str, heartbeat: WorkerHeartbeat) -> MergeChange | None:
        self._table(prefix)[heartbeat.worker_addr] = heartbeat
        return self._remerge(heartbeat.worker_addr)

    def delete(self, prefix: str, worker_addr: WorkerAddr) -> MergeChange | None:
        if self._table(prefix).pop(worker_addr, None) is None:
            return None
        return self._remerge(worker_addr)

    def _table(self, prefix: str) -> dict[WorkerAddr, WorkerHeartbeat]:
        table = self._tables.get(prefix)
        if table is None:
            raise KeyError(f"registry prefix {prefix!r} is not watched")
        return table

    def _winner(self, worker_addr: WorkerAddr) -> WorkerHeartbeat | None:
        best: tuple[int, bool, str] | None = None
        winner: WorkerHeartbeat | None = None
        for prefix, table in self._tables.items():
            hb = table.get(worker_addr)
            if hb is None:
                continue
            is_v2 = self._prefixes[prefix].format is RegistryFormat.V2
            # Larger is better: newer heartbeat, then v2; on a tie the smaller prefix wins.
            rank = (hb.last_heartbeat_ms, is_v2, prefix)
            if best is None or rank[:2] > best[:2] or (rank[:2] == best[:2] and rank[2] < best[2]):
                best, winner = rank, hb
        return winner

    def _remerge(self, worker_addr: WorkerAddr) -> MergeChange | None:
        winner = self._winner(worker_addr)
        previous = self._merged.get(worker_addr)
        if winner is None:
            if previous is None:
                return None
            del self._merged[worker_addr]
            return WorkerRemoved(worker_addr)
        if previous == winner:
            return None
        self._merged[worker_addr] = winner
        return WorkerUpserted(winner)
