"""One Calls phase as its producer and the engine see it.

``CallRun`` is the producer's handle: ``add`` root calls as they come, ``done``
when there are no more, ``await result()`` for the convergence; a producer that
reads its roots as it goes (a streaming Builder) awaits ``wait_room()`` between
chunks, so it never runs ahead of the dispatcher by more than a call window.
``RunState`` is what the engine keeps per open run; ``CallObserver`` sees the
individual calls (the Sync Invoker's durations and debug trace).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from blockx_core.calls import RootCall, RootOutputs
from blockx_core.code_view import CodeSnapshot
from blockx_core.dispatch import (
    CallUsage,
    ConvergeTaskCalls,
)
from blockx_executor import protocol as wire
from blockx_server.calls.recording import RunRecords
from blockx_server.io.errors import IoOutcome
from blockx_server.io.scope import TaskIoScope


class CallObserver(Protocol):
    """Sees the individual calls of one run (the Sync Invoker's durations and debug trace)."""

    def call_finished(self, call_id: int, cpu_us: int, io_us: int) -> None: ...
    def calls_measured(self, usage: CallUsage) -> None:
        """The run's calls converged; ``usage`` is what the Worker measured of them."""

    def call_output(self, call_id: int, text: str) -> None: ...
    def io_traced(
        self,
        call_id: int,
        request: wire.IoRequested,
        outcome: IoOutcome,
    ) -> None: ...


class RunState:
    """What the engine keeps for one open run."""

    __slots__ = (
        "debug",
        "done_from",
        "future",
        "io",
        "observer",
        "records",
        "room",
        "snapshot",
        "usage",
    )

    def __init__(
        self,
        future: asyncio.Future[ConvergeTaskCalls],
        snapshot: CodeSnapshot,
        io: TaskIoScope,
        observer: CallObserver | None,
        debug: bool,
        records: RunRecords | None = None,
    ) -> None:
        self.future = future
        self.snapshot = snapshot
        self.io = io
        self.observer = observer
        self.debug = debug
        # The call records of the run's root calls (None: not recorded).
        self.records = records
        # Set while the producer waits in wait_room(); resolved by the engine.
        self.room: asyncio.Future[None] | None = None
        # While the producer waits for progress (``wait_progress``): the root calls
        # done when it started waiting.
        self.done_from: int | None = None
        # The dispatcher's measure of the run's calls, filled in until it converges.
        self.usage = CallUsage()


class RunOwner(Protocol):
    """The CallEngine side of a CallRun."""

    def add_roots(self, task_id: str, roots: Sequence[RootCall | list[Any]]) -> None: ...
    def roots_done(self, task_id: str) -> None: ...
    def take_outputs(self, task_id: str) -> RootOutputs: ...
    async def wait_room(self, task_id: str, run: RunState, *, progress: bool = False) -> None: ...
    def has_room(self, task_id: str, run: RunState) -> bool: ...
    def close_run(self, task_id: str, run: RunState) -> None: ...


class CallRun:
    """One task's Calls phase as a producer sees it: ``add`` root calls as they come
    (each gets the next root index), ``done`` when there are no more, and ``await
    result()`` for the convergence. Adding to a run that has already failed
    (fastFail, output cap) does nothing."""

    def __init__(self, engine: RunOwner, task_id: str, run: RunState) -> None:
        self.task_id = task_id
        self._engine = engine
        self._run = run
        self._done = False

    def add(self, roots: Sequence[RootCall | list[Any]]) -> None:
        if self._done:
            raise RuntimeError(f"task {self.task_id!r}: root calls added after done()")
        if not roots or self._run.future.done():
            return
        self._engine.add_roots(self.task_id, roots)

    def done(self) -> None:
        if self._done:
            return
        self._done = True
        self._engine.roots_done(self.task_id)

    def take_outputs(self) -> RootOutputs:
        """The outputs of the root calls done in a row since the last take, in root
        order; the run forgets them (``result()`` converges with the rest only)."""
        return self._engine.take_outputs(self.task_id)

    @property
    def records(self) -> RunRecords | None:
        """The run's call records (``open_calls(record_bytes=...)``), None when off."""
        return self._run.records

    @property
    def ended(self) -> bool:
        """The run has converged already (fastFail, output cap, missing function):
        more roots would be ignored."""
        return self._run.future.done()

    async def wait_room(self) -> None:
        """Until the roots added but not finished are no more than the task's call
        window (so every added root has been dispatched), or the run has ended.
        Bounds what a streaming producer holds: one window in flight plus the chunk
        it is reading."""
        if not self._done:
            await self._engine.wait_room(self.task_id, self._run)

    @property
    def has_room(self) -> bool:
        """What ``wait_room`` waits for holds: ``wait_room`` would return at once."""
        return self._done or self._engine.has_room(self.task_id, self._run)

    async def wait_progress(self) -> None:
        """Until some root call finishes, or ``wait_room`` would return. For a
        producer that consumes outputs as they come (``take_outputs``)."""
        if not self._done:
            await self._engine.wait_room(self.task_id, self._run, progress=True)

    def close(self) -> None:
        """Give the run up: its calls are cancelled and it never converges. For a
        producer that failed; ``result()`` does the same when it returns."""
        self._engine.close_run(self.task_id, self._run)

    async def result(self) -> ConvergeTaskCalls:
        try:
            return await self._run.future
        finally:
            self._engine.close_run(self.task_id, self._run)


def observe(message: wire.FromExecutor, observer_of: Callable[[int], CallObserver | None]) -> None:
    """Tell the observers of the message's calls, before the dispatcher forgets them."""
    match message:
        case wire.CallsCompleted():
            for call_id, cpu_us, io_us in zip(
                message.call_ids, message.cpu_us, message.io_us, strict=True
            ):
                observer = observer_of(call_id)
                if observer is not None:
                    observer.call_finished(call_id, cpu_us, io_us)
        case wire.CallFailed():
            observer = observer_of(message.call_id)
            if observer is not None:
                observer.call_finished(message.call_id, message.cpu_us, message.io_us)
        case wire.CallOutput():
            observer = observer_of(message.call_id)
            if observer is not None:
                text = message.text
                if message.dropped:
                    text += f"\n[... {message.dropped} more bytes of output dropped]\n"
                observer.call_output(message.call_id, text)
        case _:
            pass  # the other frames carry nothing an observer sees
