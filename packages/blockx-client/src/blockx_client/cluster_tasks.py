"""Cluster-wide task lookup: ListTasks and GetTaskResult fanned out to many Workers.

Every Worker holds its own tasks and nothing else does, so "every task of the
cluster" is the union of what each registered Worker answers. The Workers are
asked at most ``concurrency`` at a time, each within ``timeout_s`` (all its pages
together); one that does not answer is reported in ``unreachable`` and the others
still count. A refused request (INVALID_ARGUMENT) is the caller's and is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, TypeVar

import msgspec

from blockx_client._worker_rpc import WorkerRpc
from blockx_client.dev_config import LayeredEnviron
from blockx_client.errors import BlockxError, ConnectError, InvalidRequestError, TaskNotFoundError
from blockx_client.models import (
    ClusterTasks,
    ListedTask,
    TaskHolders,
    TaskResult,
    TaskState,
    UnreachableWorker,
)
from blockx_client.registry import EtcdAccess, RegisteredWorker, list_workers
from blockx_client.setting import Setting, with_origin
from blockx_core.registry import DEFAULT_REGISTRY_PREFIXES

DEFAULT_ETCD: Final = "127.0.0.1:2379"
# The registry prefixes of the block and bundle clusters' Workers.
DEFAULT_CONCURRENCY: Final = 16
DEFAULT_WORKER_TIMEOUT_S: Final = 5.0
# The most tasks taken from one Worker (its oldest first); the page size asked for.
DEFAULT_LIMIT_PER_WORKER: Final = 10_000
_PAGE_SIZE: Final = 10_000

T = TypeVar("T")


class Registry(msgspec.Struct, frozen=True, kw_only=True):
    """Where the registered Workers are read from: etcd ``endpoints`` (the first that
    answers), the registry ``prefixes``, and etcd's TLS and credentials (``access``,
    default ``EtcdAccess.from_environ()``). ``setting``, where the endpoints came
    from, is named when etcd cannot be read."""

    endpoints: tuple[str, ...] = (DEFAULT_ETCD,)
    prefixes: tuple[str, ...] = DEFAULT_REGISTRY_PREFIXES
    access: EtcdAccess | None = None
    setting: Setting | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Registry:
        """``ETCD_ENDPOINTS`` (comma-separated), else the running ``blockx dev up``'s
        etcd (when ``environ`` is not given), else 127.0.0.1:2379; and the
        ``ETCD_*`` TLS and credential variables."""
        env = LayeredEnviron() if environ is None else LayeredEnviron(environ, {})
        setting = env.setting("ETCD_ENDPOINTS", default=DEFAULT_ETCD)
        endpoints = [e.strip() for e in (setting.value or "").split(",") if e.strip()]
        return cls(
            endpoints=tuple(endpoints) or (DEFAULT_ETCD,),
            access=EtcdAccess.from_environ(env),
            setting=setting,
        )

    async def workers(self) -> list[RegisteredWorker]:
        """Every registered Worker's heartbeat (ConnectError, naming where the
        endpoints came from, when etcd cannot be read)."""
        try:
            return await list_workers(list(self.endpoints), list(self.prefixes), access=self.access)
        except ConnectError as exc:
            raise ConnectError(
                with_origin(exc.message, self.setting),
                may_have_reached=False,
                setting=self.setting,
            ) from None

    async def worker_addrs(self) -> list[str]:
        """Every registered Worker's address (ConnectError when etcd cannot be read)."""
        return list(dict.fromkeys(w.heartbeat.worker_addr for w in await self.workers()))


class TaskFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Empty ``states`` and ``function`` match every task; an age of 0 is no bound.
    ``min_age_ms``: first seen at least that long ago; ``max_age_ms``: at most.
    ``include_expired``: also the failed tasks whose results have expired, which each
    Worker remembers (its last FAILED_TASKS_KEPT), marked ``expired``."""

    states: tuple[TaskState, ...] = ()
    function: str = ""
    min_age_ms: int = 0
    max_age_ms: int = 0
    include_expired: bool = False


async def list_cluster_tasks(
    rpc: WorkerRpc,
    workers: Sequence[str],
    task_filter: TaskFilter,
    *,
    limit_per_worker: int = DEFAULT_LIMIT_PER_WORKER,
    concurrency: int = DEFAULT_CONCURRENCY,
    timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
) -> ClusterTasks:
    if limit_per_worker < 1:
        raise InvalidRequestError(f"limit_per_worker must be >= 1 (got {limit_per_worker})")
    if TaskState.NOT_FOUND in task_filter.states:
        raise InvalidRequestError(
            "NOT_FOUND is what a client reads for a task no Worker holds: it cannot be listed"
        )

    async def one(addr: str) -> tuple[list[ListedTask], bool]:
        tasks: list[ListedTask] = []
        token = ""
        while True:
            page, token = await rpc.list_tasks(
                addr,
                states=task_filter.states,
                function=task_filter.function,
                min_age_ms=task_filter.min_age_ms,
                max_age_ms=task_filter.max_age_ms,
                page_size=min(_PAGE_SIZE, limit_per_worker - len(tasks)),
                page_token=token,
                include_expired=task_filter.include_expired,
            )
            tasks += page
            if not token:
                return tasks, False
            if len(tasks) >= limit_per_worker:
                return tasks, True

    answers, unreachable = await _fan_out(workers, one, concurrency, timeout_s)
    listed = [t for tasks, _ in answers.values() for t in tasks]
    listed.sort(key=lambda t: (t.created_ms, t.worker_addr, t.task_id))
    return ClusterTasks(
        tasks=tuple(listed),
        workers=tuple(workers),
        unreachable=unreachable,
        truncated=tuple(addr for addr, (_, cut) in answers.items() if cut),
    )


async def find_task(
    rpc: WorkerRpc,
    workers: Sequence[str],
    task_id: str,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
) -> TaskHolders:
    """Ask every Worker for ``task_id`` (GetTaskResult); the ones that know it answer."""

    async def one(addr: str) -> TaskResult | None:
        try:
            return await rpc.get_task_result(task_id, worker_addr=addr)
        except TaskNotFoundError:
            return None

    answers, unreachable = await _fan_out(workers, one, concurrency, timeout_s)
    return TaskHolders(
        task_id=task_id,
        results=tuple(r for r in answers.values() if r is not None),
        workers=tuple(workers),
        unreachable=unreachable,
    )


async def _fan_out(
    workers: Sequence[str],
    ask: Callable[[str], Awaitable[T]],
    concurrency: int,
    timeout_s: float,
) -> tuple[dict[str, T], tuple[UnreachableWorker, ...]]:
    """``ask`` every worker, ``concurrency`` at a time, each within ``timeout_s``;
    the answers by worker (in ``workers`` order) and the ones that gave none."""
    if concurrency < 1:
        raise InvalidRequestError(f"concurrency must be >= 1 (got {concurrency})")
    if timeout_s <= 0:
        raise InvalidRequestError(f"the per-worker timeout must be > 0 s (got {timeout_s})")
    gate = asyncio.Semaphore(concurrency)
    answers: dict[str, T] = {}
    failed: dict[str, str] = {}

    async def guarded(addr: str) -> None:
        async with gate:
            try:
                async with asyncio.timeout(timeout_s):
                    answers[addr] = await ask(addr)
            except TimeoutError:
                failed[addr] = f"no answer within {timeout_s:g} s"
            except InvalidRequestError:
                raise  # the request is wrong: every worker would say so
            except BlockxError as exc:
                failed[addr] = exc.message

    try:
        async with asyncio.TaskGroup() as group:
            for addr in dict.fromkeys(workers):
                group.create_task(guarded(addr))
    except* InvalidRequestError as refused:
        raise refused.exceptions[0] from None
    ordered = {addr: answers[addr] for addr in dict.fromkeys(workers) if addr in answers}
    unreachable = tuple(
        UnreachableWorker(worker_addr=addr, error=failed[addr])
        for addr in dict.fromkeys(workers)
        if addr in failed
    )
    return ordered, unreachable
