"""The Sync Invoker's Prometheus metrics: requests by RPC and outcome, invoke latency,
and gauges read from the service when scraped."""

from __future__ import annotations

import logging
from typing import Protocol, assert_never

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from blockx_server.io.metrics import IoMetrics
from blockx_server.io.router import IoRouter
from blockx_server.runtime.logs import log_event
from blockx_server.syncinvoker.outcome import InvokeFailed, InvokeOutcome, InvokeSucceeded

# One DEBUG event per finished invoke, with the caller's call_id.
log = logging.getLogger("blockx.invoke")


class InvokerState(Protocol):
    """What the gauges read from the Sync Invoker when scraped (its service)."""

    @property
    def in_flight(self) -> int: ...
    @property
    def executors_up(self) -> int: ...
    @property
    def code_epoch(self) -> int: ...
    @property
    def ready(self) -> bool: ...


class _StateCollector(Collector):
    def __init__(self, service: InvokerState) -> None:
        self._service = service

    def collect(self) -> list[GaugeMetricFamily]:
        service = self._service
        return [
            GaugeMetricFamily(
                "blockx_syncinvoker_invokes_in_flight",
                "Invoke and DebugInvoke requests running now.",
                value=service.in_flight,
            ),
            GaugeMetricFamily(
                "blockx_syncinvoker_executors_up",
                "Python Executor processes connected to this Sync Invoker.",
                value=service.executors_up,
            ),
            GaugeMetricFamily(
                "blockx_syncinvoker_code_epoch",
                "The current Function Code View epoch (0 before code is loaded).",
                value=service.code_epoch,
            ),
            GaugeMetricFamily(
                "blockx_syncinvoker_ready", "1 when invokes are accepted.", value=int(service.ready)
            ),
        ]


class SyncInvokerMetrics:
    def __init__(self, registry: CollectorRegistry, io: IoRouter | None = None) -> None:
        self.registry = registry
        self.io = IoMetrics(registry, io) if io is not None else None
        self._requests = Counter(
            "blockx_syncinvoker_requests",
            "Requests by RPC and outcome: ok, a failure code, or the gRPC status of a refusal.",
            ["rpc", "outcome"],
            registry=registry,
        )
        self._latency = Histogram(
            "blockx_syncinvoker_invoke_duration_seconds",
            "Wall time of accepted Invoke / DebugInvoke requests, by RPC and success.",
            ["rpc", "success"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60),
        )

    def watch(self, service: InvokerState) -> None:
        self.registry.register(_StateCollector(service))

    def outcome(self, rpc: str, outcome: str) -> None:
        self._requests.labels(rpc, outcome).inc()

    def invoked(self, rpc: str, outcome: InvokeOutcome, seconds: float, function: str) -> None:
        match outcome:
            case InvokeSucceeded():
                success, failure_code = True, None
            case InvokeFailed(failure=failure):
                success, failure_code = False, failure.kind.value
            case _:
                assert_never(outcome)
        self.outcome(rpc, failure_code or "ok")
        self._latency.labels(rpc, "true" if success else "false").observe(seconds)
        log_event(
            log,
            f"{rpc} {outcome.call_id} of {function} finished",
            {
                "event": "invoked",
                "rpc": rpc,
                "call_id": outcome.call_id,
                "function": function,
                "code_epoch": outcome.code_epoch,
                "success": success,
                "failure_code": failure_code,
                "duration_ms": round(seconds * 1000, 3),
                "cpu_us": outcome.cpu_us,
                "io_us": outcome.io_us,
            },
            logging.DEBUG,
        )
