"""AllowedWorkers: the only addresses the proxy forwards worker.v1 calls to.

Without it the proxy would dial any ``host:port`` a caller names in
``x-blockx-worker-addr``: etcd, a database, or any port of the network, with open
and closed ports answering differently. An address is allowed when it is

* in ``PROXY_ALLOWED_WORKERS``, a fixed list (the registry is then not read); or
* registered: a key of the registry prefixes the proxy watches (with
  ``EtcdWorkerWatcher``, as the Coordinators do).

Every other address gets the same PERMISSION_DENIED, decided before any
connection is made, so the answer says nothing about the address.

While the watch is disconnected the last view is kept: it only ever holds
addresses that were registered. Until the first list completes nothing is
allowed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final

from blockx_core.heartbeat import WorkerHeartbeat

log = logging.getLogger(__name__)

NOT_A_WORKER: Final = (
    "x-blockx-worker-addr names no Worker this proxy forwards to "
    "(only registered Workers, or PROXY_ALLOWED_WORKERS)"
)


class AllowedWorkers:
    """A set of Worker addresses; a ``RegistryView`` for ``EtcdWorkerWatcher``."""

    def __init__(self, fixed: Iterable[str] = ()) -> None:
        self._fixed = frozenset(fixed)
        self._registered: set[str] = set()

    def allows(self, addr: str) -> bool:
        return addr in self._fixed or addr in self._registered

    @property
    def worker_count(self) -> int:
        return len(self._fixed | self._registered)

    # ---- RegistryView: fed by the registry watcher ------------------------------

    def apply_full_worker_list(self, heartbeats: Iterable[WorkerHeartbeat], now_ms: int) -> None:
        self._registered = {heartbeat.worker_addr for heartbeat in heartbeats}

    def apply_worker_update(self, heartbeat: WorkerHeartbeat, now_ms: int) -> None:
        self._registered.add(heartbeat.worker_addr)

    def apply_worker_removal(self, worker_addr: str, now_ms: int) -> None:
        self._registered.discard(worker_addr)

    def mark_watch_disconnected(self, now_ms: int) -> None:
        log.warning(
            "registry watch disconnected: forwarding to the %d workers last seen",
            len(self._registered),
        )

    def mark_watch_reconnected(self, now_ms: int) -> None:
        log.info("registry watch connected again: %d workers", len(self._registered))
