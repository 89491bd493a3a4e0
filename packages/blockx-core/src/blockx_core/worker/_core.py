"""WorkerCore: the Worker's slot table and task lifecycle, sans-IO.

The local slot table is the single source of truth for admission: there is no
central queue and no release RPC. A slot goes FREE → ALLOCATED (RequestTaskSlot,
or SubmitTask without a slot, under a lease) → RUNNING (activation prepared) →
FREE at convergence, at once, independent of how long the result is retained.
While a submitted task is PREPARING its slot is still ALLOCATED under its lease;
if the lease runs out first the task converges SLOT_LOST.

Phases advance only through command/event round trips: the core returns
``PrepareTaskActivation`` and the adapter answers ``handle_task_activation_*``; it
returns ``Start*Phase`` and the adapter answers ``handle_task_phase_finished``.
Every method takes ``now_ms``; nothing here reads a clock. The adapter calls
methods from one event loop, so each one is atomic (two coordinators racing for
the last slot: exactly one wins).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from blockx_core.errors import BlockxUsageError, ErrorCode, FailureCode
from blockx_core.task import RETRYABLE, PluginResult, TaskInput, TaskResult, TaskState
from blockx_core.worker._config import WorkerConfig
from blockx_core.worker._types import (
    AbortTaskWork,
    Activate,
    Allocate,
    Converge,
    InvalidTransition,
    LeaseExpired,
    PhaseOutcome,
    PrepareTaskActivation,
    SlotEvent,
    SlotExpired,
    SlotState,
    StartBuilderPhase,
    StartCallPhase,
    StartWriterPhase,
    TaskConverged,
    TaskPhase,
    TaskSnapshot,
    WorkerCommand,
    WorkerError,
)

_SLOT_TRANSITIONS: Final[Mapping[tuple[SlotState, type[SlotEvent]], SlotState]] = {
    (SlotState.FREE, Allocate): SlotState.ALLOCATED,
    (SlotState.ALLOCATED, Activate): SlotState.RUNNING,
    (SlotState.ALLOCATED, LeaseExpired): SlotState.FREE,
    # A task that fails while still PREPARING (activation failed) frees its slot.
    (SlotState.ALLOCATED, Converge): SlotState.FREE,
    (SlotState.RUNNING, Converge): SlotState.FREE,
}

# The phase whose completion each phase's finish starts.
_NEXT_PHASE: Final[Mapping[TaskPhase, TaskPhase]] = {
    TaskPhase.BUILDER: TaskPhase.CALLS,
    TaskPhase.CALLS: TaskPhase.PLUGIN,
}


class _Slot:
    __slots__ = ("index", "lease_deadline_ms", "slot_id", "state", "task_id")

    def __init__(self, index: int) -> None:
        self.index = index
        self.state = SlotState.FREE
        self.slot_id = ""
        self.task_id = ""
        self.lease_deadline_ms = 0

    def apply(self, event: SlotEvent) -> None:
        target = _SLOT_TRANSITIONS.get((self.state, type(event)))
        if target is None:
            raise InvalidTransition(
                f"slot {self.slot_id or self.index}: {type(event).__name__} in state "
                f"{self.state.value}"
            )
        self.state = target


class _Task:
    __slots__ = (
        "deadline_ms",
        "input",
        "phase",
        "slot",
        "task_id",
        "watch_deadline_ms",
    )

    def __init__(self, task: TaskInput, slot: _Slot, deadline_ms: int) -> None:
        self.task_id = task.task_id
        self.input = task
        self.slot = slot
        self.phase = TaskPhase.PREPARING
        self.deadline_ms = deadline_ms
        self.watch_deadline_ms: int | None = None


class _Retained:
    __slots__ = ("result", "retained_until_ms", "slot_id", "state")

    def __init__(self, state: TaskState, result: TaskResult, slot_id: str, until_ms: int) -> None:
        self.state = state
        self.result = result
        self.slot_id = slot_id
        self.retained_until_ms = until_ms


class WorkerCore:
    """See the module docstring. ``incarnation`` makes slot ids unique across restarts."""

    def __init__(self, config: WorkerConfig, incarnation: str) -> None:
        config.validate()
        self._config = config
        self._incarnation = incarnation
        self._slots = [_Slot(i) for i in range(config.task_slots)]
        self._free = list(reversed(range(config.task_slots)))  # a stack of free indexes
        self._slot_by_id: dict[str, _Slot] = {}
        self._slot_by_task: dict[str, _Slot] = {}  # ALLOCATED and RUNNING slots
        self._tasks: dict[str, _Task] = {}  # submitted, not yet terminal
        self._retained: dict[str, _Retained] = {}
        # Open Watch streams per reserved or submitted task; a task in ``_watched`` has
        # been watched at least once (the run credential is armed).
        self._watchers: dict[str, int] = {}
        self._watched: set[str] = set()
        self._allocations = 0
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

    # ---- admission -------------------------------------------------------------------

    def effective_task_deadline_ms(self, task_timeout_ms: int) -> int | WorkerError:
        """The timeout a task gets: 0 means TaskDeadlineMs; negative or above
        MaxTaskTimeoutMs is invalid."""
        cfg = self._config
        if task_timeout_ms < 0:
            return WorkerError(
                ErrorCode.INVALID_ARGUMENT, f"task_timeout_ms must be >= 0 (got {task_timeout_ms})"
            )
        if task_timeout_ms > cfg.max_task_timeout_ms:
            return WorkerError(
                ErrorCode.INVALID_ARGUMENT,
                f"task_timeout_ms {task_timeout_ms} exceeds MAX_TASK_TIMEOUT_MS "
                f"({cfg.max_task_timeout_ms})",
            )
        return task_timeout_ms or cfg.task_deadline_ms

    def handle_request_task_slot(
        self, task_id: str, ttl_ms: int, now_ms: int
    ) -> TaskSnapshot | WorkerError:
        if ttl_ms <= 0:
            return WorkerError(ErrorCode.INVALID_ARGUMENT, f"ttl_ms must be > 0 (got {ttl_ms})")
        if not task_id:
            return WorkerError(ErrorCode.INVALID_ARGUMENT, "task_id is required")
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        slot = self._slot_by_task.get(task_id)
        if slot is not None:
            # Idempotent: the same task_id keeps its slot (and its lease).
            return self._snapshot_of_slot(slot)
        retained = self._retained_snapshot(task_id, now_ms)
        if retained is not None:
            # Already ran: SubmitTask with this slot_id answers the retained result.
            return retained
        if not self._free:
            return WorkerError(
                ErrorCode.NO_SLOT,
                f"no free slot: all {self._config.task_slots} task slots are reserved or running",
            )
        slot = self._slots[self._free.pop()]
        slot.apply(Allocate())
        self._allocations += 1
        slot.slot_id = f"{self._incarnation}-{slot.index}-{self._allocations}"
        slot.task_id = task_id
        slot.lease_deadline_ms = now_ms + ttl_ms
        self._slot_by_id[slot.slot_id] = slot
        self._slot_by_task[task_id] = slot
        return self._snapshot_of_slot(slot)

    def handle_submit_task(
        self, task: TaskInput, slot_id: str, now_ms: int
    ) -> tuple[TaskSnapshot, list[WorkerCommand]] | WorkerError:
        """Admit a task in the seeds' order. A new task answers RUNNING and comes with
        a PrepareTaskActivation; a known task_id answers its current state and never
        starts a second execution."""
        if not task.task_id:
            return WorkerError(ErrorCode.INVALID_ARGUMENT, "task.task_id is required")
        timeout = self.effective_task_deadline_ms(task.task_timeout_ms)
        if isinstance(timeout, WorkerError):
            return timeout
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        running = self._tasks.get(task.task_id)
        if running is not None:
            return TaskSnapshot(
                task_id=task.task_id, slot_id=running.slot.slot_id, state=TaskState.RUNNING
            ), []
        retained = self._retained_snapshot(task.task_id, now_ms)
        if retained is not None:
            return retained, []
        if not slot_id:
            reserved = self.handle_request_task_slot(
                task.task_id, self._config.default_ttl_ms, now_ms
            )
            if isinstance(reserved, WorkerError):
                return reserved
            slot_id = reserved.slot_id
        slot = self._slot_by_id.get(slot_id)
        if (
            slot is None
            or slot.state is not SlotState.ALLOCATED
            or slot.task_id != task.task_id
            or slot.lease_deadline_ms <= now_ms
        ):
            return WorkerError(ErrorCode.INVALID_SLOT, self._why_invalid(slot, slot_id, task))
        record = _Task(task, slot, now_ms + timeout)
        self._tasks[task.task_id] = record
        snapshot = TaskSnapshot(task_id=task.task_id, slot_id=slot_id, state=TaskState.RUNNING)
        return snapshot, [
            PrepareTaskActivation(task_id=task.task_id, task=task, deadline_ms=record.deadline_ms)
        ]

    # ---- phases ----------------------------------------------------------------------

    def handle_task_activation_prepared(self, task_id: str, now_ms: int) -> list[WorkerCommand]:
        task = self._tasks.get(task_id)
        if task is None or task.phase is not TaskPhase.PREPARING:
            return []  # e.g. its lease expired meanwhile (SLOT_LOST)
        if task.slot.lease_deadline_ms <= now_ms:
            # The lease ran out while preparing; the timer tick may not have seen it yet.
            return self._fail(task, FailureCode.SLOT_LOST, True, _SLOT_LOST_TEXT, now_ms)
        task.slot.apply(Activate())
        task.slot.lease_deadline_ms = 0
        task.phase = TaskPhase.BUILDER
        return [StartBuilderPhase(task_id=task_id)]

    def handle_task_activation_failed(
        self, task_id: str, code: FailureCode, message: str, now_ms: int
    ) -> list[WorkerCommand]:
        task = self._tasks.get(task_id)
        if task is None or task.phase is not TaskPhase.PREPARING:
            return []
        return self._fail(task, code, RETRYABLE.get(code, True), message, now_ms)

    def handle_task_phase_finished(
        self, task_id: str, phase: TaskPhase, outcome: PhaseOutcome, now_ms: int
    ) -> list[WorkerCommand]:
        if phase not in _DEFAULT_FAILURE:
            raise BlockxUsageError(f"{phase.value} is not a phase that finishes with an outcome")
        task = self._tasks.get(task_id)
        if task is None or task.phase is not phase:
            return []  # a late answer for a task that has moved on (timed out, ...)
        if not outcome.success:
            code = outcome.failure_code or _DEFAULT_FAILURE[phase]
            retryable = RETRYABLE.get(code, outcome.retryable)
            return self._fail(
                task, code, retryable, outcome.message, now_ms, outcome.plugin_results
            )
        if phase is TaskPhase.PLUGIN:
            result = TaskResult(success=True, plugin_results=outcome.plugin_results)
            return self._converge(task, TaskState.SUCCEEDED, result, now_ms)
        next_phase = _NEXT_PHASE[phase]
        if next_phase is TaskPhase.CALLS and now_ms >= task.deadline_ms:
            # The deadline is checked before Calls take an executor slot.
            return self._fail(task, FailureCode.TIMED_OUT, True, self._timeout_text(task), now_ms)
        task.phase = next_phase
        if next_phase is TaskPhase.CALLS:
            return [StartCallPhase(task_id=task_id)]
        # After Calls the writer phase always runs, with or without a result handler.
        return [StartWriterPhase(task_id=task_id)]

    # ---- watch as run credential -----------------------------------------------------

    def watch_attached(self, task_id: str, now_ms: int) -> None:
        """A Watch stream on a reserved or submitted task opened."""
        if task_id not in self._slot_by_task:
            return  # unknown or already terminal: nothing to guard
        self._watchers[task_id] = self._watchers.get(task_id, 0) + 1
        self._watched.add(task_id)
        task = self._tasks.get(task_id)
        if task is not None:
            task.watch_deadline_ms = None

    def watch_detached(self, task_id: str, now_ms: int) -> None:
        """The Worker confirmed a Watch stream on the task is gone."""
        count = self._watchers.get(task_id, 0)
        if count == 0:
            return
        if count > 1:
            self._watchers[task_id] = count - 1
            return
        del self._watchers[task_id]
        task = self._tasks.get(task_id)
        grace = self._config.watch_disconnect_grace_ms
        if task is not None and task_id in self._watched and grace > 0:
            task.watch_deadline_ms = now_ms + grace

    # ---- timers ----------------------------------------------------------------------

    def tick_timers(self, now_ms: int) -> list[WorkerCommand]:
        """Reclaim expired leases, time out tasks, rule lost watches, purge results."""
        out: list[WorkerCommand] = []
        for slot in self._slots:
            if slot.state is SlotState.ALLOCATED and slot.lease_deadline_ms <= now_ms:
                task = self._tasks.get(slot.task_id)
                if task is not None:
                    out += self._fail(task, FailureCode.SLOT_LOST, True, _SLOT_LOST_TEXT, now_ms)
                else:
                    out.append(SlotExpired(task_id=slot.task_id, slot_id=slot.slot_id))
                    slot.apply(LeaseExpired())
                    self._release(slot)
        for task in list(self._tasks.values()):
            if now_ms >= task.deadline_ms:
                out.append(AbortTaskWork(task_id=task.task_id))
                out += self._fail(
                    task, FailureCode.TIMED_OUT, True, self._timeout_text(task), now_ms
                )
            elif task.watch_deadline_ms is not None and now_ms >= task.watch_deadline_ms:
                out.append(AbortTaskWork(task_id=task.task_id))
                out += self._fail(
                    task,
                    FailureCode.WATCH_DISCONNECTED,
                    False,
                    f"no Watch stream for {self._config.watch_disconnect_grace_ms} ms "
                    "(WATCH_DISCONNECT_GRACE_MS)",
                    now_ms,
                )
        expired = [t for t, r in self._retained.items() if r.retained_until_ms <= now_ms]
        for task_id in expired:
            del self._retained[task_id]
        return out

    def next_deadline_ms(self) -> int | None:
        """The earliest moment tick_timers has work to do (aioquic-style timer)."""
        deadlines = [s.lease_deadline_ms for s in self._slots if s.state is SlotState.ALLOCATED]
        for task in self._tasks.values():
            deadlines.append(task.deadline_ms)
            if task.watch_deadline_ms is not None:
                deadlines.append(task.watch_deadline_ms)
        deadlines += [r.retained_until_ms for r in self._retained.values()]
        return min(deadlines) if deadlines else None

    # ---- queries ---------------------------------------------------------------------

    def handle_get_task_result(self, task_id: str, now_ms: int) -> TaskSnapshot | WorkerError:
        slot = self._slot_by_task.get(task_id)
        if slot is not None:  # reserved, or submitted and not terminal
            return self._snapshot_of_slot(slot)
        retained = self._retained_snapshot(task_id, now_ms)
        if retained is not None:
            return retained
        return WorkerError(
            ErrorCode.NOT_FOUND,
            f"task {task_id!r} is unknown here, or its result has expired "
            f"(results are kept {self._config.result_retention_ms} ms)",
        )

    def derive_heartbeat(self) -> tuple[int, int, int]:
        """``(taskSlots, reservedSlots, runningTasks)`` from the slot table."""
        reserved = sum(1 for s in self._slots if s.state is SlotState.ALLOCATED)
        running = sum(1 for s in self._slots if s.state is SlotState.RUNNING)
        return self._config.task_slots, reserved, running

    def slot_states(self) -> list[SlotState]:
        return [s.state for s in self._slots]

    def task_phase(self, task_id: str) -> TaskPhase | None:
        task = self._tasks.get(task_id)
        return None if task is None else task.phase

    def task_deadline_ms(self, task_id: str) -> int | None:
        task = self._tasks.get(task_id)
        return None if task is None else task.deadline_ms

    # ---- internals -------------------------------------------------------------------

    def _unavailable(self) -> WorkerError | None:
        if self._draining:
            return WorkerError(ErrorCode.UNAVAILABLE, "the worker is draining")
        if not self._ready:
            return WorkerError(
                ErrorCode.UNAVAILABLE, "the worker is not ready (executors or code still loading)"
            )
        return None

    def _retained_snapshot(self, task_id: str, now_ms: int) -> TaskSnapshot | None:
        """The terminal result of a task that ran here, while it is still kept."""
        retained = self._retained.get(task_id)
        if retained is None or retained.retained_until_ms <= now_ms:
            return None
        return TaskSnapshot(
            task_id=task_id,
            slot_id=retained.slot_id,
            state=retained.state,
            result=retained.result,
        )

    def _snapshot_of_slot(self, slot: _Slot) -> TaskSnapshot:
        running = slot.state is SlotState.RUNNING or slot.task_id in self._tasks
        return TaskSnapshot(
            task_id=slot.task_id,
            slot_id=slot.slot_id,
            state=TaskState.RUNNING if running else TaskState.ALLOCATED,
            lease_deadline_ms=slot.lease_deadline_ms if slot.state is SlotState.ALLOCATED else 0,
        )

    def _why_invalid(self, slot: _Slot | None, slot_id: str, task: TaskInput) -> str:
        if slot is None:
            return (
                f"slot {slot_id!r} does not exist on this worker (expired, already used, or "
                "issued before a restart): reserve a slot again"
            )
        if slot.task_id != task.task_id:
            return f"slot {slot_id!r} is reserved for another task, not {task.task_id!r}"
        if slot.state is SlotState.ALLOCATED:
            return f"slot {slot_id!r} has expired (its lease ended): reserve a slot again"
        return f"slot {slot_id!r} is {slot.state.value}, not ALLOCATED"

    def _timeout_text(self, task: _Task) -> str:
        timeout = task.input.task_timeout_ms or self._config.task_deadline_ms
        return f"the task did not finish within its timeout of {timeout} ms"

    def _fail(
        self,
        task: _Task,
        code: FailureCode,
        retryable: bool,
        message: str,
        now_ms: int,
        plugin_results: tuple[PluginResult, ...] = (),
    ) -> list[WorkerCommand]:
        result = TaskResult(
            success=False,
            failure_code=code,
            retryable=retryable,
            failure_message=message,
            plugin_results=plugin_results,
        )
        return self._converge(task, TaskState.FAILED, result, now_ms)

    def _converge(
        self, task: _Task, state: TaskState, result: TaskResult, now_ms: int
    ) -> list[WorkerCommand]:
        task.phase = TaskPhase.TERMINAL
        del self._tasks[task.task_id]
        slot = task.slot
        slot_id = slot.slot_id
        slot.apply(Converge())
        self._release(slot)
        self._retained[task.task_id] = _Retained(
            state, result, slot_id, now_ms + self._config.result_retention_ms
        )
        return [TaskConverged(task_id=task.task_id, slot_id=slot_id, state=state, result=result)]

    def _release(self, slot: _Slot) -> None:
        del self._slot_by_id[slot.slot_id]
        del self._slot_by_task[slot.task_id]
        self._watchers.pop(slot.task_id, None)
        self._watched.discard(slot.task_id)
        slot.slot_id = ""
        slot.task_id = ""
        slot.lease_deadline_ms = 0
        self._free.append(slot.index)


_SLOT_LOST_TEXT: Final = "the slot's lease expired before the task was activated"

_DEFAULT_FAILURE: Final[Mapping[TaskPhase, FailureCode]] = {
    TaskPhase.BUILDER: FailureCode.BUILDER_FAILED,
    TaskPhase.CALLS: FailureCode.CALL_FAILED,
    TaskPhase.PLUGIN: FailureCode.PLUGIN_FAILED,
}
