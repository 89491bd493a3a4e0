"""The state WorkerCore's events share, and the moves they share: looking a task
up, refusing while not ready, failing and converging a task.

``WorkerCore`` (``_core.py``) is the events; this base class holds the slot table,
the submitted tasks, their deadlines, the retained results, the watch credentials
and the task directory, and the moves more than one event makes on them.
"""

from __future__ import annotations

from blockx_core.deadlines import DeadlineHeap
from blockx_core.errors import ErrorCode, Refusal
from blockx_core.failures import FailureCode
from blockx_core.task import PluginResult, TaskInput, TaskResult, TaskState
from blockx_core.worker._config import WorkerConfig
from blockx_core.worker._listing import TaskDirectory
from blockx_core.worker._progress import ProgressBoard
from blockx_core.worker._retention import RetainedResults, input_digest
from blockx_core.worker._rules import timeout_text
from blockx_core.worker._slots import Slot, SlotTable
from blockx_core.worker._types import (
    Converge,
    LeaseExpired,
    PhaseOutcome,
    SlotState,
    TaskConverged,
    TaskPhase,
    TaskSnapshot,
    WorkerCommand,
)
from blockx_core.worker._watch import WatchCredentials


class Task:
    __slots__ = ("deadline_ms", "input", "phase", "slot", "task_id", "writing")

    def __init__(self, task: TaskInput, slot: Slot, deadline_ms: int) -> None:
        self.task_id = task.task_id
        self.input = task
        self.slot = slot
        self.phase = TaskPhase.PREPARING
        self.deadline_ms = deadline_ms
        # In its WRITER phase, the Writer Plugin has the outputs: a cancel lets it end.
        self.writing = False


class TaskBook:
    """The Worker core's state (see the module docstring); ``incarnation`` makes slot
    ids unique across restarts."""

    def __init__(self, config: WorkerConfig, incarnation: str) -> None:
        config.validate()
        self._config = config
        self._slots = SlotTable(config.task_slots, incarnation)
        self._tasks: dict[str, Task] = {}  # submitted, not yet terminal
        self._task_deadlines: DeadlineHeap[str] = DeadlineHeap()
        self._retained = RetainedResults(
            config.result_retention_max_bytes, config.result_tombstones_max
        )
        self._watches = WatchCredentials(config.watch_disconnect_grace_ms)
        self._directory = TaskDirectory(incarnation, config.failed_tasks_kept)
        self._progress = ProgressBoard()
        self._ready = False
        self._draining = False

    # ---- lifecycle flags -----------------------------------------------------------

    @property
    def config(self) -> WorkerConfig:
        return self._config

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def draining(self) -> bool:
        return self._draining

    def set_ready(self, ready: bool) -> None:
        """Ready once the executors heartbeat and the function code is loaded."""
        self._ready = ready

    def start_draining(self) -> None:
        """Refuse new work; running tasks go on to converge."""
        self._draining = True

    def active_task_ids(self) -> list[str]:
        return list(self._tasks)

    # ---- internals -------------------------------------------------------------------

    def _unavailable(self) -> Refusal | None:
        if self._draining:
            return Refusal(ErrorCode.UNAVAILABLE, "the worker is draining")
        if not self._ready:
            return Refusal(
                ErrorCode.UNAVAILABLE, "the worker is not ready (executors or code still loading)"
            )
        return None

    def _lookup(self, task_id: str, now_ms: int) -> TaskSnapshot | None:
        """Reserved, or submitted and not terminal; else its retained result or tombstone."""
        slot = self._slots.by_task(task_id)
        if slot is not None:
            return self._snapshot_of_slot(slot)
        return self._retained.snapshot(task_id, now_ms)

    def _snapshot_of_slot(self, slot: Slot) -> TaskSnapshot:
        running = slot.state is SlotState.RUNNING or slot.task_id in self._tasks
        return TaskSnapshot(
            task_id=slot.task_id,
            slot_id=slot.slot_id,
            state=TaskState.RUNNING if running else TaskState.ALLOCATED,
            lease_deadline_ms=slot.lease_deadline_ms if slot.state is SlotState.ALLOCATED else 0,
        )

    def _time_out(self, task: Task, now_ms: int) -> list[WorkerCommand]:
        timeout_ms = task.input.task_timeout_ms or self._config.task_deadline_ms
        return self._fail(task, FailureCode.TIMED_OUT, True, timeout_text(timeout_ms), now_ms)

    def _fail(
        self,
        task: Task,
        code: FailureCode,
        retryable: bool,
        message: str,
        now_ms: int,
        plugin_results: tuple[PluginResult, ...] = (),
        outcome: PhaseOutcome | None = None,
    ) -> list[WorkerCommand]:
        result = TaskResult(
            success=False,
            failure_code=code,
            retryable=retryable,
            failure_message=message,
            plugin_results=plugin_results,
            call_failures=() if outcome is None else outcome.call_failures,
            call_failures_omitted=0 if outcome is None else outcome.call_failures_omitted,
        )
        return self._converge(task, TaskState.FAILED, result, now_ms)

    def _converge(
        self, task: Task, state: TaskState, result: TaskResult, now_ms: int
    ) -> list[WorkerCommand]:
        task.phase = TaskPhase.TERMINAL
        task_id = task.task_id
        del self._tasks[task_id]
        self._task_deadlines.cancel(task_id)
        slot_id = task.slot.slot_id
        until_ms = now_ms + self._config.result_retention_ms
        digest = input_digest(task.input)
        progress = self._progress.latest(task_id)
        self._release(task.slot, Converge())
        self._directory.converged(task_id, result, now_ms)
        self._retained.keep(task_id, state, result, slot_id, digest, now_ms, until_ms)
        return [
            TaskConverged(
                task_id=task_id, slot_id=slot_id, state=state, result=result, progress=progress
            )
        ]

    def _release(self, slot: Slot, event: LeaseExpired | Converge) -> None:
        self._slots.release(slot, event)
        self._watches.forget(slot.task_id)
        self._progress.forget(slot.task_id)
