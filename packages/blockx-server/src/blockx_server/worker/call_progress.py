"""Counting a task's calls as they finish, for the core's call progress.

The dispatcher knows each open task's root calls (done, added, whether the source
is done) and its failed attempts; a ``ProgressCounter`` asks it when some of the
task's calls finished and hands the counts to the Orchestrator, which gives them to
the core (``handle_calls_progress``). It counts each task at most once per event
loop iteration, however many of its calls one executor frame finished: the calls'
observer marks the task, and the count runs on the next iteration, when the
dispatcher has taken the frame in. A streaming Builder's chunks are counted as
they are added (the total so far grows), through ``sink``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import assert_never

from blockx_core.calls import RootCall
from blockx_core.dispatch import CallsConverged, CallsFailed, CallUsage, ConvergeTaskCalls
from blockx_core.worker import CallProgress
from blockx_executor import protocol as wire
from blockx_server.calls.engine import CallEngine
from blockx_server.calls.run import CallObserver, CallRun
from blockx_server.io.errors import IoOutcome

# Told a task's new counts (the Orchestrator hands them to the core).
ReportProgress = Callable[[str, CallProgress], None]


class ProgressCounter:
    def __init__(self, engine: CallEngine, report: ReportProgress) -> None:
        self._engine = engine
        self._report = report
        self._marked: set[str] = set()
        self._scheduled = False
        self._last: dict[str, CallProgress] = {}  # per task in its Calls phase

    def observer(self, task_id: str, inner: CallObserver | None) -> CallObserver:
        """The observer a Calls phase runs with: ``inner``'s (metrics), and a mark
        on the task whenever one of its calls finishes."""
        return _CountingObserver(self, task_id, inner)

    def sink(self, run: CallRun) -> _CountingSink:
        """``run`` as a streaming Builder's feed sees it, counted as chunks come."""
        return _CountingSink(self, run)

    def mark(self, task_id: str) -> None:
        self._marked.add(task_id)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._count_marked)

    def count(self, task_id: str) -> None:
        """Count the task now (its calls were just added, or its source is done)."""
        counts = self._engine.core.task_progress(task_id)
        if counts is None:
            return  # converged or cancelled: the phase's end reports the last counts
        done, added, source_done, failed = counts
        progress = CallProgress(
            calls_done=done, calls_total=added, total_known=source_done, calls_failed=failed
        )
        if self._last.get(task_id) != progress:
            self._last[task_id] = progress
            self._report(task_id, progress)

    def converged(self, task_id: str, converged: ConvergeTaskCalls) -> None:
        """The task's Calls phase ended: its last counts. A success did every call
        it was given; a failure keeps the last counts, with every failed attempt."""
        last = self._last.pop(task_id, None) or CallProgress()
        self._marked.discard(task_id)
        match converged:
            case CallsConverged(outputs=outputs):
                total = len(outputs)
                progress = CallProgress(
                    calls_done=total,
                    calls_total=total,
                    total_known=True,
                    calls_failed=last.calls_failed,
                )
            case CallsFailed():
                progress = CallProgress(
                    calls_done=last.calls_done,
                    calls_total=last.calls_total,
                    total_known=last.total_known,
                    calls_failed=max(
                        last.calls_failed,
                        len(converged.call_failures) + converged.call_failures_omitted,
                    ),
                )
            case _:
                assert_never(converged)
        self._report(task_id, progress)

    def forget(self, task_id: str) -> None:
        """The phase ended without converging (cancelled, a producer failed)."""
        self._last.pop(task_id, None)
        self._marked.discard(task_id)

    def _count_marked(self) -> None:
        self._scheduled = False
        marked, self._marked = self._marked, set()
        for task_id in marked:
            if task_id in self._last:
                self.count(task_id)


class _CountingObserver:
    """A CallObserver that marks its task for a count when a call finishes."""

    __slots__ = ("_counter", "_inner", "_task_id")

    def __init__(self, counter: ProgressCounter, task_id: str, inner: CallObserver | None) -> None:
        self._counter = counter
        self._task_id = task_id
        self._inner = inner

    def call_finished(self, call_id: int, cpu_us: int, io_us: int) -> None:
        if self._inner is not None:
            self._inner.call_finished(call_id, cpu_us, io_us)
        self._counter.mark(self._task_id)

    def calls_measured(self, usage: CallUsage) -> None:
        if self._inner is not None:
            self._inner.calls_measured(usage)

    def call_output(self, call_id: int, text: str) -> None:
        if self._inner is not None:
            self._inner.call_output(call_id, text)

    def io_traced(self, call_id: int, request: wire.IoRequested, outcome: IoOutcome) -> None:
        if self._inner is not None:
            self._inner.io_traced(call_id, request, outcome)


class _CountingSink:
    """A CallRun (``feed_calls``' RootSink) whose added chunks and end are counted."""

    __slots__ = ("_counter", "_run")

    def __init__(self, counter: ProgressCounter, run: CallRun) -> None:
        self._counter = counter
        self._run = run

    @property
    def ended(self) -> bool:
        return self._run.ended

    async def wait_room(self) -> None:
        await self._run.wait_room()

    def add(self, roots: Sequence[RootCall]) -> None:
        self._run.add(roots)
        self._counter.mark(self._run.task_id)

    def done(self) -> None:
        self._run.done()
        self._counter.count(self._run.task_id)  # the total is known now

    def close(self) -> None:
        self._run.close()
