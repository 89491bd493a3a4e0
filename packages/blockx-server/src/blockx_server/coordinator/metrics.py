"""Coordinator metrics (Prometheus)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from blockx_core.coordinator import ReserveOutcome, SlotAttemptResult
from blockx_core.registry import RegistryFormat
from blockx_server.coordinator.reservation import NONE_TRIED


class _RegistryWorkersCollector(Collector):
    """``blockx_coordinator_registry_workers{format}``, read at scrape time."""

    def __init__(self, counts: Callable[[], Mapping[RegistryFormat, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "blockx_coordinator_registry_workers",
            "Workers registered in etcd, by registry prefix format.",
            labels=["format"],
        )
        counts = self._counts()
        for fmt in RegistryFormat:
            family.add_metric([fmt.value], counts.get(fmt, 0))
        yield family


class CoordinatorMetrics:
    """Implements the ReservationLoop's ReserveObserver."""

    def __init__(
        self,
        registry: CollectorRegistry,
        registry_worker_counts: Callable[[], Mapping[RegistryFormat, int]],
    ) -> None:
        self.registry = registry
        registry.register(_RegistryWorkersCollector(registry_worker_counts))
        self._reserve_total = Counter(
            "blockx_coordinator_reserve",
            "ReserveWorkerSlot calls, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self._reserve_seconds = Histogram(
            "blockx_coordinator_reserve_duration_seconds",
            "ReserveWorkerSlot latency, by outcome.",
            ["outcome"],
            registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 3, 10),
        )
        self._slot_requests = Counter(
            "blockx_coordinator_slot_requests",
            "RequestTaskSlot calls to workers, by result.",
            ["result"],
            registry=registry,
        )
        # Children resolved once: labels() takes a lock and builds a key on every call,
        # and these are updated on every ReserveWorkerSlot. The counters export every
        # label from the start; a latency series appears with its first observation.
        self._reserved_by_outcome = {o: self._reserve_total.labels(o.value) for o in ReserveOutcome}
        self._attempts_by_result = {
            r: self._slot_requests.labels(r.value) for r in SlotAttemptResult
        }
        self._seconds_by_outcome: dict[ReserveOutcome, Histogram] = {}
        self._reservations = Counter(
            "blockx_coordinator_reservations",
            "ReserveWorkerSlot calls, by outcome and reason: how the last worker asked "
            f"answered ({', '.join(SlotAttemptResult)}), or {NONE_TRIED}.",
            ["outcome", "reason"],
            registry=registry,
        )
        # A pair appears with its first reservation: most pairs never happen.
        self._by_outcome_reason: dict[tuple[ReserveOutcome, str], Counter] = {}

    def reserve_finished(self, outcome: ReserveOutcome, seconds: float, reason: str) -> None:
        self._reserved_by_outcome[outcome].inc()
        counter = self._by_outcome_reason.get((outcome, reason))
        if counter is None:
            counter = self._by_outcome_reason[outcome, reason] = self._reservations.labels(
                outcome.value, reason
            )
        counter.inc()
        histogram = self._seconds_by_outcome.get(outcome)
        if histogram is None:
            histogram = self._seconds_by_outcome[outcome] = self._reserve_seconds.labels(
                outcome.value
            )
        histogram.observe(seconds)

    def slot_attempt(self, result: SlotAttemptResult) -> None:
        self._attempts_by_result[result].inc()
