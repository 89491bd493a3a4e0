"""The state WorkerCore's events share, and the moves they share: looking a task
up, refusing while not ready, moving a task through its phases, failing and
converging it.

``WorkerCore`` (``_core.py``) is the events; this base class holds the slot table,
the submitted tasks, their deadlines, the retained results, the watch credentials
and the task directory, and the moves more than one event makes on them.

A submitted task's phases, and what moves it (``_PHASE_TRANSITIONS``)::

    PREPARING --Prepared--> BUILDER --Built--> CALLS --CallsDone--> WRITER --Written--> TERMINAL
    BUILDER --BuiltNothing--> WRITER          (an empty call list skips the Calls phase)
    WRITER --WriterStarted--> WRITER          (the Writer Plugin has the outputs)
    PREPARING | BUILDER | CALLS | WRITER --Failed | TimedOut | Cancelled | WatchLost--> TERMINAL
    PREPARING --LeaseLost--> TERMINAL         (SLOT_LOST)

Each entry into PREPARING, BUILDER, CALLS or WRITER is an activation with a fresh
token (one counter for the whole core, so a token is never reused, not even by a
task_id submitted again after its result expired). The command that starts the
activation carries the token and the adapter hands it back with the answer; an
answer whose token is not the task's current one is stale and refused
(``_answering``). A pair the table lacks is a caller bug: ``InvalidTransition``,
and the task stays as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from blockx_core.deadlines import DeadlineHeap
from blockx_core.errors import ErrorCode, Refusal
from blockx_core.failures import FailureCode
from blockx_core.task import (
    CallFailureSummary,
    PluginResult,
    TaskInput,
    TaskResult,
    TaskState,
)
from blockx_core.worker._config import WorkerConfig
from blockx_core.worker._listing import TaskDirectory
from blockx_core.worker._progress import ProgressBoard
from blockx_core.worker._retention import RetainedResults, input_digest
from blockx_core.worker._rules import timeout_text
from blockx_core.worker._slots import Slot, SlotTable
from blockx_core.worker._types import (
    Built,
    BuiltNothing,
    CallsDone,
    Cancelled,
    Converge,
    Failed,
    InvalidTransition,
    LeaseExpired,
    LeaseLost,
    PhaseEvent,
    PhaseStart,
    Prepared,
    SlotState,
    StartBuilderPhase,
    StartCallPhase,
    StartWriterPhase,
    TaskConverged,
    TaskPhase,
    TaskSnapshot,
    TimedOut,
    WatchLost,
    WorkerCommand,
    WriterStarted,
    Written,
)
from blockx_core.worker._watch import WatchCredentials

_P = TaskPhase
_ENDINGS: Final = (Failed, TimedOut, Cancelled, WatchLost)

_PHASE_TRANSITIONS: Final[Mapping[tuple[TaskPhase, type[PhaseEvent]], TaskPhase]] = {
    (_P.PREPARING, Prepared): _P.BUILDER,
    (_P.PREPARING, LeaseLost): _P.TERMINAL,
    (_P.BUILDER, Built): _P.CALLS,
    # An empty call list takes no executor slot: straight on to the writer.
    (_P.BUILDER, BuiltNothing): _P.WRITER,
    (_P.CALLS, CallsDone): _P.WRITER,
    # Not a new activation: the Writer phase goes on with the same token.
    (_P.WRITER, WriterStarted): _P.WRITER,
    (_P.WRITER, Written): _P.TERMINAL,
    # A task ends from any phase that runs when it fails, times out, is cancelled or
    # loses its Watch streams.
    **{
        (phase, end): _P.TERMINAL
        for phase in (_P.PREPARING, _P.BUILDER, _P.CALLS, _P.WRITER)
        for end in _ENDINGS
    },
}

# The command that starts each phase's activation.
_STARTS: Final[Mapping[TaskPhase, type[PhaseStart]]] = {
    _P.BUILDER: StartBuilderPhase,
    _P.CALLS: StartCallPhase,
    _P.WRITER: StartWriterPhase,
}


class Task:
    __slots__ = ("deadline_ms", "input", "phase", "slot", "task_id", "token", "writing")

    def __init__(self, task: TaskInput, slot: Slot, deadline_ms: int, token: int) -> None:
        self.task_id = task.task_id
        self.input = task
        self.slot = slot
        self.phase = TaskPhase.PREPARING
        # The current activation's token (PREPARING's until the Builder starts).
        self.token = token
        self.deadline_ms = deadline_ms
        # In its WRITER phase, the Writer Plugin has the outputs: a cancel lets it end.
        self.writing = False

    def apply(self, event: PhaseEvent) -> TaskPhase:
        """Move by the transition table and answer the phase before; an illegal pair
        raises and changes nothing."""
        target = _PHASE_TRANSITIONS.get((self.phase, type(event)))
        if target is None:
            raise InvalidTransition(
                f"task {self.task_id}: {type(event).__name__} in phase {self.phase.value}"
            )
        before, self.phase = self.phase, target
        return before


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
        self._last_token = 0  # the last activation's token: one counter for every task

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

    def _new_token(self) -> int:
        self._last_token += 1
        return self._last_token

    def _answering(self, task_id: str, token: int) -> Task | None:
        """The task an adapter's answer is for, or None when the answer is stale: the
        task converged, or moved on to another activation (or it is another
        submission of the same task_id)."""
        task = self._tasks.get(task_id)
        return task if task is not None and task.token == token else None

    def _advance(self, task: Task, event: PhaseEvent) -> list[WorkerCommand]:
        """A move that keeps the task running: the command that starts the phase it
        entered, with its activation's new token (none for a move within a phase)."""
        before = task.apply(event)
        if task.phase is before:
            return []
        task.token = self._new_token()
        if task.phase is TaskPhase.BUILDER:
            self._slots.activate(task.slot)
        return [_STARTS[task.phase](task_id=task.task_id, token=task.token)]

    def _time_out(self, task: Task, now_ms: int) -> list[WorkerCommand]:
        timeout_ms = task.input.task_timeout_ms or self._config.task_deadline_ms
        return self._fail(
            task, TimedOut(), FailureCode.TIMED_OUT, True, timeout_text(timeout_ms), now_ms
        )

    def _fail(
        self,
        task: Task,
        event: Failed | TimedOut | Cancelled | WatchLost | LeaseLost,
        code: FailureCode,
        retryable: bool,
        message: str,
        now_ms: int,
        *,
        plugin_results: tuple[PluginResult, ...] = (),
        call_failures: tuple[CallFailureSummary, ...] = (),
        call_failures_omitted: int = 0,
    ) -> list[WorkerCommand]:
        result = TaskResult(
            success=False,
            failure_code=code,
            retryable=retryable,
            failure_message=message,
            plugin_results=plugin_results,
            call_failures=call_failures,
            call_failures_omitted=call_failures_omitted,
        )
        return self._converge(task, event, TaskState.FAILED, result, now_ms)

    def _converge(
        self,
        task: Task,
        event: Written | Failed | TimedOut | Cancelled | WatchLost | LeaseLost,
        state: TaskState,
        result: TaskResult,
        now_ms: int,
    ) -> list[WorkerCommand]:
        task.apply(event)
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
