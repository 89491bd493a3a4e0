"""The async BlockX client.

    async with Client() as client:
        result = await client.run(Task.call_list("hello_world", [["ct2"], ["blockx"]]))
        print(result.state, result.outputs())

``run`` reserves a slot through the task's cluster Coordinator (backing off while
every worker is full or the coordinator is unreachable), submits to the returned
Worker and waits for the terminal state on a Watch stream; a Worker that vanishes
meanwhile makes the result WORKER_LOST. ``run_many`` does that for many tasks with
bounded concurrency and one Watch stream per worker for many task_ids, and yields
an outcome for every task: one that could not be placed is a FAILED result whose
``failure_code`` says why (``ClientFailureCode``).

``Client`` is the facade; each concern lives in its own module: placement with
back-off (``_placement``), the worker.v1 calls (``_worker_rpc``), watch batching
and lost workers (``_watch``), the client's own outcomes (``_outcomes``),
``run_many`` (``_run_many``), function handles (``functions``), the channels
(``transport``) and the protobuf conversion (``_convert``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Final

from blockx_client._options import ClientOptions, GrpcTls, client_environ, proxy_socket_of
from blockx_client._outcomes import outcome_of_error
from blockx_client._placement import Placement
from blockx_client._run_many import run_many as _run_many
from blockx_client._watch import Watchers
from blockx_client._worker_rpc import WorkerRpc
from blockx_client.attempts import Attempt, AttemptBook, AttemptPump, Retrying
from blockx_client.backoff import RetryPolicy
from blockx_client.cluster_tasks import (
    DEFAULT_CONCURRENCY,
    DEFAULT_LIMIT_PER_WORKER,
    DEFAULT_WORKER_TIMEOUT_S,
    Registry,
    TaskFilter,
    find_task,
    list_cluster_tasks,
)
from blockx_client.errors import (
    BlockxError,
    InvalidRequestError,
    SubmitUncertainError,
    TaskNotFoundError,
)
from blockx_client.explain import explain_placement
from blockx_client.functions import FunctionHandle
from blockx_client.models import (
    Cancellation,
    Cluster,
    ClusterTasks,
    PlacementReport,
    ProgressCallback,
    Reservation,
    SubmitAnswer,
    Task,
    TaskHolders,
    TaskInputDiffersError,
    TaskResult,
    TaskUpdate,
    WorkerDescription,
)
from blockx_client.routing import route
from blockx_client.transport import DEFAULT_KEEPALIVE_S, Transport
from blockx_core.call_record import CallRecord

__all__ = [
    "DEFAULT_COORDINATOR",
    "DEFAULT_SYNC_INVOKER",
    "Client",
    "FunctionHandle",
    "SubmitAnswer",
]

DEFAULT_COORDINATOR: Final = "127.0.0.1:8080"
DEFAULT_SYNC_INVOKER: Final = "127.0.0.1:9091"


class Client:
    """An async client of a BlockX deployment. Use as ``async with Client(...)``.

    Every RPC goes through the proxy's Unix socket when one is known: the
    ``proxy_socket`` argument, ``PROXY_SOCKET_PATH``, or the running ``blockx dev
    up``'s (unless an address is named by an argument or the environment); with
    ``direct=True`` the client dials each address itself.

    ``tls`` (default: ``GrpcTls.from_environ()``, the ``GRPC_TLS_*`` variables)
    secures every direct channel. While a call or a Watch stream is open, every
    channel pings its peer each ``keepalive_s`` and drops a connection whose ping
    goes unanswered that long, so a peer cut off silently (a link down) fails its
    calls; a Worker's tasks then become WORKER_LOST as for a refused connection."""

    def __init__(
        self,
        *,
        coordinator: str | None = None,
        bundle_coordinator: str | None = None,
        sync_invoker: str | None = None,
        proxy_socket: str | None = None,
        direct: bool = False,
        tls: GrpcTls | None = None,
        retry: RetryPolicy | None = None,
        rpc_timeout_s: float = 30.0,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        rng: random.Random | None = None,
    ) -> None:
        env = client_environ()
        named = (coordinator, bundle_coordinator, sync_invoker)
        proxy = proxy_socket_of(env, proxy_socket, direct=direct, addresses=named)
        settings = [
            env.setting("BLOCKX_COORDINATOR", coordinator, DEFAULT_COORDINATOR),
            env.setting("BLOCKX_BUNDLE_COORDINATOR", bundle_coordinator),
            env.setting("BLOCKX_SYNC_INVOKER", sync_invoker, DEFAULT_SYNC_INVOKER),
        ]
        block, bundle, sync = (s.value for s in settings)
        if proxy is not None:
            settings.append(env.setting("PROXY_SOCKET_PATH", proxy_socket))
        self._options = ClientOptions(
            coordinator=block or DEFAULT_COORDINATOR,
            bundle_coordinator=bundle,
            sync_invoker=sync or DEFAULT_SYNC_INVOKER,
            retry=retry or RetryPolicy(),
            rpc_timeout_s=rpc_timeout_s,
        )
        tls = tls if tls is not None else GrpcTls.from_environ(env)
        self._transport = Transport(
            proxy,
            tls.ssl_context(),
            keepalive_s=keepalive_s,
            settings=settings,
        )
        self._workers = WorkerRpc(self._options, self._transport)
        rng = rng or random.Random()
        self._placement = Placement(self._options, self._transport, self._workers, rng)
        self._watchers = Watchers(self._workers, self._options, rng)
        # The tasks ``run`` has placed (or is submitting) and waits for: their workers.
        self._in_flight: dict[str, str] = {}

    # ---- settings (read on every call, so setting one takes effect at once) -------------

    @property
    def coordinator(self) -> str:
        return self._options.coordinator

    @coordinator.setter
    def coordinator(self, addr: str) -> None:
        self._options.coordinator = addr

    @property
    def bundle_coordinator(self) -> str | None:
        return self._options.bundle_coordinator

    @bundle_coordinator.setter
    def bundle_coordinator(self, addr: str | None) -> None:
        self._options.bundle_coordinator = addr

    @property
    def sync_invoker(self) -> str:
        return self._options.sync_invoker

    @sync_invoker.setter
    def sync_invoker(self, addr: str) -> None:
        self._options.sync_invoker = addr

    @property
    def retry(self) -> RetryPolicy:
        return self._options.retry

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None:
        self._options.retry = policy

    @property
    def rpc_timeout_s(self) -> float:
        return self._options.rpc_timeout_s

    @rpc_timeout_s.setter
    def rpc_timeout_s(self, seconds: float) -> None:
        self._options.rpc_timeout_s = seconds

    @property
    def proxied(self) -> bool:
        return self._transport.proxied

    @property
    def proxy_socket(self) -> str | None:
        """The proxy's Unix socket every RPC goes through; None: direct."""
        return self._transport.proxy_socket

    # ---- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._watchers.close()
        self._transport.close()

    # ---- placement -------------------------------------------------------------------

    async def reserve_worker_slot(
        self,
        task_id: str | None = None,
        *,
        cluster: Cluster = Cluster.BLOCK,
        deadline_s: float | None = None,
    ) -> Reservation:
        """ReserveWorkerSlot with back-off: RESOURCE_EXHAUSTED → jittered exponential
        back-off until the deadline; UNAVAILABLE → one immediate retry, then back-off
        until the deadline (a bounded number of times without one); an unreachable
        coordinator → the same, until the deadline (``retry.unreachable_s`` without
        one), then CoordinatorUnreachableError; ABORTED → wait one slot TTL, then the
        same task_id again."""
        return await self._placement.reserve_worker_slot(task_id, cluster, deadline_s)

    async def explain_placement(
        self, worker_addr: str | None = None, *, cluster: Cluster = Cluster.BLOCK
    ) -> PlacementReport:
        """Every worker's eligibility and reason (or only ``worker_addr``'s), from the
        ``cluster``'s coordinator."""
        return await explain_placement(
            self._transport,
            self._placement.coordinator_addr(cluster),
            self._options.rpc_timeout_s,
            worker_addr,
            cluster=cluster,
        )

    async def request_task_slot(
        self, worker_addr: str, task_id: str | None = None, *, ttl_ms: int = 5000
    ) -> Reservation:
        """RequestTaskSlot on a named worker (no coordinator, no back-off)."""
        return await self._workers.request_task_slot(worker_addr, task_id, ttl_ms=ttl_ms)

    # ---- worker.v1 --------------------------------------------------------------------

    async def submit_task(self, task: Task, *, worker_addr: str, slot_id: str = "") -> SubmitAnswer:
        """SubmitTask to a worker; without ``slot_id`` the worker reserves one inline."""
        return await self._workers.submit_task(task, worker_addr=worker_addr, slot_id=slot_id)

    async def get_task_result(self, task_id: str, *, worker_addr: str) -> TaskResult:
        """The task's current state; TaskNotFoundError when the worker answers
        NOT_FOUND (never submitted there, restarted since, or the result expired)."""
        return await self._workers.get_task_result(task_id, worker_addr=worker_addr)

    def watch_tasks(
        self, task_ids: Sequence[str], *, worker_addr: str, progress: bool = False
    ) -> AsyncIterator[TaskUpdate]:
        """One snapshot per task, then one terminal update per running task; ends when
        all are terminal. Closing the iterator closes the stream. With ``progress``
        the running tasks' call progress comes in between: updates with
        ``is_terminal`` false and ``progress`` set, each only when the counts changed
        (at most about five a second per task)."""
        return self._workers.watch_tasks(task_ids, worker_addr=worker_addr, progress=progress)

    async def cancel(
        self,
        task_id: str,
        *,
        worker_addr: str | None = None,
        workers: Sequence[str] | None = None,
        registry: Registry | None = None,
        worker_timeout_s: float | None = None,
    ) -> Cancellation:
        """Cancel a task (CancelTask, a BlockX addition), on ``worker_addr``, else on
        the worker this client's ``run`` placed it on, else on the one registered
        Worker (or one of ``workers``) that knows it.

        A running task stops and ends FAILED / CANCELLED, not retryable, "cancelled
        by a client" (the drivers never resubmit it; a waiting ``run`` returns that
        result); a Writer Plugin already writing finishes (WRITING); a finished task
        answers its state (FINISHED, or CANCELLED again); a task reserved but not
        submitted is NOT_SUBMITTED. TaskNotFoundError when no Worker asked knows it,
        InvalidRequestError when several do (name one with ``worker_addr``)."""
        addr = worker_addr or self._in_flight.get(task_id)
        if addr is None:
            addr = await self._holder(task_id, workers, registry, worker_timeout_s)
        return await self._workers.cancel_task(task_id, worker_addr=addr)

    async def call_record(
        self,
        task_id: str,
        call_index: int | None = None,
        *,
        worker_addr: str | None = None,
        workers: Sequence[str] | None = None,
        registry: Registry | None = None,
        worker_timeout_s: float | None = None,
    ) -> CallRecord:
        """The record of a failed call of a failed task (GetCallRecord, a BlockX
        addition): its arguments, code, every IO request with its answer and its
        failure, the fixture ``blockx replay`` runs offline. ``call_index`` is the
        root call's index in the task (None: the first that failed). Asked of
        ``worker_addr``, else of the Worker that knows the task, as ``cancel`` finds it.

        A Worker keeps records only of failed calls and only while the task's result
        is retained (RESULT_RETENTION_MS): TaskNotFoundError with its words when the
        task, the call or the record is gone."""
        addr = worker_addr or self._in_flight.get(task_id)
        if addr is None:
            addr = await self._holder(task_id, workers, registry, worker_timeout_s)
        return await self._workers.get_call_record(task_id, call_index, worker_addr=addr)

    def in_flight(self) -> dict[str, str]:
        """The tasks this client's ``run`` calls (``run_many``, the drivers) have placed
        and still wait for, by task_id: the worker each one runs on."""
        return dict(self._in_flight)

    async def cancel_in_flight(
        self, task_ids: Iterable[str] | None = None, *, timeout_s: float = 5.0
    ) -> list[Cancellation]:
        """Cancel the tasks in flight (``in_flight``; only those of ``task_ids`` when
        given, others ignored), all at once, best effort: the answers that came
        within ``timeout_s``. A worker that refused or did not answer is left out."""
        placed = (
            self._in_flight
            if task_ids is None
            else {t: self._in_flight[t] for t in task_ids if t in self._in_flight}
        )
        answers: list[Cancellation] = []

        async def one(task_id: str, addr: str) -> None:
            # Best effort: a task not cancelled ends by itself, or with its Worker.
            with contextlib.suppress(BlockxError):
                answers.append(await self._workers.cancel_task(task_id, worker_addr=addr))

        calls = [asyncio.create_task(one(t, a)) for t, a in list(placed.items())]
        try:
            if calls:
                await asyncio.wait(calls, timeout=timeout_s)
        finally:
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
        return answers

    async def _holder(
        self,
        task_id: str,
        workers: Sequence[str] | None,
        registry: Registry | None,
        timeout_s: float | None,
    ) -> str:
        """The one Worker asked that knows ``task_id``."""
        found = await self.find_task(
            task_id,
            workers=workers,
            registry=registry,
            worker_timeout_s=timeout_s or self._options.rpc_timeout_s,
        )
        holders = [r.worker_addr for r in found.results]
        if len(holders) == 1:
            return holders[0]
        if holders:
            raise InvalidRequestError(
                f"task {task_id} is known to {len(holders)} workers ({', '.join(holders)}): "
                "name one with worker_addr"
            )
        missing = f"no worker knows task {task_id} (asked {len(found.workers)})"
        if found.unreachable:
            down = ", ".join(u.worker_addr for u in found.unreachable)
            missing += f"; {len(found.unreachable)} did not answer and may hold it: {down}"
        raise TaskNotFoundError(missing)

    async def describe_worker(
        self, worker_addr: str, *, recent_failures: int = 0, running_tasks: int = 0
    ) -> WorkerDescription:
        """What the Worker is doing now: each executor and the call it runs (for how
        long), the calls waiting, the code epoch, memory, executor restarts, its
        running tasks (the first ``running_tasks``, oldest first; 0: 100), its last
        ``recent_failures`` failed tasks (0: 20; expired ones marked) and its load
        over the last minutes. Read-only; at most 1,000 of either."""
        return await self._workers.describe_worker(
            worker_addr, recent_failures=recent_failures, running_tasks=running_tasks
        )

    # ---- the whole cluster (every registered Worker) -----------------------------------

    async def list_tasks(
        self,
        task_filter: TaskFilter | None = None,
        *,
        workers: Sequence[str] | None = None,
        registry: Registry | None = None,
        limit_per_worker: int = DEFAULT_LIMIT_PER_WORKER,
        concurrency: int = DEFAULT_CONCURRENCY,
        worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
    ) -> ClusterTasks:
        """The tasks of every registered Worker (or of ``workers``), oldest first:
        reserved, running and retained, tombstones marked, and with
        ``task_filter.include_expired`` the failed tasks whose results expired. A
        Worker that does not answer within ``worker_timeout_s`` is in
        ``unreachable``, not an error. ``registry`` defaults to
        ``Registry.from_environ()`` (ETCD_ENDPOINTS)."""
        addrs = await self._worker_addrs(workers, registry)
        return await list_cluster_tasks(
            self._workers,
            addrs,
            task_filter or TaskFilter(),
            limit_per_worker=limit_per_worker,
            concurrency=concurrency,
            timeout_s=worker_timeout_s,
        )

    async def find_task(
        self,
        task_id: str,
        *,
        workers: Sequence[str] | None = None,
        registry: Registry | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
    ) -> TaskHolders:
        """Which registered Workers (or ``workers``) know ``task_id``, with each one's
        answer; normally one, none once its result has expired."""
        addrs = await self._worker_addrs(workers, registry)
        return await find_task(
            self._workers, addrs, task_id, concurrency=concurrency, timeout_s=worker_timeout_s
        )

    async def _worker_addrs(
        self, workers: Sequence[str] | None, registry: Registry | None
    ) -> list[str]:
        if workers is not None:
            return list(workers)
        return await (registry or Registry.from_environ()).worker_addrs()

    # ---- run -------------------------------------------------------------------------

    async def run(
        self,
        task: Task,
        *,
        cluster: Cluster | None = None,
        worker_addr: str | None = None,
        deadline_s: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> TaskResult:
        """Reserve (with back-off), submit, and wait for the terminal state;
        ``on_progress`` is told the task's call progress (a CallProgress) as it
        changes while it waits.

        The task_id (generated if empty) is kept across every placement retry: it is
        the idempotency key. With ``worker_addr`` the coordinator is skipped and the
        worker reserves a slot inline. A task that cannot be placed raises (a
        BlockxError saying why); once a Worker may have accepted it, the answer is
        always a result: the Worker's, or WORKER_LOST when the Worker vanished.
        A task_id the Worker already ran with another input raises
        TaskInputDiffersError (carrying that earlier answer) rather than returning
        a result that belongs to the other input; ``place`` and ``submit_task``
        return the answer with ``input_differs`` set instead.
        """
        task = task.with_id()
        try:
            return await self._run(task, cluster, worker_addr, deadline_s, on_progress)
        finally:
            self._in_flight.pop(task.task_id, None)

    submit_and_wait = run

    async def _run(
        self,
        task: Task,
        cluster: Cluster | None,
        worker_addr: str | None,
        deadline_s: float | None,
        on_progress: ProgressCallback | None,
    ) -> TaskResult:
        task_id = task.task_id
        # With a reserved slot, the Watch opens alongside SubmitTask rather than after
        # its answer: the Worker holds it on the ALLOCATED task until the terminal
        # update, so a short task's result needs no further round trip.
        early: dict[str, asyncio.Future[TaskResult]] = {}

        def watch_early(addr: str) -> None:
            self._in_flight[task_id] = addr
            early.setdefault(
                addr, self._watchers.expect(task_id, worker_addr=addr, on_progress=on_progress)
            )

        def forget_except(addr: str | None) -> None:
            for other in early:
                if other != addr:
                    self._watchers.forget(task_id, worker_addr=other)

        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        if worker_addr is not None:
            self._in_flight[task_id] = worker_addr
        try:
            placed = await self._placement.place(
                task, cluster or route(task), worker_addr, deadline, on_slot=watch_early
            )
        except SubmitUncertainError as exc:
            # The worker may hold the task: its own answer (or its absence) decides.
            forget_except(exc.worker_addr)
            self._in_flight[task_id] = exc.worker_addr
            return await self._watchers.wait(
                task_id, worker_addr=exc.worker_addr, on_progress=on_progress
            )
        except BaseException:
            forget_except(None)
            raise
        if placed.input_differs:
            forget_except(None)
            raise TaskInputDiffersError(placed)  # its result would be another input's
        if placed.result is not None:
            forget_except(None)
            return placed.result  # an earlier run of this task_id, retained
        forget_except(placed.worker_addr)
        self._in_flight[task_id] = placed.worker_addr
        return await self._watchers.wait(
            task_id, worker_addr=placed.worker_addr, on_progress=on_progress
        )

    async def place(
        self,
        task: Task,
        *,
        cluster: Cluster | None = None,
        worker_addr: str | None = None,
        deadline_s: float | None = None,
    ) -> SubmitAnswer:
        """Reserve (with back-off) and submit, without waiting for the end."""
        task = task.with_id()
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        return await self._placement.place(task, cluster or route(task), worker_addr, deadline)

    def run_many(
        self,
        tasks: Iterable[Task],
        *,
        concurrency: int = 32,
        cluster: Cluster | None = None,
        deadline_s: float | None = None,
    ) -> AsyncIterator[TaskResult]:
        """Run many tasks: at most ``concurrency`` placed and unfinished at a time,
        one result per task yielded as tasks finish (not in input order). Nothing
        raises for one task: a task that could not be placed yields a FAILED result
        with a ``ClientFailureCode`` (``retryable`` as the code says), and the rest
        go on."""

        async def one(task: Task) -> TaskResult:
            return await self.run(task, cluster=cluster, deadline_s=deadline_s)

        def failed(task: Task, exc: Exception) -> TaskResult:
            return outcome_of_error(task.task_id, exc)

        return _run_many(one, (t.with_id() for t in tasks), concurrency, failed)

    async def run_with_retries(
        self,
        task: Task,
        *,
        max_attempts: int = 3,
        cluster: Cluster | None = None,
        worker_addr: str | None = None,
        deadline_s: float | None = None,
    ) -> list[TaskResult]:
        """Run, and re-run retryable failures under a NEW task_id each time (a worker
        answers a resubmitted task_id with its retained result, never a new run),
        after a back-off (``blockx_client.attempts``). WORKER_LOST and transient
        placement failures (no slot, an unreachable or unavailable coordinator) are
        retryable results here, not exceptions. Returns every attempt, the last one
        last; each records its lineage."""
        task = task.with_id()

        async def run(this: Task) -> TaskResult:
            try:
                return await self.run(
                    this, cluster=cluster, worker_addr=worker_addr, deadline_s=deadline_s
                )
            except BlockxError as exc:
                return outcome_of_error(this.task_id, exc)

        book = AttemptBook(max_attempts=max_attempts)
        attempts: list[TaskResult] = []
        async with AttemptPump[None](book, run=run) as pump:
            attempt: Attempt | None = pump.open(0, task, task.task_id)
            while attempt is not None:
                pump.start(None, attempt)
                for finished in await pump.wait():
                    attempts.append(finished.result)
                    judged = pump.judge(finished.attempt, finished.result)
                    attempt = judged.next if isinstance(judged, Retrying) else None
        return attempts

    # ---- the Sync Invoker ---------------------------------------------------------------

    def function(self, name: str) -> FunctionHandle:
        """A handle to call one function through the Sync Invoker (outside executors)."""
        return FunctionHandle(name, options=self._options, transport=self._transport)
