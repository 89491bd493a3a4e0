"""Many tasks at bounded concurrency, results in the order they finish."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

from blockx_client.models import Task, TaskResult


async def run_many(
    run: Callable[[Task], Awaitable[TaskResult]], tasks: Iterable[Task], concurrency: int
) -> AsyncIterator[TaskResult]:
    """``run`` each task, at most ``concurrency`` unfinished at a time; the first
    exception ends the iteration and cancels the rest. ``tasks`` is read lazily."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    gate = asyncio.Semaphore(concurrency)
    results: asyncio.Queue[TaskResult | BaseException] = asyncio.Queue()

    async def one(task: Task) -> None:
        try:
            results.put_nowait(await run(task))
        except Exception as exc:
            results.put_nowait(exc)
        finally:
            gate.release()

    async def feed() -> int:
        count = 0
        for task in tasks:
            await gate.acquire()
            running.add(asyncio.create_task(one(task)))
            count += 1
        return count

    running: set[asyncio.Task[None]] = set()
    feeder = asyncio.create_task(feed())
    received = 0
    try:
        while not feeder.done() or received < feeder.result():
            getter = asyncio.ensure_future(results.get())
            done, _ = await asyncio.wait({getter, feeder}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                continue
            item = getter.result()
            received += 1
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        feeder.cancel()
        for task in running:
            task.cancel()
