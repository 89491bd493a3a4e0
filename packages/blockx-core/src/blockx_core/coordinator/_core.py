"""CoordinatorCore: the sans-IO placement engine of the Coordinator.

It holds the WorkerView map rebuilt from etcd heartbeats, decides whether the
view can be trusted, picks candidates, and keeps per-worker penalties and a
circuit breaker. It never reads a clock and never performs IO: every method
takes ``now_ms`` (Unix milliseconds on the Coordinator's clock), and the adapter
serialises calls (one asyncio loop), so it needs no lock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Set

import msgspec
from sortedcontainers import SortedList

from blockx_core.coordinator._config import CoordinatorConfig
from blockx_core.coordinator._explain import ReasonKind, WorkerReason, worker_reason
from blockx_core.coordinator._index import CandidateIndex, rank_key
from blockx_core.coordinator._view import WorkerView
from blockx_core.errors import ErrorCode, Refusal
from blockx_core.heartbeat import WorkerHeartbeat
from blockx_core.ids import TaskId, WorkerAddr, task_id_problem


class Candidate(msgspec.Struct, frozen=True):
    """SelectCandidate chose this worker."""

    worker_addr: WorkerAddr


# A Refusal here is an expected outcome that ends a ReserveWorkerSlot without a slot.
SelectResult = Candidate | Refusal


def validate_reserve_request(task_id: TaskId) -> Refusal | None:
    """ReserveWorkerSlot accepts any non-empty task_id up to MAX_TASK_ID_BYTES; the
    Worker owns its meaning."""
    problem = task_id_problem(task_id)
    return None if problem is None else Refusal(ErrorCode.INVALID_ARGUMENT, problem)


class CoordinatorCore:
    """Placement decisions over the heartbeat view. See the module docstring."""

    def __init__(self, config: CoordinatorConfig | None = None) -> None:
        self._config = config or CoordinatorConfig()
        self._config.validate()
        self._views: dict[WorkerAddr, WorkerView] = {}
        self._index = CandidateIndex()
        # lastHeartbeatMs of every worker: its maximum says whether any worker is live.
        self._heartbeat_ms: SortedList[int] = SortedList()
        # Workers behind an open breaker live outside the index until it closes.
        self._parked: set[WorkerAddr] = set()
        self._breaker_heap: list[tuple[int, WorkerAddr]] = []
        self._initialized = False
        self._watch_disconnected_at_ms: int | None = None

    # ---- inspection -------------------------------------------------------------

    @property
    def config(self) -> CoordinatorConfig:
        return self._config

    @property
    def slot_ttl_ms(self) -> int:
        return self._config.slot_ttl_ms

    @property
    def initialized(self) -> bool:
        return self._initialized

    @property
    def watch_disconnected_at_ms(self) -> int | None:
        return self._watch_disconnected_at_ms

    @property
    def worker_count(self) -> int:
        """Workers in the view (a property, not __len__: an empty core is still a core)."""
        return len(self._views)

    def worker(self, worker_addr: WorkerAddr) -> WorkerView | None:
        return self._views.get(worker_addr)

    def workers(self) -> Iterator[WorkerView]:
        return iter(list(self._views.values()))

    # ---- events from the etcd watcher --------------------------------------------

    def apply_full_worker_list(self, heartbeats: Iterable[WorkerHeartbeat], now_ms: int) -> None:
        """Replace the view with a complete list; survivors keep their local fields."""
        old = self._views
        views: dict[WorkerAddr, WorkerView] = {}
        for hb in heartbeats:
            view = old.get(hb.worker_addr) or views.get(hb.worker_addr)
            if view is None:
                view = WorkerView(hb)
            else:
                view.heartbeat = hb
            views[hb.worker_addr] = view
        self._views = views
        self._heartbeat_ms = SortedList(v.heartbeat.last_heartbeat_ms for v in views.values())
        self._parked = {a for a, v in views.items() if v.circuit_breaker_deadline_ms > 0}
        self._breaker_heap = [(views[a].circuit_breaker_deadline_ms, a) for a in self._parked]
        heapq.heapify(self._breaker_heap)
        self._index.rebuild(
            [v for a, v in views.items() if a not in self._parked and self._routable(v)]
        )
        self._initialized = True
        self._release_breakers(now_ms)

    def apply_worker_update(self, heartbeat: WorkerHeartbeat, now_ms: int) -> None:
        view = self._views.get(heartbeat.worker_addr)
        if view is None:
            view = WorkerView(heartbeat)
            self._views[heartbeat.worker_addr] = view
        else:
            self._heartbeat_ms.remove(view.heartbeat.last_heartbeat_ms)
            view.heartbeat = heartbeat
        self._heartbeat_ms.add(heartbeat.last_heartbeat_ms)
        self._reindex(view)

    def apply_worker_removal(self, worker_addr: WorkerAddr, now_ms: int) -> None:
        """Forget a worker entirely; if it comes back it starts from zero."""
        view = self._views.pop(worker_addr, None)
        if view is None:
            return
        self._heartbeat_ms.remove(view.heartbeat.last_heartbeat_ms)
        self._index.discard(worker_addr)
        self._parked.discard(worker_addr)

    def mark_watch_disconnected(self, now_ms: int) -> None:
        """Record the first moment the watch was lost; later calls keep that moment."""
        if self._watch_disconnected_at_ms is None:
            self._watch_disconnected_at_ms = now_ms

    def mark_watch_reconnected(self, now_ms: int) -> None:
        """Every prefix has re-listed and is watching again."""
        self._watch_disconnected_at_ms = None

    # ---- decisions ------------------------------------------------------------------

    def is_ready(self, now_ms: int) -> bool:
        return self.not_ready_reason(now_ms) is None

    def not_ready_reason(self, now_ms: int) -> Refusal | None:
        """UNAVAILABLE with the reason the view is not trusted, or None when ready."""
        if not self._initialized:
            return Refusal(
                ErrorCode.UNAVAILABLE,
                "worker view not initialized: waiting for the first etcd list",
            )
        since = self._watch_disconnected_at_ms
        if since is not None and now_ms - since > self._config.watch_grace_period_ms:
            return Refusal(
                ErrorCode.UNAVAILABLE,
                f"etcd watch lost {now_ms - since} ms ago (grace "
                f"{self._config.watch_grace_period_ms} ms): the worker view is not trusted",
            )
        return None

    def select_candidate(
        self, task_id: TaskId, exclude: Set[WorkerAddr], now_ms: int
    ) -> SelectResult:
        """The best routable worker not in ``exclude``, or why there is none.

        Hard filters, in this order: excluded, stale heartbeat
        (``now - lastHeartbeatMs > HeartbeatTimeoutMs``), cpu / memory / error rate
        above their red line, breaker open, ``FreeCapacity <= 0``. The survivors
        rank by free capacity (more first), newer heartbeat, lower penalty, address.
        ``task_id`` takes no part in the choice (placement is deterministic).
        """
        not_ready = self.not_ready_reason(now_ms)
        if not_ready is not None:
            return not_ready
        self._release_breakers(now_ms)
        fresh_since_ms = now_ms - self._config.heartbeat_timeout_ms
        addr = self._index.first(
            fresh_since_ms=fresh_since_ms,
            exclude=exclude,
            blocked=lambda a: self._views[a].breaker_open(now_ms),
        )
        if addr is not None:
            return Candidate(addr)
        if not self._heartbeat_ms or self._heartbeat_ms[-1] < fresh_since_ms:
            return Refusal(
                ErrorCode.UNAVAILABLE,
                f"no live worker: none of {len(self._views)} registered workers has "
                f"heartbeated within {self._config.heartbeat_timeout_ms} ms",
            )
        return Refusal(
            ErrorCode.NO_EXECUTABLE_SLOT,
            "no worker has a free slot: every live worker is full, overloaded, "
            "circuit-broken or already tried",
        )

    def worker_reasons(self, now_ms: int) -> Iterator[WorkerReason]:
        """Every worker's eligibility at ``now_ms``, in no particular order, lazily: a
        caller with a size budget stops reading when it is spent. Read it to the end
        (or drop it) before the next event changes the view."""
        for view in self._views.values():
            yield worker_reason(view, self._config, now_ms)

    def explain(self, now_ms: int, worker_addr: WorkerAddr | None = None) -> list[WorkerReason]:
        """Every worker's eligibility (or only ``worker_addr``'s, if it is known): the
        eligible ones in the order they would be chosen, then the others by address."""
        eligible: list[tuple[WorkerView, WorkerReason]] = []
        others: list[WorkerReason] = []
        if worker_addr is None:
            views: Iterable[WorkerView] = self._views.values()
        else:
            only = self._views.get(worker_addr)
            views = () if only is None else (only,)
        for view in views:
            reason = worker_reason(view, self._config, now_ms)
            if reason.kind is ReasonKind.ELIGIBLE:
                eligible.append((view, reason))
            else:
                others.append(reason)
        eligible.sort(key=lambda pair: rank_key(pair[0]))
        others.sort(key=lambda reason: reason.worker_addr)
        return [reason for _, reason in eligible] + others

    # ---- feedback from RequestTaskSlot ---------------------------------------------

    def record_slot_success(self, worker_addr: WorkerAddr, now_ms: int) -> None:
        view = self._views.get(worker_addr)
        if view is None:
            return
        view.recent_failure_count = 0
        view.penalty = 0.0
        view.circuit_breaker_deadline_ms = 0
        self._parked.discard(worker_addr)
        self._reindex(view)

    def record_slot_rejection(self, worker_addr: WorkerAddr, now_ms: int) -> None:
        self._record_failure(worker_addr, now_ms)

    def record_slot_timeout(self, worker_addr: WorkerAddr, now_ms: int) -> None:
        self._record_failure(worker_addr, now_ms)

    def record_slot_backpressure(self, worker_addr: WorkerAddr, now_ms: int) -> None:
        """NoSlot is the worker working as intended: no penalty, no breaker."""

    # ---- internals -------------------------------------------------------------------

    def _routable(self, view: WorkerView) -> bool:
        """The filters that depend on the heartbeat alone."""
        hb = view.heartbeat
        cfg = self._config
        return not (
            hb.cpu_percent > cfg.cpu_red_line
            or hb.memory_percent > cfg.memory_red_line
            or hb.error_rate > cfg.error_rate_red_line
            or hb.free_capacity <= 0
        )

    def _reindex(self, view: WorkerView) -> None:
        if view.worker_addr not in self._parked and self._routable(view):
            self._index.put(view)
        else:
            self._index.discard(view.worker_addr)

    def _record_failure(self, worker_addr: WorkerAddr, now_ms: int) -> None:
        view = self._views.get(worker_addr)
        if view is None:
            return
        view.recent_failure_count += 1
        view.penalty = float(view.recent_failure_count)
        if view.recent_failure_count >= self._config.circuit_breaker_threshold:
            deadline = now_ms + self._config.circuit_breaker_cooldown_ms
            view.circuit_breaker_deadline_ms = deadline
            self._parked.add(worker_addr)
            heapq.heappush(self._breaker_heap, (deadline, worker_addr))
        self._reindex(view)

    def _release_breakers(self, now_ms: int) -> None:
        """Move workers whose breaker has closed by ``now_ms`` back into the index."""
        heap = self._breaker_heap
        while heap and heap[0][0] <= now_ms:
            deadline, addr = heapq.heappop(heap)
            view = self._views.get(addr)
            if view is None or addr not in self._parked:
                continue
            if view.circuit_breaker_deadline_ms != deadline:
                continue  # superseded by a later trip; its own entry is still queued
            self._parked.discard(addr)
            self._reindex(view)
