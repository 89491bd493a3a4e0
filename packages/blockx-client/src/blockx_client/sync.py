"""A synchronous facade over Client, for scripts and notebooks.

It runs the async client on a private event loop in a background thread, so it
works whether or not the caller already has a running loop (Jupyter does).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from blockx_client.client import Client
from blockx_client.cluster_tasks import (
    DEFAULT_CONCURRENCY,
    DEFAULT_LIMIT_PER_WORKER,
    DEFAULT_WORKER_TIMEOUT_S,
    Registry,
    TaskFilter,
)
from blockx_client.models import (
    Cluster,
    ClusterTasks,
    Invocation,
    Precheck,
    Reservation,
    SubmitAnswer,
    Task,
    TaskHolders,
    TaskResult,
    TaskUpdate,
)

T = TypeVar("T")


class SyncClient:
    """The same operations as Client, blocking. Use ``with SyncClient() as client:``."""

    def __init__(self, **client_options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="blockx-client", daemon=True
        )
        self._thread.start()
        self._client: Client = self._run(self._make(client_options))

    @staticmethod
    async def _make(options: dict[str, Any]) -> Client:
        return Client(**options)

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

    def reserve_worker_slot(self, task_id: str | None = None, **kwargs: Any) -> Reservation:
        return self._run(self._client.reserve_worker_slot(task_id, **kwargs))

    def request_task_slot(
        self, worker_addr: str, task_id: str | None = None, **kwargs: Any
    ) -> Reservation:
        return self._run(self._client.request_task_slot(worker_addr, task_id, **kwargs))

    def submit_task(self, task: Task, *, worker_addr: str, slot_id: str = "") -> SubmitAnswer:
        return self._run(self._client.submit_task(task, worker_addr=worker_addr, slot_id=slot_id))

    def get_task_result(self, task_id: str, *, worker_addr: str) -> TaskResult:
        return self._run(self._client.get_task_result(task_id, worker_addr=worker_addr))

    def watch_tasks(self, task_ids: Sequence[str], *, worker_addr: str) -> Iterator[TaskUpdate]:
        async def collect() -> list[TaskUpdate]:
            return [u async for u in self._client.watch_tasks(task_ids, worker_addr=worker_addr)]

        # A Watch stream ends once every task is terminal.
        yield from self._run(collect())

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

    def run(self, task: Task, *, cluster: Cluster | None = None, **kwargs: Any) -> TaskResult:
        return self._run(self._client.run(task, cluster=cluster, **kwargs))

    submit_and_wait = run

    def run_many(self, tasks: Iterable[Task], **kwargs: Any) -> list[TaskResult]:
        async def collect() -> list[TaskResult]:
            return [r async for r in self._client.run_many(tasks, **kwargs)]

        return self._run(collect())

    def run_with_retries(self, task: Task, **kwargs: Any) -> list[TaskResult]:
        return self._run(self._client.run_with_retries(task, **kwargs))

    def function(self, name: str) -> SyncFunctionHandle:
        return SyncFunctionHandle(self, name)


class SyncFunctionHandle:
    def __init__(self, owner: SyncClient, name: str) -> None:
        self._owner = owner
        self._handle = owner._client.function(name)

    def call(self, *args: Any, timeout_ms: int = 0) -> Any:
        return self._owner._run(self._handle.call(*args, timeout_ms=timeout_ms))

    def invoke(self, *args: Any, timeout_ms: int = 0) -> Invocation:
        return self._owner._run(self._handle.invoke(*args, timeout_ms=timeout_ms))

    def debug(self, *args: Any, timeout_ms: int = 0) -> Invocation:
        return self._owner._run(self._handle.debug(*args, timeout_ms=timeout_ms))

    def precheck(self, *args: Any, check_args: bool = True) -> Precheck:
        return self._owner._run(self._handle.precheck(*args, check_args=check_args))
