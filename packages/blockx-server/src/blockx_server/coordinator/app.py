"""Wiring and lifetime of one Coordinator process (the specification's ``app.Run``)."""

from __future__ import annotations

import asyncio
import logging

from grpclib.health.check import ServiceCheck
from grpclib.health.service import Health
from prometheus_client import CollectorRegistry

from blockx_core.coordinator import CoordinatorCore
from blockx_core.registry import RegistryKind
from blockx_server.coordinator.config import CoordinatorRuntimeConfig
from blockx_server.coordinator.metrics import CoordinatorMetrics
from blockx_server.coordinator.reservation import ReservationLoop
from blockx_server.coordinator.service import BundleCoordinatorService, CoordinatorService
from blockx_server.coordinator.slot_reserver import GrpcSlotReserver
from blockx_server.etcd.watcher import EtcdWorkerWatcher
from blockx_server.runtime.clock import SYSTEM_CLOCK, Clock
from blockx_server.runtime.process import stop_on_signals
from blockx_server.runtime.serving import bounded_server, listening

log = logging.getLogger(__name__)


async def serve(
    config: CoordinatorRuntimeConfig,
    *,
    stop: asyncio.Event | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Run until ``stop`` is set (or SIGINT/SIGTERM when ``stop`` is None)."""
    stop = stop or stop_on_signals()
    core = CoordinatorCore(config.core)
    watcher = EtcdWorkerWatcher(config.watcher, core, clock)
    metrics = CoordinatorMetrics(CollectorRegistry(), watcher.worker_count_by_format)
    reserver = GrpcSlotReserver(
        timeout_ms=config.worker_rpc_timeout_ms, ssl=config.grpc_tls.client_context()
    )
    loop = ReservationLoop(core, reserver, clock, config.handler, metrics)
    # Each deployment registers only its own service.
    service = (
        CoordinatorService(loop)
        if config.profile.deployment is RegistryKind.BLOCK
        else BundleCoordinatorService(loop)
    )

    # grpc.health.v1: SERVING while the worker view is trusted.
    async def view_trusted() -> bool:
        return core.is_ready(clock.now_ms())

    health = Health({service: [ServiceCheck(view_trusted, check_ttl=1.0, check_timeout=1.0)]})
    grpc_server = bounded_server([service, health], limits=config.grpc_limits)
    try:
        async with listening(
            grpc_server, config, metrics.registry, config.grpc_tls.server_context()
        ):
            log.info(
                "%s serving %s on %s:%d, watching %s at %s",
                config.profile.program,
                config.profile.service,
                config.listen_host or "0.0.0.0",
                config.listen_port,
                ",".join(config.watcher.key_prefixes),
                ",".join(config.watcher.endpoints),
            )
            async with asyncio.TaskGroup() as tasks:
                watch_task = tasks.create_task(watcher.run())
                await stop.wait()
                log.info("shutting down")
                # Stop answering before the worker view stops following etcd.
                grpc_server.close()
                await grpc_server.wait_closed()
                watch_task.cancel()
    finally:
        reserver.close()
