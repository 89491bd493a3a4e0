"""What a task's Builder and Writer Plugin see of it (the specification's TaskCtx)."""

from __future__ import annotations

from dataclasses import dataclass

from blockx_core.code_view import CodeSnapshot
from blockx_core.task import TaskInput
from blockx_server.io.scope import TaskIoScope


@dataclass(frozen=True, slots=True)
class TaskContext:
    task: TaskInput
    # Unix ms by which the task must converge.
    deadline_ms: int
    # The Function Code View epoch pinned at activation.
    code: CodeSnapshot
    io: TaskIoScope

    @property
    def task_id(self) -> str:
        return self.task.task_id
