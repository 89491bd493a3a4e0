"""The Orchestrator runs a task's activation and phases in turn in one asyncio task,
and stops a task a client cancels (CancelTask): a Builder is stopped, a Writer that
writes is let finish."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from blockx_core.calls import RootOutput
from blockx_core.code_view import FunctionCodeView
from blockx_core.task import CANCELLED_BY_CLIENT, PluginConfig, TaskInput, TaskState
from blockx_core.worker import CancelAnswer, CancelOutcome, TaskSnapshot, WorkerConfig, WorkerCore
from blockx_server.calls.engine import CallEngine, CallEngineConfig
from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.router import IoRouter
from blockx_server.pipeline.builders import Builders, CallBuilder, CallList
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.writers import WriterPlugin, Writers
from blockx_server.runtime.clock import SYSTEM_CLOCK
from blockx_server.worker.orchestrator import Orchestrator
from blockx_server.worker.subscriptions import SubscriptionManager

Seen = list[tuple[str, "asyncio.Task[Any] | None"]]


class RecordingBuilder:
    """Builds no calls (so the Calls phase is skipped) and notes the asyncio task."""

    def __init__(self, seen: Seen) -> None:
        self._seen = seen

    async def build(self, ctx: TaskContext, config: Any) -> CallList:
        self._seen.append(("builder", asyncio.current_task()))
        await asyncio.sleep(0)  # a phase that yields to the loop
        return CallList("f", [])


class RecordingWriter:
    def __init__(self, seen: Seen) -> None:
        self._seen = seen

    async def execute(self, ctx: TaskContext, config: Any, outputs: Sequence[RootOutput]) -> bytes:
        self._seen.append(("writer", asyncio.current_task()))
        return b"[]"


class HeldBuilder:
    """Waits until released (a scan of a large range, say); notes being cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def build(self, ctx: TaskContext, config: Any) -> CallList:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return CallList("f", [])


class HeldWriter:
    """Writes once released (a transaction waiting on a lock, say)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def execute(self, ctx: TaskContext, config: Any, outputs: Sequence[RootOutput]) -> bytes:
        self.started.set()
        await self.release.wait()
        return b'{"rows": 1}'


def orchestrator_with(builder: CallBuilder, writer: WriterPlugin) -> Orchestrator:
    builders = Builders("Call Builder")
    builders.register("B", builder)
    writers = Writers("Writer Plugin")
    writers.register("W", writer)
    view = FunctionCodeView(retention_ms=60_000)
    view.publish({"fns": "def f():\n    return 1\n"}, SYSTEM_CLOCK.now_ms())
    core = WorkerCore(WorkerConfig(), "boot")
    core.set_ready(True)
    return Orchestrator(
        core,
        # Never started: a task without calls does not reach the executors.
        CallEngine(CallEngineConfig()),
        view,
        IoRouter([MemoryBackend({})]),
        builders,
        writers,
        SubscriptionManager(),
        SYSTEM_CLOCK,
    )


def submit(orchestrator: Orchestrator, task_id: str) -> asyncio.Queue[Any]:
    """Submit a task of builder B and writer W; the queue of its Watch events."""
    task = TaskInput(
        task_id=task_id,
        function_call_config=PluginConfig(type="B"),
        result_handler=PluginConfig(type="W"),
    )
    slot = orchestrator.request_task_slot(task.task_id, 5_000)
    assert isinstance(slot, TaskSnapshot)
    subscription = orchestrator.subscriptions.subscribe([task.task_id])
    assert isinstance(orchestrator.submit_task(task, slot.slot_id), TaskSnapshot)
    return subscription.queue


async def test_the_next_phase_starts_in_the_same_asyncio_task() -> None:
    seen: Seen = []
    orchestrator = orchestrator_with(RecordingBuilder(seen), RecordingWriter(seen))
    events = submit(orchestrator, "one-job")
    async with asyncio.timeout(30):
        event = await events.get()
    assert event.state is TaskState.SUCCEEDED, event
    assert [name for name, _ in seen] == ["builder", "writer"]
    builder_task, writer_task = (task for _, task in seen)
    assert builder_task is not None
    assert writer_task is builder_task


async def test_a_cancelled_builder_is_stopped_and_not_the_workers_fault() -> None:
    builder = HeldBuilder()
    orchestrator = orchestrator_with(builder, RecordingWriter([]))
    events = submit(orchestrator, "held")
    async with asyncio.timeout(30):
        await builder.started.wait()
        answer = orchestrator.cancel_task("held")
        event = await events.get()
    assert isinstance(answer, CancelAnswer)
    assert answer.outcome is CancelOutcome.CANCELLED
    assert event.result is not None
    assert (event.state, event.result.failure_message) == (TaskState.FAILED, CANCELLED_BY_CLIENT)
    async with asyncio.timeout(30):
        await builder.cancelled.wait()  # the Builder was stopped, not left running
    assert orchestrator.running_tasks() == 0
    assert orchestrator.error_rate.rate(SYSTEM_CLOCK.now_ms()) == 0.0


async def test_a_writer_that_writes_is_let_finish() -> None:
    writer = HeldWriter()
    orchestrator = orchestrator_with(RecordingBuilder([]), writer)
    events = submit(orchestrator, "writing")
    async with asyncio.timeout(30):
        await writer.started.wait()
        answer = orchestrator.cancel_task("writing")
        assert isinstance(answer, CancelAnswer)
        assert answer.outcome is CancelOutcome.WRITING
        writer.release.set()
        event = await events.get()
    assert event.state is TaskState.SUCCEEDED, event
