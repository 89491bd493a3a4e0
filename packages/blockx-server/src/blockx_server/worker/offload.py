"""CPU-bound work on a task's input, run off the Worker's event loop.

Checking a SubmitTask's JSON, parsing a Builder's or a Writer's config and
building a listed config's calls take time in proportion to the config. On the
event loop a large one would stall every RPC, grpc.health.v1 Check included, for
as long as it takes. ``Offload`` runs such work on a thread of its own small pool
when its input is large, and inline when it is small (a thread hop costs more
than parsing a few kilobytes). The pool is the Worker's alone, so parses queued
behind one another never hold the threads the loop's default executor lends
to others (name resolution, the function store's reads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Inputs at least this long (characters of JSON) are worked on a thread.
OFFLOAD_FROM_CHARS: Final = 64 * 1024
# Parsing holds the interpreter for most of its time, so more threads would only
# queue for it; two keep one long parse from delaying every other.
OFFLOAD_THREADS: Final = 2


class Offload:
    def __init__(
        self,
        *,
        threads: int = OFFLOAD_THREADS,
        from_chars: int = OFFLOAD_FROM_CHARS,
        on_offloaded: Callable[[str], None] | None = None,
    ) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="blockx-parse")
        self._from_chars = from_chars
        # Told the kind of each piece of work run on a thread (metrics).
        self._on_offloaded = on_offloaded

    async def run(
        self, what: str, size: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(*args, **kwargs)``: on a pool thread when ``size`` (the input's length)
        is at least ``from_chars``, else at once on the caller's thread."""
        if size < self._from_chars:
            return fn(*args, **kwargs)
        if self._on_offloaded is not None:
            self._on_offloaded(what)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        """Stop taking work; a parse under way finishes on its thread. (The Worker
        never closes its own: a draining Worker still answers, and its idle threads
        end with the process.)"""
        self._pool.shutdown(wait=False, cancel_futures=True)
