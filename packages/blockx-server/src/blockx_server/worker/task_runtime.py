"""What the Worker's Orchestrator keeps for one task while it runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from blockx_core.calls import RootOutput
from blockx_core.task import TaskInput
from blockx_server.pipeline.builders import CallList, CallStream
from blockx_server.pipeline.context import TaskContext


class TaskRuntime:
    """The adapter-side state of one task (the specification's taskRuntime)."""

    __slots__ = (
        "accepted",
        "calls",
        "ctx",
        "deadline_ms",
        "job",
        "outputs",
        "task",
        "token",
    )

    def __init__(self, task: TaskInput, deadline_ms: int) -> None:
        self.task = task
        self.accepted = time.perf_counter()
        self.deadline_ms = deadline_ms
        self.ctx: TaskContext | None = None
        # The Builder's calls: a list, or a stream a streaming Builder prepared.
        self.calls: CallList | CallStream | None = None
        self.outputs: Sequence[RootOutput] = ()
        # The one asyncio task that runs the task's activation and phases in turn.
        self.job: asyncio.Task[None] | None = None
        # The token of the activation the job runs (the core's, handed back with
        # each answer).
        self.token = 0
