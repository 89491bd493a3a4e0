"""Many tasks at bounded concurrency, an outcome for every one, in the order they
finish."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

from blockx_client.models import Task, TaskResult


async def run_many(
    run: Callable[[Task], Awaitable[TaskResult]],
    tasks: Iterable[Task],
    concurrency: int,
    outcome_of_error: Callable[[Task, Exception], TaskResult],
) -> AsyncIterator[TaskResult]:
    """``run`` each task, at most ``concurrency`` unfinished at a time, and yield one
    result per task: a task whose ``run`` raised yields ``outcome_of_error(task,
    exc)`` and the others go on. ``tasks`` is read lazily; closing the iterator
    early stops waiting for the tasks still running (on their workers they run on)."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    gate = asyncio.Semaphore(concurrency)
    results: asyncio.Queue[TaskResult] = asyncio.Queue()

    async def one(task: Task) -> None:
        try:
            results.put_nowait(await run(task))
        except Exception as exc:
            results.put_nowait(outcome_of_error(task, exc))
        finally:
            gate.release()

    async def feed() -> int:
        count = 0
        for task in tasks:
            await gate.acquire()
            job = asyncio.create_task(one(task))
            running.add(job)
            job.add_done_callback(running.discard)
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
            received += 1
            yield getter.result()
    finally:
        feeder.cancel()
        for task in running:
            task.cancel()
