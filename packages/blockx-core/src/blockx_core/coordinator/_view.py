"""WorkerView: a heartbeat plus the local-only protection state of one Worker."""

from __future__ import annotations

from blockx_core.heartbeat import WorkerHeartbeat


class WorkerView:
    """What the Coordinator knows about one Worker.

    ``heartbeat`` comes from etcd; the other three fields exist only in this
    process and are never written back.
    """

    __slots__ = ("circuit_breaker_deadline_ms", "heartbeat", "penalty", "recent_failure_count")

    def __init__(self, heartbeat: WorkerHeartbeat) -> None:
        self.heartbeat = heartbeat
        self.circuit_breaker_deadline_ms = 0
        self.recent_failure_count = 0
        self.penalty = 0.0

    @property
    def worker_addr(self) -> str:
        return self.heartbeat.worker_addr

    @property
    def used_total(self) -> int:
        return self.heartbeat.used_total

    @property
    def free_capacity(self) -> int:
        return self.heartbeat.free_capacity

    def breaker_open(self, now_ms: int) -> bool:
        return now_ms < self.circuit_breaker_deadline_ms

    def __repr__(self) -> str:
        return (
            f"WorkerView({self.heartbeat!r}, failures={self.recent_failure_count}, "
            f"breaker_until={self.circuit_breaker_deadline_ms})"
        )
