"""Wiring and lifetime of one Worker process.

Start: executors, function code, gRPC server; the Worker turns ready (and starts
heartbeating into etcd) once every executor has heartbeated and the code is loaded.
Timers are armed from the core's next deadline (the Orchestrator re-arms after
every command batch) and from the code view's next collection; nothing polls but
the FUNCTIONS_DIR reader. SIGTERM/SIGINT drain: the etcd lease is revoked at once so
coordinators stop routing here, new RequestTaskSlot/SubmitTask answer UNAVAILABLE,
GetTaskResult and WatchTasks keep working, running tasks converge for up to
DRAIN_TIMEOUT_MS, then the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from grpclib.health.check import ServiceStatus
from prometheus_client import CollectorRegistry

from blockx_core.code_view import FunctionCodeView
from blockx_core.error_rate import ErrorRateWindow
from blockx_core.worker import WorkerCore
from blockx_server.calls.call_spans import CallSpans
from blockx_server.calls.engine import CallEngine
from blockx_server.calls.functions import CodeViewRefresher, DirectoryFunctionStore
from blockx_server.etcd.heartbeat import (
    EtcdHeartbeatPublisher,
    HeartbeatPublisherConfig,
)
from blockx_server.io.chain_config import close_chains, open_chains
from blockx_server.io.config import open_router, start_iceberg, start_sink
from blockx_server.io.finality import ChainFinality
from blockx_server.pipeline.builders import builders_for
from blockx_server.pipeline.writers import writers_for
from blockx_server.runtime.clock import SYSTEM_CLOCK, Clock
from blockx_server.runtime.process import stop_on_signals
from blockx_server.runtime.serving import listening, serving_server
from blockx_server.worker.call_records import CallRecordStore
from blockx_server.worker.config import WorkerRuntimeConfig
from blockx_server.worker.describe import WorkerDescriber
from blockx_server.worker.load import LoadSampler
from blockx_server.worker.metrics import WorkerMetrics
from blockx_server.worker.offload import Offload
from blockx_server.worker.orchestrator import Orchestrator
from blockx_server.worker.service import WorkerService
from blockx_server.worker.subscriptions import SubscriptionManager
from blockx_server.worker.task_log import TaskLog

log = logging.getLogger(__name__)


class _Load:
    """What the heartbeat reports of this Worker."""

    def __init__(self, core: WorkerCore, error_rate: ErrorRateWindow) -> None:
        self._core = core
        self._error_rate = error_rate

    def heartbeat_counts(self, now_ms: int) -> tuple[int, int, int]:
        return self._core.derive_heartbeat()

    def error_rate(self, now_ms: int) -> float:
        return self._error_rate.rate(now_ms)


async def serve(
    config: WorkerRuntimeConfig,
    *,
    stop: asyncio.Event | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    stop = stop or stop_on_signals()
    calls = config.calls
    core = WorkerCore(config.core, incarnation=uuid.uuid4().hex[:8])
    chains = await open_chains(config.chains, config.io.finality_refresh_ms)
    sink = await start_sink(config.sink)
    iceberg = await start_iceberg(config.iceberg)
    io = open_router(
        calls.memory_seed_file,
        (),
        sink=sink,
        iceberg=iceberg,
        settings=config.io,
        clock=clock,
        chains=chains,
    )
    task_log = TaskLog(config.advertise_addr)
    # A task's call spans are children of its CALLS phase span.
    spans = CallSpans(calls.engine.trace_calls_per_task, parent_of=task_log.phase_span)
    engine = CallEngine(calls.engine, clock, spans=spans)
    # A snapshot is kept while a task pinned to it can still run.
    view = FunctionCodeView(retention_ms=config.core.max_task_timeout_ms)
    refresher = CodeViewRefresher(
        DirectoryFunctionStore(calls.functions_dir), view, clock, calls.functions_poll_interval_ms
    )
    error_rate = ErrorRateWindow()
    metrics = WorkerMetrics(CollectorRegistry(), core, engine, io, code_view=view)
    call_records = CallRecordStore(config.calls.record_max_bytes, config.core.result_retention_ms)
    metrics.watch_call_records(call_records)
    orchestrator = Orchestrator(
        core,
        engine,
        view,
        io,
        # The block and the bundle cluster serve different plug-ins.
        builders_for(config.profile.deployment),
        writers_for(config.profile.deployment),
        SubscriptionManager(),
        clock,
        config.admission,
        error_rate,
        metrics.task_converged,
        refresher.rearm_collection,
        stream_build=config.stream_build,
        offload=Offload(on_offloaded=metrics.work_offloaded),
        task_log=task_log,
        function_calls=metrics.functions.of,
        call_records=call_records,
    )
    publisher = EtcdHeartbeatPublisher(
        HeartbeatPublisherConfig(
            endpoints=config.etcd_endpoints,
            registry_prefix=config.registry_prefix,
            worker_addr=config.advertise_addr,
            interval_ms=config.heartbeat_interval_ms,
            lease_ttl_s=config.lease_ttl_s,
            security=config.etcd_security,
        ),
        _Load(core, error_rate),
        clock,
    )
    load = LoadSampler(core, metrics.load_totals, clock)
    describer = WorkerDescriber(
        orchestrator,
        load,
        worker_addr=config.advertise_addr,
        program=config.profile.program,
        started_ms=clock.now_ms(),
        executors_configured=calls.engine.pool.count,
    )
    service = WorkerService(orchestrator, config.advertise_addr, describer)
    # grpc.health.v1: SERVING once ready, NOT_SERVING while draining.
    server, serving = serving_server(
        service,
        keepalive_time_ms=config.keepalive_time_ms,
        keepalive_timeout_ms=config.keepalive_timeout_ms,
        limits=config.grpc_limits,
    )
    await refresher.refresh_once()  # a broken FUNCTIONS_DIR stops start-up here
    await engine.start()
    try:
        async with listening(server, config, metrics.registry, config.grpc_tls.server_context()):
            log.info(
                "%s serving worker.v1 on %s:%d as %s (registry %s, %d slots, %d executors)",
                config.profile.program,
                config.listen_host or "0.0.0.0",
                config.listen_port,
                config.advertise_addr,
                config.registry_prefix,
                config.core.task_slots,
                calls.engine.pool.count,
            )
            async with asyncio.TaskGroup() as tasks:
                background = [
                    tasks.create_task(refresher.run()),
                    tasks.create_task(load.run()),
                    tasks.create_task(_become_ready(engine, refresher, core, publisher, serving)),
                ]
                for chain_io in chains:
                    if isinstance(chain_io.finality, ChainFinality):
                        background.append(tasks.create_task(chain_io.finality.run()))
                await stop.wait()
                log.info("draining: deregistering and letting running tasks finish")
                serving.set(False)
                # New work is refused before the heartbeat goes: a coordinator that
                # still has this Worker in its view gets UNAVAILABLE, not a slot.
                orchestrator.refuse_new_work()
                await publisher.deregister()
                await orchestrator.drain(config.drain_timeout_ms / 1000)
                for task in background:
                    task.cancel()
        log.info("drained; exiting")
    finally:
        await engine.close()
        await close_chains(chains)
        if sink is not None:
            await sink.close()
        if iceberg is not None:
            await iceberg.close()


async def _become_ready(
    engine: CallEngine,
    refresher: CodeViewRefresher,
    core: WorkerCore,
    publisher: EtcdHeartbeatPublisher,
    serving: ServiceStatus,
) -> None:
    await engine.wait_ready()
    await refresher.wait_first_snapshot()
    core.set_ready(True)
    serving.set(True)
    log.info("ready: executors heartbeating, function code loaded")
    await publisher.run()
