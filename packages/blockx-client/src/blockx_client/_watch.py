"""Waiting for many tasks with few Watch streams, and telling a lost Worker from a
broken stream.

A stream that ends with tasks still pending, or breaks, is never taken as the
tasks' end: each pending task is re-checked with GetTaskResult. A terminal answer
resolves it; RUNNING means the worker is alive and the stream is reopened; NOT_FOUND
(the worker restarted, or the result expired) is WORKER_LOST. Only when the worker
cannot be asked at all for ``RetryPolicy.worker_unreachable_s`` are its pending
tasks WORKER_LOST too. Every wait ends in a ``TaskResult``.

A wait may come with a progress callback: a stream that watches such a task asks
the Worker for call progress, and the task's progress updates go to its callback
(the other tasks of the stream ignore them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

from blockx_client._options import ClientOptions
from blockx_client._outcomes import worker_lost
from blockx_client._worker_rpc import WorkerRpc
from blockx_client.errors import BlockxError, TaskNotFoundError
from blockx_client.models import ProgressCallback, TaskResult, TaskState, TaskUpdate
from blockx_core.ids import MAX_WATCH_TASK_IDS

log = logging.getLogger(__name__)

_FORGOTTEN = (
    "it no longer knows the task (it restarted, or the result expired after RESULT_RETENTION_MS)"
)


class WatchBatcher:
    """Waits for many tasks on one worker with few Watch streams. While a stream to
    the worker is open, the task_ids that arrive within a short linger share the next
    one; when none is open (a lone task), the stream opens on the next loop iteration,
    so a single task does not wait for the linger (ids arriving in the same iteration
    still share it)."""

    LINGER_S = 0.01

    def __init__(
        self, workers: WorkerRpc, options: ClientOptions, worker_addr: str, rng: random.Random
    ) -> None:
        self._workers = workers
        self._options = options
        self._addr = worker_addr
        self._rng = rng
        self._pending: dict[str, asyncio.Future[TaskResult]] = {}
        self._on_progress: dict[str, ProgressCallback] = {}
        self._batch: set[str] = set()
        self._flusher: asyncio.Task[None] | None = None
        # Each open stream's task and the ids it still waits for.
        self._streams: dict[asyncio.Task[None], set[str]] = {}

    async def wait(self, task_id: str, on_progress: ProgressCallback | None = None) -> TaskResult:
        return await asyncio.shield(self.expect(task_id, on_progress))

    def expect(
        self, task_id: str, on_progress: ProgressCallback | None = None
    ) -> asyncio.Future[TaskResult]:
        """The future of ``task_id``'s result; its stream opens on the next loop
        iteration (or after the linger). Await it shielded: it is shared.
        ``on_progress`` is told the task's call progress while it runs."""
        if on_progress is not None:
            self._on_progress[task_id] = on_progress
        future = self._pending.get(task_id)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._pending[task_id] = future
            self._batch.add(task_id)
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._flush())
        return future

    async def _flush(self) -> None:
        # Linger only beside a stream still waiting for a task: one whose tasks have
        # all ended is closing, and the next lone task must not wait for it.
        if any(self._streams.values()):
            await asyncio.sleep(self.LINGER_S)
        batch, self._batch = sorted(self._batch), set()
        # A Worker takes at most MAX_WATCH_TASK_IDS ids per stream.
        chunks = [
            batch[start : start + MAX_WATCH_TASK_IDS]
            for start in range(0, len(batch), MAX_WATCH_TASK_IDS)
        ]
        for chunk in chunks[:-1]:
            waiting = set(chunk)
            stream = asyncio.create_task(self._watch(waiting))
            self._streams[stream] = waiting
            stream.add_done_callback(self._stream_done)
        if not chunks:
            return
        # This task watches the last chunk itself (one task fewer on a lone task's
        # path); from here on it counts as a stream, and the next id starts a flusher.
        me = asyncio.current_task()
        assert me is not None
        self._flusher = None
        waiting = set(chunks[-1])
        self._streams[me] = waiting
        try:
            await self._watch(waiting)
        finally:
            self._stream_done(me)

    def _stream_done(self, stream: asyncio.Task[None]) -> None:
        self._streams.pop(stream, None)

    def forget(self, task_id: str) -> None:
        """Stop waiting for ``task_id`` here (its submission went elsewhere, or never
        happened); a stream left with nothing to wait for is closed."""
        future = self._pending.pop(task_id, None)
        if future is not None:
            future.cancel()
        self._on_progress.pop(task_id, None)
        self._batch.discard(task_id)
        for stream, waiting in list(self._streams.items()):
            if task_id in waiting:
                waiting.discard(task_id)
                if not waiting:
                    stream.cancel()

    async def _watch(self, waiting: set[str]) -> None:
        try:
            await self._watch_until_done(waiting)
        except Exception as exc:
            # A bug, not an outcome: the waiters raise it rather than hang. It is not
            # raised again here, where nobody awaits this task: asyncio would print
            # its traceback ("Task exception was never retrieved") to a CLI's user.
            log.debug("watching %s on %s failed", sorted(waiting), self._addr, exc_info=True)
            for task_id in waiting:
                future = self._pending.pop(task_id, None)
                if future is not None and not future.done():
                    future.set_exception(exc)

    async def _watch_until_done(self, waiting: set[str]) -> None:
        broken = 0  # streams in a row that broke while the worker still answered
        asked_in_vain = 0
        unreachable_since: float | None = None
        while waiting:
            stream_broke = await self._stream(waiting)
            if not waiting:
                return
            retry = self._options.retry
            try:
                await self._recheck(waiting)
            except BlockxError as exc:
                # The worker cannot be asked (gone, restarting, not ready yet).
                now = time.monotonic()
                if unreachable_since is None:
                    unreachable_since = now
                if now - unreachable_since >= retry.worker_unreachable_s:
                    why = f"unreachable for {now - unreachable_since:.1f} s ({exc.message})"
                    for task_id in sorted(waiting):
                        self._resolve(task_id, worker_lost(task_id, self._addr, why))
                    return
                asked_in_vain += 1
                await asyncio.sleep(retry.worker_recheck.delay(asked_in_vain, self._rng.random()))
                continue
            unreachable_since, asked_in_vain = None, 0
            if stream_broke and waiting:
                # A live worker whose stream broke: reopen it, without spinning.
                broken += 1
                await asyncio.sleep(retry.worker_recheck.delay(broken, self._rng.random()))
            else:
                broken = 0

    async def _stream(self, waiting: set[str]) -> bool:
        """Watch ``waiting`` until the stream ends, resolving every task it reports
        terminal; whether the stream broke. A task the worker does not know (the
        NOT_FOUND snapshot) stays in ``waiting`` for the re-check."""
        progress = any(task_id in self._on_progress for task_id in waiting)
        try:
            async for update in self._workers.watch_tasks(
                sorted(waiting), worker_addr=self._addr, progress=progress
            ):
                self._progressed(update)  # the terminal update carries the last counts
                if not update.is_terminal or update.task_id not in waiting:
                    continue
                if update.state is TaskState.NOT_FOUND or update.result is None:
                    continue
                waiting.discard(update.task_id)
                self._resolve(update.task_id, update.result)
        except BlockxError:
            return True
        return False

    async def _recheck(self, waiting: set[str]) -> None:
        """GetTaskResult for each pending task: terminal resolves it, NOT_FOUND makes
        it WORKER_LOST, RUNNING keeps it pending. Raises when the worker cannot be
        asked."""
        for task_id in sorted(waiting):
            try:
                result = await self._workers.get_task_result(task_id, worker_addr=self._addr)
            except TaskNotFoundError:
                result = worker_lost(task_id, self._addr, _FORGOTTEN)
            if result.state is TaskState.NOT_FOUND:
                result = worker_lost(task_id, self._addr, _FORGOTTEN)
            if result.state.is_terminal:
                waiting.discard(task_id)
                self._resolve(task_id, result)

    def _progressed(self, update: TaskUpdate) -> None:
        callback = self._on_progress.get(update.task_id)
        if callback is None or update.progress is None:
            return
        try:
            callback(update.progress)
        except Exception:
            # A display's bug must not cost the task's result.
            log.exception("the progress callback of task %s raised", update.task_id)

    def _resolve(self, task_id: str, result: TaskResult) -> None:
        self._on_progress.pop(task_id, None)
        future = self._pending.pop(task_id, None)
        if future is not None and not future.done():
            future.set_result(result)

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
        self._on_progress.clear()


class Watchers:
    """One WatchBatcher per worker address, made on first use."""

    def __init__(self, workers: WorkerRpc, options: ClientOptions, rng: random.Random) -> None:
        self._workers = workers
        self._options = options
        self._rng = rng
        self._by_addr: dict[str, WatchBatcher] = {}

    async def wait(
        self, task_id: str, *, worker_addr: str, on_progress: ProgressCallback | None = None
    ) -> TaskResult:
        return await self._batcher(worker_addr).wait(task_id, on_progress)

    def expect(
        self, task_id: str, *, worker_addr: str, on_progress: ProgressCallback | None = None
    ) -> asyncio.Future[TaskResult]:
        return self._batcher(worker_addr).expect(task_id, on_progress)

    def forget(self, task_id: str, *, worker_addr: str) -> None:
        batcher = self._by_addr.get(worker_addr)
        if batcher is not None:
            batcher.forget(task_id)

    def _batcher(self, worker_addr: str) -> WatchBatcher:
        batcher = self._by_addr.get(worker_addr)
        if batcher is None:
            batcher = WatchBatcher(self._workers, self._options, worker_addr, self._rng)
            self._by_addr[worker_addr] = batcher
        return batcher

    async def close(self) -> None:
        for batcher in self._by_addr.values():
            await batcher.close()
        self._by_addr.clear()
