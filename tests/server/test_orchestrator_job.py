"""The Orchestrator runs a task's activation and phases in turn in one asyncio task."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from blockx_core.calls import RootOutput
from blockx_core.code_view import FunctionCodeView
from blockx_core.task import PluginSpec, TaskInput, TaskState
from blockx_core.worker import TaskSnapshot, WorkerConfig, WorkerCore
from blockx_server.calls.engine import CallEngine, CallEngineConfig
from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.router import IoRouter
from blockx_server.pipeline.builders import Builders, CallList
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.writers import Writers
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


async def test_the_next_phase_starts_in_the_same_asyncio_task() -> None:
    seen: Seen = []
    builders = Builders("Call Builder")
    builders.register("Recording", RecordingBuilder(seen))
    writers = Writers("Writer Plugin")
    writers.register("RecordingWriter", RecordingWriter(seen))
    view = FunctionCodeView(retention_ms=60_000)
    view.publish({"fns": "def f():\n    return 1\n"}, SYSTEM_CLOCK.now_ms())
    core = WorkerCore(WorkerConfig(), "boot")
    core.set_ready(True)
    orchestrator = Orchestrator(
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
    task = TaskInput(
        task_id="one-job",
        function_call_config=PluginSpec(type="Recording"),
        result_handler=PluginSpec(type="RecordingWriter"),
    )
    slot = orchestrator.request_task_slot(task.task_id, 5_000)
    assert isinstance(slot, TaskSnapshot)
    subscription = orchestrator.subscriptions.subscribe([task.task_id])
    assert isinstance(orchestrator.submit_task(task, slot.slot_id), TaskSnapshot)
    async with asyncio.timeout(30):
        event = await subscription.queue.get()
    assert event.state is TaskState.SUCCEEDED, event
    assert [name for name, _ in seen] == ["builder", "writer"]
    builder_task, writer_task = (task for _, task in seen)
    assert builder_task is not None
    assert writer_task is builder_task
