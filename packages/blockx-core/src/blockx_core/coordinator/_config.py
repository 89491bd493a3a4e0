"""Placement and protection parameters of the CoordinatorCore."""

from __future__ import annotations

import msgspec

from blockx_core.errors import InvalidConfig
from blockx_core.worker import WorkerConfig


class CoordinatorConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Defaults are those of the Go ``core.DefaultConfig()``."""

    # A worker whose lastHeartbeatMs is older than this (on our clock) is not routed to.
    heartbeat_timeout_ms: int = 10_000
    # How long a disconnected etcd watch is still trusted.
    watch_grace_period_ms: int = 10_000
    # The ttl_ms passed to RequestTaskSlot: the reservation window, not a task timeout.
    slot_ttl_ms: int = 5_000
    # The largest ttl_ms the Workers grant (their MAX_SLOT_TTL_MS; a BlockX addition):
    # a Worker answers a larger one INVALID_ARGUMENT, so slot_ttl_ms may not exceed it.
    workers_max_slot_ttl_ms: int = WorkerConfig().max_slot_ttl_ms
    # Candidates tried serially per ReserveWorkerSlot.
    max_candidates: int = 3
    # Failures (rejections + timeouts since the last success) that open the breaker.
    circuit_breaker_threshold: int = 3
    circuit_breaker_cooldown_ms: int = 10_000
    # Red lines are fractions in (0, 1]; a worker strictly above one is filtered.
    cpu_red_line: float = 0.90
    memory_red_line: float = 0.90
    error_rate_red_line: float = 0.50

    def validate(self) -> None:
        """Raise ``InvalidConfig`` naming the first field that breaks a rule."""
        for name in (
            "heartbeat_timeout_ms",
            "watch_grace_period_ms",
            "slot_ttl_ms",
            "workers_max_slot_ttl_ms",
            "circuit_breaker_cooldown_ms",
        ):
            if getattr(self, name) <= 0:
                raise InvalidConfig(name, f"must be > 0 (got {getattr(self, name)})")
        for name in ("max_candidates", "circuit_breaker_threshold"):
            if getattr(self, name) < 1:
                raise InvalidConfig(name, f"must be >= 1 (got {getattr(self, name)})")
        for name in ("cpu_red_line", "memory_red_line", "error_rate_red_line"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise InvalidConfig(name, f"must be in (0, 1] (got {value})")
        if self.slot_ttl_ms > self.workers_max_slot_ttl_ms:
            raise InvalidConfig(
                "slot_ttl_ms",
                f"must be <= workers_max_slot_ttl_ms, the Workers' MAX_SLOT_TTL_MS "
                f"({self.slot_ttl_ms} > {self.workers_max_slot_ttl_ms}): a Worker refuses a "
                "longer ttl_ms; lower it, or set workers_max_slot_ttl_ms if every Worker's "
                "MAX_SLOT_TTL_MS allows more",
            )
        if self.watch_grace_period_ms > self.heartbeat_timeout_ms:
            raise InvalidConfig(
                "watch_grace_period_ms",
                f"must be <= heartbeat_timeout_ms ({self.watch_grace_period_ms} > "
                f"{self.heartbeat_timeout_ms})",
            )
