"""An async iterator on a background event loop, read as a plain iterator.

``SyncClient`` keeps its ``Client`` on a private loop in another thread. One task
on that loop (the pump) owns the async iterator from start to end, so a gRPC
stream or a ``run_many`` is opened, read and closed in one task, as async code
would; each item crosses to the caller's thread through a queue as soon as it
arrives. A caller that stops early (``break``, an exception, closing the
iterator) cancels the pump, which closes the async iterator on the loop.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class _Item(Generic[T]):
    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value


class _End:
    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


def iterate_on(
    loop: asyncio.AbstractEventLoop, make: Callable[[], AsyncIterator[T]]
) -> Iterator[T]:
    """Yield what ``make()`` yields, as it yields it; ``make`` runs on ``loop`` (in
    the pump), and an error it raises is raised here, in the caller's thread."""
    arrived: queue.SimpleQueue[_Item[T] | _End] = queue.SimpleQueue()

    async def pump() -> None:
        try:
            async for value in make():
                arrived.put(_Item(value))
        except Exception as exc:
            arrived.put(_End(exc))
        else:
            arrived.put(_End(None))

    async def start() -> asyncio.Task[None]:
        return asyncio.create_task(pump())

    async def stop(pumping: asyncio.Task[None]) -> None:
        pumping.cancel()
        await asyncio.wait({pumping})

    pumping = asyncio.run_coroutine_threadsafe(start(), loop).result()
    try:
        while True:
            got = arrived.get()
            if isinstance(got, _End):
                if got.error is not None:
                    raise got.error
                return
            yield got.value
    finally:
        if not pumping.done() and loop.is_running():
            # Stopped early: the pump closes the async iterator on the loop.
            asyncio.run_coroutine_threadsafe(stop(pumping), loop).result()
