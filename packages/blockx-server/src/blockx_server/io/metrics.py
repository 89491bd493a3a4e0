"""The IO subsystem's Prometheus metrics, on every process with IO.

``blockx_io_requests_total{backend,op,outcome}`` counts every request answered at
the door (outcome ``ok`` or the IoError kind), including cache hits and shared
requests; ``blockx_io_backend_seconds{backend,op}`` times only the requests that
reached a backend. ``blockx_io_logs_decoded_total{chain}`` and
``blockx_io_logs_undecoded_total{chain}`` count the logs each chain's
io.logicalTypes decoded and those no registered ABI matched. The cache, singleflight
and admission figures are read from the router when scraped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import assert_never

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from blockx_server.io.backends.logical_types import LogicalTypesBackend
from blockx_server.io.errors import IoFailed, IoOk, IoOutcome
from blockx_server.io.router import IoRouter


class _IoStateCollector(Collector):
    def __init__(self, router: IoRouter) -> None:
        self._router = router

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        router, cache = self._router, self._router.cache
        yield CounterMetricFamily(
            "blockx_io_cache_hits", "Reads answered by the read cache.", value=cache.hits
        )
        yield CounterMetricFamily(
            "blockx_io_cache_misses",
            "Cacheable reads the read cache did not hold.",
            value=cache.misses,
        )
        yield GaugeMetricFamily(
            "blockx_io_cache_bytes", "Bytes the read cache holds.", value=cache.bytes_used
        )
        yield CounterMetricFamily(
            "blockx_io_singleflight_shared",
            "Reads that waited for an identical read of their task in flight.",
            value=router.shared_total,
        )
        limit = GaugeMetricFamily(
            "blockx_io_backend_limit", "Adaptive concurrency limit.", labels=["backend"]
        )
        in_flight = GaugeMetricFamily(
            "blockx_io_backend_inflight", "Requests at the backend now.", labels=["backend"]
        )
        for gate in router.gates():
            limit.add_metric([gate.backend], gate.limit)
            in_flight.add_metric([gate.backend], gate.in_flight)
        yield limit
        yield in_flight
        decoded = CounterMetricFamily(
            "blockx_io_logs_decoded",
            "Logs io.logicalTypes decoded with a registered ABI.",
            labels=["chain"],
        )
        undecoded = CounterMetricFamily(
            "blockx_io_logs_undecoded",
            "Logs io.logicalTypes was asked to decode that no registered ABI matched.",
            labels=["chain"],
        )
        for chain, decoding in _decoders(router):
            decoded.add_metric([chain], decoding.logs_decoded)
            undecoded.add_metric([chain], decoding.logs_undecoded)
        yield decoded
        yield undecoded


def _decoders(router: IoRouter) -> list[tuple[str, LogicalTypesBackend]]:
    """Each chain's io.logicalTypes by chain name ("" for one of no chain)."""
    found = [("", router.backend(LogicalTypesBackend.name))] + [
        (chain_io.chain.name, chain_io.backends.get(LogicalTypesBackend.name))
        for chain_io in router.chains()
    ]
    return [(name, b) for name, b in found if isinstance(b, LogicalTypesBackend)]


class IoMetrics:
    """Registers the IO metrics on ``registry`` and observes ``router``."""

    def __init__(self, registry: CollectorRegistry, router: IoRouter) -> None:
        registry.register(_IoStateCollector(router))
        self._requests = Counter(
            "blockx_io_requests",
            "IO requests by backend, operation and outcome (ok or the IoError kind).",
            ["backend", "op", "outcome"],
            registry=registry,
        )
        self._backend_seconds = Histogram(
            "blockx_io_backend_seconds",
            "Time of requests that reached a backend (admission queueing excluded).",
            ["backend", "op"],
            registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        router.observe(self)

    def request_done(self, backend: str, op: str, outcome: IoOutcome) -> None:
        match outcome:
            case IoOk():
                label = "ok"
            case IoFailed():
                label = outcome.kind.value
            case _:
                assert_never(outcome)
        self._requests.labels(backend, op, label).inc()

    def backend_done(self, backend: str, op: str, seconds: float) -> None:
        self._backend_seconds.labels(backend, op).observe(seconds)
