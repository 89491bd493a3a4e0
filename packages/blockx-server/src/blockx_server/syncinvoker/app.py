"""Wiring and lifetime of one Sync Invoker process.

Start: function code (a broken FUNCTIONS_DIR stops start-up), executors, the gRPC
server. Invokes answer UNAVAILABLE and grpc.health.v1 says NOT_SERVING until every
executor has heartbeated and the code is loaded; FUNCTIONS_DIR is then polled and
each change becomes a new epoch for later invokes. SIGTERM/SIGINT: health turns
NOT_SERVING, new requests answer UNAVAILABLE, running invokes get up to
DRAIN_TIMEOUT_MS to finish, then the process exits 0.

No slots, builders, writer plugins or etcd: the Sync Invoker is found by address
(the proxy routes ``syncinvoker.v1`` to it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import msgspec
from grpclib.health.check import ServiceStatus
from prometheus_client import CollectorRegistry

from blockx_core.code_view import FunctionCodeView
from blockx_server.calls.engine import CallEngine, CallEngineConfig
from blockx_server.calls.functions import CodeViewRefresher, DirectoryFunctionStore
from blockx_server.io.backends.base import IoBackend
from blockx_server.io.chain_config import close_chains, open_chains
from blockx_server.io.config import open_router, start_iceberg
from blockx_server.io.finality import ChainFinality
from blockx_server.runtime.clock import SYSTEM_CLOCK, Clock
from blockx_server.runtime.process import stop_on_signals
from blockx_server.runtime.serving import listening, serving_server
from blockx_server.syncinvoker.config import PROGRAM, SyncInvokerConfig
from blockx_server.syncinvoker.metrics import SyncInvokerMetrics
from blockx_server.syncinvoker.service import SyncInvokerService

log = logging.getLogger(__name__)


def engine_config(config: SyncInvokerConfig) -> CallEngineConfig:
    """The Calls settings with the largest budget an invoke may ask for as the
    engine's own: each invoke runs with its own, lower budget (run_calls(budget_ms=)),
    and a cancelled call still running past the ceiling gets its executor killed."""
    engine = config.calls.engine
    dispatch = msgspec.structs.replace(engine.dispatch, call_deadline_ms=config.max_timeout_ms)
    return msgspec.structs.replace(engine, dispatch=dispatch)


async def serve(
    config: SyncInvokerConfig,
    *,
    stop: asyncio.Event | None = None,
    backends: Sequence[IoBackend] = (),
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Run until ``stop`` is set (by default: SIGINT or SIGTERM). ``backends`` are
    IO backends registered beside ``memory`` (tests use them)."""
    stop = stop or stop_on_signals()
    calls = config.calls
    chains = await open_chains(config.chains, config.io.finality_refresh_ms)
    # Read-only here: a function's scope never writes, and the lake is not made.
    iceberg = await start_iceberg(config.iceberg, read_only=True)
    io = open_router(
        calls.memory_seed_file,
        backends,
        iceberg=iceberg,
        settings=config.io,
        clock=clock,
        chains=chains,
    )
    engine = CallEngine(engine_config(config), clock)
    # Every invoke pins its epoch for its whole run, so superseded code need not linger.
    view = FunctionCodeView(retention_ms=0)
    refresher = CodeViewRefresher(
        DirectoryFunctionStore(calls.functions_dir), view, clock, calls.functions_poll_interval_ms
    )
    metrics = SyncInvokerMetrics(CollectorRegistry(), io)
    service = SyncInvokerService(
        engine,
        view,
        io,
        default_timeout_ms=config.default_timeout_ms,
        max_timeout_ms=config.max_timeout_ms,
        max_concurrent=config.max_concurrent,
        metrics=metrics,
        clock=clock,
        record_max_bytes=calls.record_max_bytes,
    )
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
                "%s serving syncinvoker.v1 on %s:%d (%d executors, budget %d ms, at most %d ms)",
                PROGRAM,
                config.listen_host or "0.0.0.0",
                config.listen_port,
                calls.engine.pool.count,
                config.default_timeout_ms,
                config.max_timeout_ms,
            )
            async with asyncio.TaskGroup() as tasks:
                background = [
                    tasks.create_task(refresher.run()),
                    tasks.create_task(_become_ready(engine, refresher, service, serving)),
                ]
                for chain_io in chains:
                    if isinstance(chain_io.finality, ChainFinality):
                        background.append(tasks.create_task(chain_io.finality.run()))
                await stop.wait()
                log.info("stopping: refusing new requests, letting running invokes finish")
                serving.set(False)
                await _drain(service, config.drain_timeout_ms)
                for task in background:
                    task.cancel()
        log.info("stopped")
    finally:
        await engine.close()
        await close_chains(chains)
        if iceberg is not None:
            await iceberg.close()


async def _become_ready(
    engine: CallEngine,
    refresher: CodeViewRefresher,
    service: SyncInvokerService,
    serving: ServiceStatus,
) -> None:
    await engine.wait_ready()
    await refresher.wait_first_snapshot()
    service.set_ready()
    serving.set(True)
    log.info("ready: executors heartbeating, function code loaded")


async def _drain(service: SyncInvokerService, drain_timeout_ms: int) -> None:
    service.stop_accepting()
    try:
        async with asyncio.timeout(drain_timeout_ms / 1000):
            await service.wait_idle()
    except TimeoutError:
        log.warning(
            "%d invokes still running after DRAIN_TIMEOUT_MS; cancelling them",
            service.in_flight,
        )
