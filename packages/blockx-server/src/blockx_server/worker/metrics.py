"""Worker metrics (Prometheus), on BLOCKX_PROMETHEUS_LISTEN_ADDR / BLOCKX_PROMETHEUS_PATH."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from blockx_core.worker import TaskConverged, WorkerCore
from blockx_server.calls.engine import CallEngine
from blockx_server.io.metrics import IoMetrics
from blockx_server.io.router import IoRouter


class _SlotsCollector(Collector):
    """Slot table and executors, read at scrape time."""

    def __init__(self, core: WorkerCore, engine: CallEngine) -> None:
        self._core = core
        self._engine = engine

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        total, reserved, running = self._core.derive_heartbeat()
        slots = GaugeMetricFamily("blockx_worker_slots", "Task slots by state.", labels=["state"])
        slots.add_metric(["free"], total - reserved - running)
        slots.add_metric(["allocated"], reserved)
        slots.add_metric(["running"], running)
        yield slots
        yield GaugeMetricFamily(
            "blockx_worker_executors_up",
            "Python Executor processes connected to this Worker.",
            value=len(self._engine.pool.executor_ids()),
        )
        yield GaugeMetricFamily(
            "blockx_worker_calls_in_flight",
            "Calls the dispatcher holds (dispatched, suspended or waiting for a retry).",
            value=self._engine.core.live_calls(),
        )
        yield GaugeMetricFamily(
            "blockx_worker_ready", "1 when the Worker accepts tasks.", value=int(self._core.ready)
        )
        retention = self._core.retention_stats()
        yield GaugeMetricFamily(
            "blockx_worker_retained_results",
            "Terminal results retained with their outputs.",
            value=retention.results,
        )
        yield GaugeMetricFamily(
            "blockx_worker_retained_result_bytes",
            "What the retained results count against RESULT_RETENTION_MAX_BYTES.",
            value=retention.retained_bytes,
        )
        yield GaugeMetricFamily(
            "blockx_worker_result_tombstones",
            "Retained results whose outputs were dropped for RESULT_RETENTION_MAX_BYTES.",
            value=retention.tombstones,
        )
        yield CounterMetricFamily(
            "blockx_worker_results_dropped",
            "Results whose outputs were dropped for RESULT_RETENTION_MAX_BYTES.",
            value=retention.dropped,
        )


class WorkerMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        core: WorkerCore,
        engine: CallEngine,
        io: IoRouter | None = None,
    ) -> None:
        self.registry = registry
        registry.register(_SlotsCollector(core, engine))
        self.io = IoMetrics(registry, io) if io is not None else None
        self._tasks = Counter(
            "blockx_worker_tasks",
            "Tasks that reached a terminal state, by state and failure code.",
            ["state", "failure_code"],
            registry=registry,
        )
        self._duration = Histogram(
            "blockx_worker_task_duration_seconds",
            "From SubmitTask accepted to the terminal state.",
            ["state"],
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )

        self._offloaded = Counter(
            "blockx_worker_offloaded_parses",
            "Large configs checked, parsed or built on a thread instead of the event loop, "
            "by the step (submit, builder, writer).",
            ["step"],
            registry=registry,
        )

    def work_offloaded(self, step: str) -> None:
        self._offloaded.labels(step).inc()

    def task_converged(self, command: TaskConverged, seconds: float | None) -> None:
        code = command.result.failure_code
        self._tasks.labels(command.state.value, code.value if code else "").inc()
        if seconds is not None:
            self._duration.labels(command.state.value).observe(seconds)
