"""Waiting for many tasks with few Watch streams."""

from __future__ import annotations

import asyncio
import contextlib

from blockx_client._worker_rpc import WorkerRpc
from blockx_client.errors import BlockxError, TaskNotFoundError
from blockx_client.models import TaskResult


class WatchBatcher:
    """Waits for many tasks on one worker with few Watch streams: the task_ids that
    arrive within a short linger share one stream; a broken stream is reopened for
    the tasks still pending, and a task the worker no longer knows is looked up."""

    LINGER_S = 0.01
    # A stream that breaks this many times in a row fails its tasks.
    MAX_FAILURES = 5

    def __init__(self, workers: WorkerRpc, worker_addr: str) -> None:
        self._workers = workers
        self._addr = worker_addr
        self._pending: dict[str, asyncio.Future[TaskResult]] = {}
        self._batch: set[str] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._streams: set[asyncio.Task[None]] = set()

    async def wait(self, task_id: str) -> TaskResult:
        future = self._pending.get(task_id)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._pending[task_id] = future
            self._batch.add(task_id)
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        await asyncio.sleep(self.LINGER_S)
        batch, self._batch = self._batch, set()
        stream = asyncio.create_task(self._watch(sorted(batch)))
        self._streams.add(stream)
        stream.add_done_callback(self._streams.discard)

    async def _watch(self, task_ids: list[str]) -> None:
        waiting = set(task_ids)
        failures = 0
        while waiting:
            try:
                async for update in self._workers.watch_tasks(
                    sorted(waiting), worker_addr=self._addr
                ):
                    if update.is_terminal and update.task_id in waiting:
                        waiting.discard(update.task_id)
                        assert update.result is not None
                        self._resolve(update.task_id, update.result)
                if waiting:
                    # The stream ended early (the worker drained?): ask directly.
                    await self._lookup(waiting)
            except BlockxError as exc:
                failures += 1
                if failures > self.MAX_FAILURES:
                    for task_id in list(waiting):
                        self._fail(task_id, exc)
                    return
                await asyncio.sleep(min(2.0, 0.1 * 2**failures))

    async def _lookup(self, waiting: set[str]) -> None:
        for task_id in list(waiting):
            try:
                result = await self._workers.get_task_result(task_id, worker_addr=self._addr)
            except TaskNotFoundError as exc:
                waiting.discard(task_id)
                self._fail(task_id, exc)
                continue
            if result.state.is_terminal:
                waiting.discard(task_id)
                self._resolve(task_id, result)

    def _resolve(self, task_id: str, result: TaskResult) -> None:
        future = self._pending.pop(task_id, None)
        if future is not None and not future.done():
            future.set_result(result)

    def _fail(self, task_id: str, exc: BaseException) -> None:
        future = self._pending.pop(task_id, None)
        if future is not None and not future.done():
            future.set_exception(exc)

    async def close(self) -> None:
        tasks = [*self._streams, *([self._flusher] if self._flusher else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()


class Watchers:
    """One WatchBatcher per worker address, made on first use."""

    def __init__(self, workers: WorkerRpc) -> None:
        self._workers = workers
        self._by_addr: dict[str, WatchBatcher] = {}

    async def wait(self, task_id: str, *, worker_addr: str) -> TaskResult:
        batcher = self._by_addr.get(worker_addr)
        if batcher is None:
            batcher = self._by_addr[worker_addr] = WatchBatcher(self._workers, worker_addr)
        return await batcher.wait(task_id)

    async def close(self) -> None:
        for batcher in self._by_addr.values():
            await batcher.close()
        self._by_addr.clear()
