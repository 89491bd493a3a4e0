"""The dashboard's data access: the SDK calls ``blockx workers``, ``blockx tasks``,
``blockx get-result`` and ``blockx why`` make, turned into page values (``views``).

Nothing here raises for a source that does not answer: etcd that cannot be read,
a Worker that does not answer or a Coordinator that is down become a ``Problem``
on the page, next to whatever the other sources did answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final

import msgspec

from blockx_cli.dashboard.config import DashboardConfig
from blockx_cli.dashboard.views import (
    Phase,
    PlacementPage,
    PluginRow,
    Problem,
    RunningTaskRow,
    TaskDetail,
    TaskPage,
    TaskRow,
    TasksPage,
    WorkerPage,
    WorkerRow,
    WorkersPage,
)
from blockx_client import (
    BlockxError,
    Client,
    Cluster,
    ListedTask,
    RegisteredWorker,
    Registry,
    TaskFilter,
    TaskResult,
    TaskState,
    UnreachableWorker,
    WorkerDescription,
    list_workers,
)
from blockx_core.registry import InvalidRegistryPrefix, parse_registry_prefix

# Tasks one listing takes from each Worker (ListTasks' own page bound).
LIST_LIMIT_PER_WORKER: Final = 10_000
_PREVIEW_BYTES: Final = 2_000


def _cluster(prefix: str) -> str:
    """The cluster a registry prefix belongs to ("block" or "bundle"), else the prefix."""
    try:
        return parse_registry_prefix(prefix).kind.value
    except InvalidRegistryPrefix:
        return prefix


CODE_EPOCH_NOTE: Final = (
    "The heartbeat does not carry the code epoch: each Worker's page shows it (and its "
    "executors, running tasks and recent failures), from the Worker itself."
)
# A call that has held its executor this long is highlighted on the Worker page.
LONG_CALL_MS: Final = 1_000
# What the Worker page asks of a Worker.
RECENT_FAILURES: Final = 20
RUNNING_TASKS: Final = 100
LISTED_STATES: Final = tuple(s.value for s in TaskState if s is not TaskState.NOT_FOUND)


def now_ms() -> int:
    return int(time.time() * 1000)


def _problem(source: str, exc: BaseException) -> Problem:
    if isinstance(exc, BlockxError):
        return Problem(source=source, error=exc.message)
    if isinstance(exc, TimeoutError):
        return Problem(source=source, error="no answer in time")
    return Problem(source=source, error=str(exc) or type(exc).__name__)


def _unreachable(workers: Iterable[UnreachableWorker]) -> list[Problem]:
    return [Problem(source=f"worker {u.worker_addr}", error=u.error) for u in workers]


def task_row(t: ListedTask, at_ms: int) -> TaskRow:
    progress = t.progress
    return TaskRow(
        task_id=t.task_id,
        state=t.state.value,
        worker_addr=t.worker_addr,
        function=t.function,
        call_builder=t.call_builder,
        chain=t.chain,
        slot_id=t.slot_id,
        created_ms=t.created_ms,
        converged_ms=t.converged_ms,
        age_ms=max(0, at_ms - t.created_ms),
        failure_code=t.failure_code or "",
        failure_summary=t.failure_summary,
        tombstone=t.tombstone,
        call_failures=t.call_failures,
        # None for a task that has made no calls (yet).
        calls_done=None if progress is None else progress.calls_done,
        calls_total=None if progress is None else progress.calls_total,
        calls_total_known=None if progress is None else progress.total_known,
        expired=t.expired,
    )


def worker_page(d: WorkerDescription, cluster: str, at_ms: int) -> WorkerPage:
    executors = sorted(
        d.executors,
        key=lambda e: (e.running is None, -(e.running.held_ms if e.running else 0), e.executor_id),
    )
    return WorkerPage(
        now_ms=at_ms,
        worker_addr=d.worker_addr,
        answered=True,
        cluster=cluster,
        program=d.program,
        ready=d.ready,
        draining=d.draining,
        uptime_ms=max(0, d.now_ms - d.started_ms),
        task_slots=d.task_slots,
        used_slots=d.reserved_slots + d.running_tasks,
        running_tasks=d.running_tasks,
        executors_configured=d.executors_configured,
        executors_busy=d.executors_busy,
        executors=tuple(executors),
        executor_restarts=d.executor_restarts,
        calls_waiting=d.calls_waiting,
        calls_in_flight=d.calls_in_flight,
        code_epoch=d.code_epoch,
        process_rss_bytes=d.process_rss_bytes,
        executors_rss_bytes=sum(e.rss_bytes for e in d.executors),
        call_deadline_ms=d.call_deadline_ms,
        call_wall_limit_ms=d.call_wall_limit_ms,
        long_call_ms=LONG_CALL_MS,
        # The Worker's own clock for ages: it stamped the times.
        running=tuple(
            RunningTaskRow(
                task=task_row(r.task, d.now_ms),
                phase=r.phase.value,
                deadline_in_ms=r.deadline_ms - d.now_ms,
            )
            for r in d.running
        ),
        recent_failures=tuple(task_row(t, d.now_ms) for t in d.recent_failures),
        failed_tasks_kept=d.failed_tasks_kept,
        result_retention_ms=d.result_retention_ms,
        load_interval_ms=d.load_interval_ms,
        load=d.load,
    )


class ClusterSource:
    """Reads the cluster for the pages; one ``Client`` for the dashboard's lifetime."""

    def __init__(self, config: DashboardConfig, client: Client) -> None:
        self.config = config
        self.client = client
        self.registry = Registry(
            endpoints=config.etcd_endpoints, prefixes=config.prefixes, access=config.access
        )

    async def _registered(self) -> list[RegisteredWorker]:
        """The registry's heartbeats (BlockxError when etcd cannot be read)."""
        return await list_workers(
            list(self.config.etcd_endpoints),
            list(self.config.prefixes),
            timeout_s=self.config.timeout_s,
            access=self.config.access,
        )

    async def workers(self) -> WorkersPage:
        at = now_ms()
        try:
            found = await self._registered()
        except BlockxError as exc:
            return WorkersPage(
                now_ms=at,
                workers=(),
                problems=(_problem("etcd", exc),),
                code_epoch_note=CODE_EPOCH_NOTE,
            )
        rows = tuple(
            WorkerRow(
                worker_addr=hb.worker_addr,
                cluster=_cluster(w.prefix),
                registry_prefix=w.prefix,
                task_slots=hb.task_slots,
                reserved_slots=hb.reserved_slots,
                running_tasks=hb.running_tasks,
                used_slots=hb.used_total,
                cpu_fraction=hb.cpu_percent,
                memory_fraction=hb.memory_percent,
                error_rate=hb.error_rate,
                memory_total_bytes=hb.memory_total_bytes,
                memory_available_bytes=hb.memory_available_bytes,
                process_rss_bytes=hb.process_rss_bytes,
                heartbeat_age_ms=max(0, at - hb.last_heartbeat_ms),
            )
            for w in found
            for hb in (w.heartbeat,)
        )
        return WorkersPage(now_ms=at, workers=rows, code_epoch_note=CODE_EPOCH_NOTE)

    async def tasks(
        self,
        *,
        state: str,
        function: str,
        q: str,
        limit: int,
        since_ms: int = 0,
        until_ms: int = 0,
    ) -> TasksPage:
        """Every registered Worker's tasks running ``function`` (the failures whose
        results expired included, marked), first seen in ``[since_ms, until_ms]``
        (0: no bound); the counts by state of those whose id contains ``q``; the
        newest ``limit`` in ``state`` as rows."""
        try:
            found = await self.client.list_tasks(
                TaskFilter(function=function, include_expired=True),
                registry=self.registry,
                limit_per_worker=LIST_LIMIT_PER_WORKER,
                worker_timeout_s=self.config.timeout_s,
            )
        except BlockxError as exc:
            return TasksPage(
                now_ms=now_ms(),
                state=state,
                function=function,
                q=q,
                limit=limit,
                counts=dict.fromkeys(LISTED_STATES, 0),
                matching=0,
                tasks=(),
                since_ms=since_ms,
                until_ms=until_ms,
                problems=(_problem("etcd", exc),),
            )
        at = now_ms()
        searched = [
            t
            for t in found.tasks
            if q in t.task_id
            and t.created_ms >= since_ms
            and (not until_ms or t.created_ms <= until_ms)
        ]
        counts = dict.fromkeys(LISTED_STATES, 0)
        for t in searched:
            counts[t.state.value] = counts.get(t.state.value, 0) + 1
        matching = [t for t in searched if not state or t.state.value == state]
        matching.sort(key=lambda t: (t.created_ms, t.task_id), reverse=True)
        return TasksPage(
            now_ms=at,
            state=state,
            function=function,
            q=q,
            limit=limit,
            counts=counts,
            matching=len(matching),
            tasks=tuple(task_row(t, at) for t in matching[:limit]),
            expired=sum(1 for t in searched if t.expired),
            since_ms=since_ms,
            until_ms=until_ms,
            workers_asked=found.workers,
            truncated_workers=found.truncated,
            problems=tuple(_unreachable(found.unreachable)),
        )

    async def worker(self, addr: str) -> WorkerPage:
        """What the registered Worker at ``addr`` is doing (its DescribeWorker). Only a
        registered Worker is asked: the page never dials an address it is handed."""
        try:
            found = await self._registered()
        except BlockxError as exc:
            return WorkerPage(now_ms=now_ms(), worker_addr=addr, problems=(_problem("etcd", exc),))
        registered = next((w for w in found if w.heartbeat.worker_addr == addr), None)
        if registered is None:
            problem = Problem(
                source=f"worker {addr}",
                error="not registered under "
                + " or ".join(self.config.prefixes)
                + ": the Workers page lists the registered ones",
            )
            return WorkerPage(now_ms=now_ms(), worker_addr=addr, problems=(problem,))
        try:
            described = await self.client.describe_worker(
                addr, recent_failures=RECENT_FAILURES, running_tasks=RUNNING_TASKS
            )
        except (BlockxError, OSError, TimeoutError) as exc:
            problem = _problem(f"worker {addr}", exc)
            return WorkerPage(now_ms=now_ms(), worker_addr=addr, problems=(problem,))
        cluster = _cluster(registered.prefix)
        return worker_page(described, cluster, now_ms())

    async def task(self, task_id: str) -> TaskPage:
        """Each Worker's answer for ``task_id``, with its listing (timestamps, calls)."""
        try:
            holders = await self.client.find_task(
                task_id, registry=self.registry, worker_timeout_s=self.config.timeout_s
            )
        except BlockxError as exc:
            return TaskPage(
                now_ms=now_ms(), task_id=task_id, holders=(), problems=(_problem("etcd", exc),)
            )
        problems = _unreachable(holders.unreachable)
        details = []
        for result in holders.results:
            listed: ListedTask | None = None
            try:
                # ListTasks has no id filter: the holder's listing is searched here.
                listing = await self.client.list_tasks(
                    workers=[result.worker_addr],
                    limit_per_worker=LIST_LIMIT_PER_WORKER,
                    worker_timeout_s=self.config.timeout_s,
                )
            except BlockxError as exc:
                problems.append(_problem(f"worker {result.worker_addr}", exc))
            else:
                problems += _unreachable(listing.unreachable)
                listed = next((t for t in listing.tasks if t.task_id == task_id), None)
            details.append(_detail(result, listed, now_ms()))
        expired: list[TaskRow] = []
        if not details:
            # No Worker answers for it: its result may have expired, leaving a summary.
            try:
                failed = await self.client.list_tasks(
                    TaskFilter(states=(TaskState.FAILED,), include_expired=True),
                    registry=self.registry,
                    limit_per_worker=LIST_LIMIT_PER_WORKER,
                    worker_timeout_s=self.config.timeout_s,
                )
            except BlockxError as exc:
                problems.append(_problem("etcd", exc))
            else:
                at = now_ms()
                expired = [
                    task_row(t, at) for t in failed.tasks if t.expired and t.task_id == task_id
                ]
        return TaskPage(
            now_ms=now_ms(),
            task_id=task_id,
            holders=tuple(details),
            expired=tuple(expired),
            workers_asked=holders.workers,
            problems=tuple(problems),
        )

    async def placement(self, cluster: Cluster) -> PlacementPage:
        client = self.client
        coordinator = (
            client.coordinator if cluster is Cluster.BLOCK else client.bundle_coordinator or ""
        )
        unknown = PlacementPage(
            now_ms=now_ms(),
            cluster=cluster.value,
            coordinator=coordinator,
            view_trusted=None,
            not_ready_reason="",
            workers=(),
        )
        if not coordinator and not client.proxied:
            return msgspec.structs.replace(unknown, not_configured=True)
        try:
            report = await client.explain_placement(cluster=cluster)
        except (BlockxError, OSError, TimeoutError) as exc:
            problem = _problem(f"{cluster.value} coordinator {coordinator}", exc)
            return msgspec.structs.replace(unknown, problems=(problem,))
        return PlacementPage(
            now_ms=now_ms(),
            cluster=cluster.value,
            coordinator=report.coordinator,
            view_trusted=report.view_trusted,
            not_ready_reason=report.not_ready_reason,
            workers=report.workers,
            recent_refusals=report.recent_refusals,
        )


def _phases(result: TaskResult, listed: TaskRow | None) -> tuple[Phase, ...]:
    """First seen (reserved or submitted), running, converged: what the Worker records."""
    state = result.state
    ran = state in (TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED)
    ended = state in (TaskState.SUCCEEDED, TaskState.FAILED)
    return (
        Phase(
            name="reserved / first seen",
            reached=True,
            at_ms=listed.created_ms if listed and listed.created_ms else None,
        ),
        Phase(name="running", reached=ran, note="builder, calls and writer"),
        Phase(
            name=state.value if ended else "converged",
            reached=ended,
            at_ms=listed.converged_ms if listed and listed.converged_ms else None,
            note=result.failure_code or "",
        ),
    )


def _detail(result: TaskResult, listed: ListedTask | None, at_ms: int) -> TaskDetail:
    row = task_row(listed, at_ms) if listed is not None else None
    return TaskDetail(
        worker_addr=result.worker_addr,
        state=result.state.value,
        phases=_phases(result, row),
        listed=row,
        success=result.success,
        failure_code=result.failure_code or "",
        failure_message=result.failure_message or result.error,
        retryable=result.retryable,
        attempt=result.attempt,
        original_task_id=result.original_task_id,
        may_have_run=result.may_have_run,
        plugin_results=tuple(
            PluginRow(
                plugin_name=p.plugin_name,
                success=p.success,
                failure_code=p.failure_code or "",
                failure_message=p.failure_message,
                result_bytes=len(p.result),
                result_preview=p.result[:_PREVIEW_BYTES].decode(errors="replace"),
            )
            for p in result.plugin_results
        ),
        call_failures=result.call_failures,
        call_failures_omitted=result.call_failures_omitted,
    )
