"""The externally visible state of a task."""

from __future__ import annotations

import enum


class TaskState(enum.Enum):
    """The four states a client can see; internal phases all fold into RUNNING."""

    ALLOCATED = "ALLOCATED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED)
