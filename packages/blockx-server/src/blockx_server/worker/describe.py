"""DescribeWorker: what this Worker is doing now, read from its parts (the core's
slot table, running tasks and failed tasks, the dispatcher's executors and queues,
the executor pool, the Function Code View, its own counters). It changes nothing;
a description costs O(executors + calls held + the tasks and failures asked for)."""

from __future__ import annotations

from typing import Final

import msgspec
import psutil

from blockx_core.errors import ErrorCode, Refusal
from blockx_core.worker import WorkerDescription
from blockx_server.worker.load import LoadSampler
from blockx_server.worker.orchestrator import Orchestrator

DEFAULT_RECENT_FAILURES: Final = 20
DEFAULT_RUNNING_TASKS: Final = 100
MAX_LISTED: Final = 1_000


def how_many(value: int, default: int, field: str) -> int | Refusal:
    """A request's count: 0 is ``default``; negative or above MAX_LISTED is refused."""
    if not 0 <= value <= MAX_LISTED:
        return Refusal(
            ErrorCode.INVALID_ARGUMENT,
            f"{field} must be 0 (the default, {default}) to {MAX_LISTED} (got {value})",
        )
    return value or default


class WorkerDescriber:
    def __init__(
        self,
        orchestrator: Orchestrator,
        load: LoadSampler,
        *,
        worker_addr: str,
        program: str,
        started_ms: int,
        executors_configured: int,
    ) -> None:
        self._orchestrator = orchestrator
        self._load = load
        self._worker_addr = worker_addr
        self._program = program
        self._started_ms = started_ms
        self._executors_configured = executors_configured
        self._process = psutil.Process()

    def describe(self, recent_failures: int, running_tasks: int) -> WorkerDescription:
        orchestrator = self._orchestrator
        core, engine = orchestrator.core, orchestrator.engine
        now_ms = orchestrator.clock.now_ms()
        total, reserved, running = core.derive_heartbeat()
        dispatch = engine.core
        current = orchestrator.code_view.current
        return WorkerDescription(
            worker_addr=self._worker_addr,
            program=self._program,
            now_ms=now_ms,
            started_ms=self._started_ms,
            ready=core.ready,
            draining=core.draining,
            task_slots=total,
            reserved_slots=reserved,
            running_tasks=running,
            executors_configured=self._executors_configured,
            executors=tuple(
                msgspec.structs.replace(state, pid=engine.pool.pid(state.executor_id) or 0)
                for state in dispatch.executor_states(now_ms)
            ),
            executor_restarts=engine.pool.restarts,
            calls_waiting=dispatch.calls_waiting(),
            calls_in_flight=dispatch.live_calls(),
            code_epoch=0 if current is None else current.epoch,
            process_rss_bytes=self._process.memory_info().rss,
            call_deadline_ms=dispatch.config.call_deadline_ms,
            call_wall_limit_ms=dispatch.config.wall_limit_ms,
            running=tuple(core.running_tasks(running_tasks, now_ms)),
            recent_failures=tuple(core.recent_failures(recent_failures, now_ms)),
            failed_tasks_kept=core.config.failed_tasks_kept,
            result_retention_ms=core.config.result_retention_ms,
            load_interval_ms=self._load.interval_ms,
            load=self._load.points(now_ms),
        )
