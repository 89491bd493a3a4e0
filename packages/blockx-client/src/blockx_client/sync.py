"""A synchronous facade over Client, for scripts and notebooks.

It runs the async client on a private event loop in a background thread, so it
works whether or not the caller already has a running loop (Jupyter does).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from typing import Any, TypeVar, overload

from blockx_client._options import GrpcTls
from blockx_client._sync_iter import iterate_on
from blockx_client.backoff import RetryPolicy
from blockx_client.client import Client
from blockx_client.cluster_tasks import (
    DEFAULT_CONCURRENCY,
    DEFAULT_LIMIT_PER_WORKER,
    DEFAULT_WORKER_TIMEOUT_S,
    Registry,
    TaskFilter,
)
from blockx_client.models import (
    Cancellation,
    Cluster,
    ClusterTasks,
    Invocation,
    PlacementReport,
    Precheck,
    ProgressCallback,
    Reservation,
    SubmitAnswer,
    Task,
    TaskHolders,
    TaskResult,
    TaskUpdate,
    WorkerDescription,
)
from blockx_client.transport import DEFAULT_KEEPALIVE_S
from blockx_core.call_record import CallRecord
from blockx_executor import in_call

T = TypeVar("T")


class SyncClient:
    """The same operations as Client, blocking. Use ``with SyncClient() as client:``."""

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
        """Client's options, spelled out so a type checker catches a misspelt one."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="blockx-client", daemon=True
        )
        self._thread.start()

        async def make() -> Client:  # on the loop: the client's channels belong to it
            return Client(
                coordinator=coordinator,
                bundle_coordinator=bundle_coordinator,
                sync_invoker=sync_invoker,
                proxy_socket=proxy_socket,
                direct=direct,
                tls=tls,
                retry=retry,
                rpc_timeout_s=rpc_timeout_s,
                keepalive_s=keepalive_s,
                rng=rng,
            )

        self._client: Client = self._run(make())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def reserve_worker_slot(
        self,
        task_id: str | None = None,
        *,
        cluster: Cluster = Cluster.BLOCK,
        deadline_s: float | None = None,
    ) -> Reservation:
        return self._run(
            self._client.reserve_worker_slot(task_id, cluster=cluster, deadline_s=deadline_s)
        )

    def explain_placement(
        self, worker_addr: str | None = None, *, cluster: Cluster = Cluster.BLOCK
    ) -> PlacementReport:
        return self._run(self._client.explain_placement(worker_addr, cluster=cluster))

    def request_task_slot(
        self, worker_addr: str, task_id: str | None = None, *, ttl_ms: int = 5000
    ) -> Reservation:
        return self._run(self._client.request_task_slot(worker_addr, task_id, ttl_ms=ttl_ms))

    def submit_task(self, task: Task, *, worker_addr: str, slot_id: str = "") -> SubmitAnswer:
        return self._run(self._client.submit_task(task, worker_addr=worker_addr, slot_id=slot_id))

    def get_task_result(self, task_id: str, *, worker_addr: str) -> TaskResult:
        return self._run(self._client.get_task_result(task_id, worker_addr=worker_addr))

    def watch_tasks(
        self, task_ids: Sequence[str], *, worker_addr: str, progress: bool = False
    ) -> Iterator[TaskUpdate]:
        """Each update as the Worker sends it (with ``progress``, the call-progress
        ones too); the iterator ends once every task is terminal (the stream's end).
        Stopping early closes the stream."""
        return iterate_on(
            self._loop,
            lambda: self._client.watch_tasks(task_ids, worker_addr=worker_addr, progress=progress),
        )

    def cancel(
        self,
        task_id: str,
        *,
        worker_addr: str | None = None,
        workers: Sequence[str] | None = None,
        registry: Registry | None = None,
        worker_timeout_s: float | None = None,
    ) -> Cancellation:
        """As ``Client.cancel``."""
        return self._run(
            self._client.cancel(
                task_id,
                worker_addr=worker_addr,
                workers=workers,
                registry=registry,
                worker_timeout_s=worker_timeout_s,
            )
        )

    def in_flight(self) -> dict[str, str]:
        """As ``Client.in_flight``: the tasks this client's ``run`` calls (from any
        thread) have placed and still wait for, by task_id."""
        return self._client.in_flight()

    def cancel_in_flight(
        self, task_ids: Iterable[str] | None = None, *, timeout_s: float = 5.0
    ) -> list[Cancellation]:
        """As ``Client.cancel_in_flight``; call it from another thread than the one
        a ``run`` blocks."""
        return self._run(self._client.cancel_in_flight(task_ids, timeout_s=timeout_s))

    def call_record(
        self,
        task_id: str,
        call_index: int | None = None,
        *,
        worker_addr: str | None = None,
        workers: Sequence[str] | None = None,
        registry: Registry | None = None,
        worker_timeout_s: float | None = None,
    ) -> CallRecord:
        """As ``Client.call_record``."""
        return self._run(
            self._client.call_record(
                task_id,
                call_index,
                worker_addr=worker_addr,
                workers=workers,
                registry=registry,
                worker_timeout_s=worker_timeout_s,
            )
        )

    def list_tasks(
        self,
        task_filter: TaskFilter | None = None,
        *,
        workers: Sequence[str] | None = None,
        registry: Registry | None = None,
        limit_per_worker: int = DEFAULT_LIMIT_PER_WORKER,
        concurrency: int = DEFAULT_CONCURRENCY,
        worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
    ) -> ClusterTasks:
        return self._run(
            self._client.list_tasks(
                task_filter,
                workers=workers,
                registry=registry,
                limit_per_worker=limit_per_worker,
                concurrency=concurrency,
                worker_timeout_s=worker_timeout_s,
            )
        )

    def describe_worker(
        self, worker_addr: str, *, recent_failures: int = 0, running_tasks: int = 0
    ) -> WorkerDescription:
        """See ``Client.describe_worker``."""
        return self._run(
            self._client.describe_worker(
                worker_addr, recent_failures=recent_failures, running_tasks=running_tasks
            )
        )

    def find_task(
        self,
        task_id: str,
        *,
        workers: Sequence[str] | None = None,
        registry: Registry | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
    ) -> TaskHolders:
        return self._run(
            self._client.find_task(
                task_id,
                workers=workers,
                registry=registry,
                concurrency=concurrency,
                worker_timeout_s=worker_timeout_s,
            )
        )

    def run(
        self,
        task: Task,
        *,
        cluster: Cluster | None = None,
        worker_addr: str | None = None,
        deadline_s: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> TaskResult:
        """As ``Client.run``; ``on_progress`` is called on the client's own thread."""
        return self._run(
            self._client.run(
                task,
                cluster=cluster,
                worker_addr=worker_addr,
                deadline_s=deadline_s,
                on_progress=on_progress,
            )
        )

    submit_and_wait = run

    def run_many(
        self,
        tasks: Iterable[Task],
        *,
        concurrency: int = 32,
        cluster: Cluster | None = None,
        deadline_s: float | None = None,
    ) -> Iterator[TaskResult]:
        """Each task's result as it finishes (not in input order), as
        ``Client.run_many``; the tasks start when iteration does, and stopping early
        stops waiting for the rest. ``list(client.run_many(tasks))`` waits for all."""
        return iterate_on(
            self._loop,
            lambda: self._client.run_many(
                tasks, concurrency=concurrency, cluster=cluster, deadline_s=deadline_s
            ),
        )

    def run_with_retries(
        self,
        task: Task,
        *,
        max_attempts: int = 3,
        cluster: Cluster | None = None,
        worker_addr: str | None = None,
        deadline_s: float | None = None,
    ) -> list[TaskResult]:
        return self._run(
            self._client.run_with_retries(
                task,
                max_attempts=max_attempts,
                cluster=cluster,
                worker_addr=worker_addr,
                deadline_s=deadline_s,
            )
        )

    def function(self, name: str) -> SyncFunctionHandle:
        return SyncFunctionHandle(self, name)


class SyncFunctionHandle:
    """``Client.function(name)``, blocking; for programs only: a BlockX function is
    ``async def`` and awaits ``Client.function(name).call(...)``, a sub-call."""

    def __init__(self, owner: SyncClient, name: str) -> None:
        self._owner = owner
        self._handle = owner._client.function(name)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if in_call():
            coro.close()
            raise RuntimeError(
                f"SyncClient cannot call {self._handle.name!r} from inside a BlockX function: "
                "a plain def cannot wait for a sub-call; make the function async def and "
                f"await Client().function({self._handle.name!r}).call(...)"
            )
        return self._owner._run(coro)

    @overload
    def call(self, *args: Any, timeout_ms: int = 0, chain: str | None = None) -> Any: ...
    @overload
    def call(
        self, *args: Any, timeout_ms: int = 0, chain: str | None = None, result_type: type[T]
    ) -> T: ...
    def call(
        self,
        *args: Any,
        timeout_ms: int = 0,
        chain: str | None = None,
        result_type: type[T] | None = None,
    ) -> T | Any:
        if result_type is None:
            return self._run(self._handle.call(*args, timeout_ms=timeout_ms, chain=chain))
        return self._run(
            self._handle.call(*args, timeout_ms=timeout_ms, chain=chain, result_type=result_type)
        )

    def invoke(self, *args: Any, timeout_ms: int = 0, chain: str | None = None) -> Invocation:
        return self._run(self._handle.invoke(*args, timeout_ms=timeout_ms, chain=chain))

    def debug(self, *args: Any, timeout_ms: int = 0, chain: str | None = None) -> Invocation:
        return self._run(self._handle.debug(*args, timeout_ms=timeout_ms, chain=chain))

    def precheck(self, *args: Any, check_args: bool = True) -> Precheck:
        return self._run(self._handle.precheck(*args, check_args=check_args))
