"""One Calls phase as its producer and the engine see it.

``CallRun`` is the producer's handle: ``add`` root calls as they come, ``done``
when there are no more, ``await result()`` for the convergence. ``RunState`` is
what the engine keeps per open run; ``CallObserver`` sees the individual calls
(the Sync Invoker's durations and debug trace).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from blockx_core.calls import RootCall
from blockx_core.code_view import CodeSnapshot
from blockx_core.dispatch import CallFailure, CallFailureKind, ConvergeTaskCalls
from blockx_core.errors import FailureCode
from blockx_executor import protocol as wire
from blockx_server.io.errors import IoOutcome
from blockx_server.io.scope import TaskIoScope


class CallObserver(Protocol):
    """Sees the individual calls of one run (the Sync Invoker's durations and debug trace)."""

    def call_finished(self, call_id: int, cpu_us: int, io_us: int) -> None: ...
    def call_output(self, call_id: int, text: str) -> None: ...
    def io_traced(
        self,
        call_id: int,
        request: wire.IoRequested,
        outcome: IoOutcome,
    ) -> None: ...


class RunState:
    """What the engine keeps for one open run."""

    __slots__ = ("debug", "future", "io", "observer", "snapshot")

    def __init__(
        self,
        future: asyncio.Future[ConvergeTaskCalls],
        snapshot: CodeSnapshot,
        io: TaskIoScope,
        observer: CallObserver | None,
        debug: bool,
    ) -> None:
        self.future = future
        self.snapshot = snapshot
        self.io = io
        self.observer = observer
        self.debug = debug


class RunOwner(Protocol):
    """The CallEngine side of a CallRun."""

    def add_roots(self, task_id: str, roots: Sequence[RootCall | list[Any]]) -> None: ...
    def roots_done(self, task_id: str) -> None: ...
    def close_run(self, task_id: str, run: RunState) -> None: ...


class CallRun:
    """One task's Calls phase as a producer sees it: ``add`` root calls as they come
    (each gets the next root index), ``done`` when there are no more, and ``await
    result()`` for the convergence. Adding to a run that has already failed
    (fastFail, output cap) does nothing."""

    def __init__(
        self, engine: RunOwner, task_id: str, run: RunState, *, missing: str | None = None
    ) -> None:
        self.task_id = task_id
        self._engine = engine
        self._run = run
        # The function is not in the pinned snapshot: the first root call fails the run.
        self._missing = missing
        self._done = False

    def add(self, roots: Sequence[RootCall | list[Any]]) -> None:
        if self._done:
            raise RuntimeError(f"task {self.task_id!r}: root calls added after done()")
        if not roots or self._run.future.done():
            return
        if self._missing is not None:
            self._run.future.set_result(
                ConvergeTaskCalls(
                    task_id=self.task_id,
                    success=False,
                    failure_code=FailureCode.CALL_FAILED,
                    failure_message=f"{CallFailureKind.FUNCTION_NOT_FOUND.value}: {self._missing}",
                    failed_call=CallFailure(
                        index=0, kind=CallFailureKind.FUNCTION_NOT_FOUND, message=self._missing
                    ),
                )
            )
            return
        self._engine.add_roots(self.task_id, roots)

    def done(self) -> None:
        if self._done:
            return
        self._done = True
        if self._missing is not None:
            if not self._run.future.done():
                self._run.future.set_result(
                    ConvergeTaskCalls(task_id=self.task_id, success=True, outputs=[])
                )
            return
        self._engine.roots_done(self.task_id)

    async def result(self) -> ConvergeTaskCalls:
        try:
            return await self._run.future
        finally:
            self._engine.close_run(self.task_id, self._run)
