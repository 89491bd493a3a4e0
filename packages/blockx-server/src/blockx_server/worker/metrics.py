"""Worker metrics (Prometheus), on BLOCKX_PROMETHEUS_LISTEN_ADDR / BLOCKX_PROMETHEUS_PATH.

Per Worker: slots by state, executors and their restarts, the code epoch, tasks by
terminal state, the process's CPU and memory (``process_*``). Per function
(``blockx_function_*{function}``): calls, failures by kind, Calls phase latency,
the calls' CPU, IO and executor time. docs/observability.md lists them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, assert_never

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from blockx_core.code_view import FunctionCodeView
from blockx_core.dispatch import CallsConverged, CallsFailed, CallUsage, ConvergeTaskCalls
from blockx_core.load_series import LoadTotals
from blockx_core.task import TaskState
from blockx_core.worker import TaskConverged, WorkerCore
from blockx_executor import protocol as wire
from blockx_server.calls.engine import CallEngine
from blockx_server.io.errors import IoOutcome
from blockx_server.io.metrics import IoMetrics
from blockx_server.io.router import IoRouter
from blockx_server.worker.call_records import CallRecordStore


class _SlotsCollector(Collector):
    """Slot table and executors, read at scrape time."""

    def __init__(
        self, core: WorkerCore, engine: CallEngine, code_view: FunctionCodeView | None
    ) -> None:
        self._core = core
        self._engine = engine
        self._code_view = code_view

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
        yield CounterMetricFamily(
            "blockx_worker_executor_restarts",
            "Executor processes started again after one exited or was killed.",
            value=self._engine.pool.restarts,
        )
        current = None if self._code_view is None else self._code_view.current
        yield GaugeMetricFamily(
            "blockx_worker_code_epoch",
            "The current Function Code View epoch (0 before code is loaded).",
            value=0 if current is None else current.epoch,
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


class _CallRecordsCollector(Collector):
    """The failed calls' records the Worker keeps (GetCallRecord), read at scrape time."""

    def __init__(self, store: CallRecordStore) -> None:
        self._store = store

    def collect(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "blockx_worker_call_records",
            "Records of failed calls kept for GetCallRecord.",
            value=len(self._store),
        )
        yield GaugeMetricFamily(
            "blockx_worker_call_record_bytes",
            "What the kept call records hold (at most 64 MiB).",
            value=self._store.size,
        )


# Distinct ``function`` label values kept; calls of any further name count under
# OTHER_FUNCTIONS, so misspelt names in task configs cannot grow a scrape without end.
MAX_FUNCTION_LABELS: Final = 500
OTHER_FUNCTIONS: Final = "(other)"


class FunctionCalls:
    """The calls of one function, run after run (a CallObserver, see calls/run.py)."""

    def __init__(self, metrics: FunctionMetrics, function: str) -> None:
        self._calls = metrics.calls.labels(function)
        self._cpu = metrics.cpu_seconds.labels(function)
        self._io = metrics.io_seconds.labels(function)
        self._held = metrics.executor_seconds.labels(function)
        self._latency = metrics.calls_phase_seconds.labels(function)
        self._failures = metrics.failures
        self._function = function
        self._metrics = metrics

    def call_finished(self, call_id: int, cpu_us: int, io_us: int) -> None:
        self._calls.inc()
        self._metrics.calls_finished += 1

    def calls_measured(self, usage: CallUsage) -> None:
        self._cpu.inc(usage.cpu_ns / 1e9)
        self._io.inc(usage.io_us / 1e6)
        self._held.inc(usage.held_ms / 1e3)

    def call_output(self, call_id: int, text: str) -> None:
        pass

    def io_traced(self, call_id: int, request: wire.IoRequested, outcome: IoOutcome) -> None:
        pass

    def calls_converged(self, converged: ConvergeTaskCalls, seconds: float) -> None:
        """One task's Calls phase of this function ended after ``seconds``."""
        self._latency.observe(seconds)
        match converged:
            case CallsConverged():
                return
            case CallsFailed(failed_call=failed):
                kind = converged.failure_code if failed is None else failed.kind
                self._failures.labels(self._function, kind.value).inc()
            case _:
                assert_never(converged)


class FunctionMetrics:
    """``blockx_function_*{function}``: what the calls of each function did."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "blockx_function_calls",
            "Calls that finished, every attempt and sub-call included, by function.",
            ["function"],
            registry=registry,
        )
        self.failures = Counter(
            "blockx_function_failures",
            "Calls phases that failed, by function and kind: the failing call's kind "
            "(USER_ERROR, BUDGET_EXCEEDED, ...) or the task's failure code.",
            ["function", "kind"],
            registry=registry,
        )
        self.calls_phase_seconds = Histogram(
            "blockx_function_calls_phase_duration_seconds",
            "Wall time of one task's calls of the function, first dispatch to convergence.",
            ["function"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60),
        )
        self.cpu_seconds = Counter(
            "blockx_function_cpu_seconds",
            "CPU time of the calls' executor threads, as the Worker measured it.",
            ["function"],
            registry=registry,
        )
        self.io_seconds = Counter(
            "blockx_function_io_seconds",
            "IO backend time of the calls' requests.",
            ["function"],
            registry=registry,
        )
        self.executor_seconds = Counter(
            "blockx_function_executor_seconds",
            "Wall time the calls held an executor (running, not waiting on IO or sub-calls).",
            ["function"],
            registry=registry,
        )
        self._by_function: dict[str, FunctionCalls] = {}
        # Every function's calls that finished since the process started.
        self.calls_finished = 0

    def of(self, function: str) -> FunctionCalls:
        calls = self._by_function.get(function)
        if calls is None:
            # Names come from task configs: past the bound they share one series.
            if len(self._by_function) >= MAX_FUNCTION_LABELS:
                return self.of(OTHER_FUNCTIONS)
            calls = self._by_function[function] = FunctionCalls(self, function)
        return calls


class WorkerMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        core: WorkerCore,
        engine: CallEngine,
        io: IoRouter | None = None,
        code_view: FunctionCodeView | None = None,
    ) -> None:
        self.registry = registry
        registry.register(_SlotsCollector(core, engine, code_view))
        # process_cpu_seconds_total, process_resident_memory_bytes, open fds, ...
        ProcessCollector(registry=registry)
        self.functions = FunctionMetrics(registry)
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

        self._tasks_failed = 0
        self._offloaded = Counter(
            "blockx_worker_offloaded_parses",
            "Large configs checked, parsed or built on a thread instead of the event loop, "
            "by the step (submit, builder, writer, record: a failed call's record encoded).",
            ["step"],
            registry=registry,
        )

    def watch_call_records(self, store: CallRecordStore) -> None:
        self.registry.register(_CallRecordsCollector(store))

    def work_offloaded(self, step: str) -> None:
        self._offloaded.labels(step).inc()

    def load_totals(self) -> LoadTotals:
        """The counters the Worker page's time series samples."""
        return LoadTotals(
            calls_finished=self.functions.calls_finished, tasks_failed=self._tasks_failed
        )

    def task_converged(self, command: TaskConverged, seconds: float | None) -> None:
        if command.state is TaskState.FAILED:
            self._tasks_failed += 1
        code = command.result.failure_code
        self._tasks.labels(command.state.value, code.value if code else "").inc()
        if seconds is not None:
            self._duration.labels(command.state.value).observe(seconds)
