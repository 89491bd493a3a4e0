"""Streaming Call Builders: the scan runs inside the Calls phase, feeding calls to
the dispatcher as it reads.

With stream build on (STREAM_BUILD_ENABLED), the Builder phase of a
``StreamingCallBuilder`` is only ``prepare_stream``: it checks the config and
what can be checked without reading the range, and returns a ``CallStream``. The
Calls phase opens the task's CallRun and ``feed_calls`` reads the stream one chunk
at a time, adding each chunk's root calls as it comes, while the Worker's scanSem
(SCAN_SLOTS) bounds how many scans run at once.

Memory: before adding a chunk the feeder waits until the dispatcher has room (the
roots added and not finished fit the task's call window, ``CallRun.wait_room``);
the next chunk is read while the calls of the last one run. A scan holds one call
window and one chunk (at most BLOCKDB_MAX_ROWS rows), however long the range; with
BlockBundleWriteResultHandler the outputs go too, bundle by bundle, as the feeder
waits (``worker/phase_work.py``'s CommittingSink).

Failure: a chunk that cannot be read raises PluginError after the calls of the
chunks before it may have run; the task then fails BUILDER_FAILED, retryable as the
IO error is, and its remaining calls are cancelled. A scan that would add more
than TASK_MAX_CALLS root calls fails the same way (not retryable) before it adds
the chunk that crosses the limit.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any, Protocol, runtime_checkable

import msgspec

from blockx_core.calls import RootCall
from blockx_server.pipeline.builders.base import CallBuilder
from blockx_server.pipeline.builders.listed import check_call_count
from blockx_server.pipeline.context import TaskContext

DEFAULT_SCAN_SLOTS = 8


class StreamBuildConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Whether streaming Builders stream (off: they build the whole list first, as
    any Builder), and how many scans may run at once on the Worker (scanSem)."""

    enabled: bool = False
    scan_slots: int = DEFAULT_SCAN_SLOTS


class CallStream(Protocol):
    """A prepared scan: root calls of ``function``, read chunk by chunk."""

    @property
    def function(self) -> str: ...

    def chunks(self) -> AsyncGenerator[Sequence[RootCall]]:
        """Each chunk's root calls, in root order; raises PluginError on a failed read."""
        ...


@runtime_checkable
class StreamingCallBuilder(CallBuilder, Protocol):
    """A Call Builder that can also stream: ``build`` gives the whole list (stream
    build off), ``prepare_stream`` a stream read during the Calls phase."""

    async def prepare_stream(self, ctx: TaskContext, config: Any) -> CallStream: ...


class RootSink(Protocol):
    """What ``feed_calls`` needs of a CallRun."""

    @property
    def ended(self) -> bool: ...

    async def wait_room(self) -> None: ...

    def add(self, roots: Sequence[RootCall]) -> None: ...

    def done(self) -> None: ...

    def close(self) -> None: ...


async def feed_calls(stream: CallStream, run: RootSink, max_calls: int | None = None) -> int:
    """Add every chunk of ``stream`` to ``run`` as it is read, each once the run has
    room, then say ``done``; return the number of root calls added. Stops reading
    when the run has ended (a call failed: the task fails anyway). A failed read
    (PluginError), a chunk that would take the task past ``max_calls`` root calls
    (PluginError naming TASK_MAX_CALLS) or a cancellation closes the run,
    cancelling its calls."""
    added = 0
    try:
        async with aclosing(stream.chunks()) as chunks:
            async for roots in chunks:
                if max_calls is not None:
                    check_call_count("a streamed scan", added + len(roots), max_calls)
                await run.wait_room()
                if run.ended:
                    return added
                run.add(roots)
                added += len(roots)
    except BaseException:
        run.close()
        raise
    run.done()
    return added
