"""WorkerCore: the Worker's slot table and task lifecycle, sans-IO.

The local slot table is the single source of truth for admission: there is no
central queue and no release RPC. A slot goes FREE → ALLOCATED (RequestTaskSlot,
or SubmitTask without a slot, under a lease) → RUNNING (activation prepared) →
FREE at convergence, at once, independent of how long the result is retained.
While a submitted task is PREPARING its slot is still ALLOCATED under its lease;
if the lease runs out first the task converges SLOT_LOST. Results are retained
within a byte budget; one dropped for it leaves a tombstone (``_retention.py``).

Phases advance only through command/event round trips, by one transition table
(``_task_book.py``): the core returns ``PrepareTaskActivation`` and the adapter
answers ``handle_task_activation_*``; it returns ``Start*Phase`` and the adapter
answers ``handle_task_phase_finished`` (or ``handle_plugin_not_found`` when it has
no builder or writer by the task's name). Each command carries its activation's
token and each answer hands it back: the core refuses a stale answer (a phase the
task has left, a submission the task_id had before) and the adapter keeps no
guard of its own. The core decides what follows: a failure code and its
retryability, and that a builder's empty call list skips the Calls phase. Every
method takes
``now_ms``; nothing here reads a clock. The adapter calls methods from one event
loop, so each one is atomic (two coordinators racing for the last slot: exactly
one wins).

While a task is in its Calls phase the adapter hands in its call counts
(``handle_calls_progress``); the core keeps them for ListTasks and decides, per
task, when the Watch streams that asked for progress hear of them
(``PublishProgress``, rate-limited and coalesced: ``_progress.py``).

CancelTask (a BlockX addition, ``handle_cancel_task``) ends a submitted task the
way a timeout does: ``AbortTaskWork`` (the adapter stops the running phase, whose
calls get CancelCall) and the task converges at once, FAILED / CANCELLED, not
retryable. Only a Writer Plugin that has the outputs already (the adapter says so
with ``handle_writer_started``) is let finish: a result partly written is never
reported as cancelled with nothing written.

A WatchTasks stream is opened and closed through the core (``handle_open_watch``,
``handle_close_watch``): it checks the request, answers the first snapshots, and
decides which published updates the stream sends (``_watch_stream.py``).

Timers work the aioquic way: ``next_deadline_ms`` says when ``tick_timers`` has
work, and the adapter arms its timer from it after every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import assert_never

from blockx_core.errors import BlockxUsageError, ErrorCode, Refusal
from blockx_core.failures import FailureCode, is_retryable
from blockx_core.ids import MAX_WATCH_TASK_IDS, shown, task_id_problem
from blockx_core.task import (
    CANCELLED_BY_CLIENT,
    PluginResult,
    TaskInput,
    TaskResult,
    TaskState,
    cancelled_by_client,
)
from blockx_core.worker._listing import (
    ListedTask,
    ListTasksQuery,
    RunningTask,
    TaskListing,
    query_problem,
)
from blockx_core.worker._progress import CallProgress
from blockx_core.worker._retention import input_digest
from blockx_core.worker._rules import (
    DEFAULT_FAILURE,
    NOT_FOUND,
    SLOT_LOST_TEXT,
    why_invalid,
)
from blockx_core.worker._task_book import Task, TaskBook
from blockx_core.worker._types import (
    AbortTaskWork,
    Built,
    BuiltNothing,
    CallsDone,
    CancelAnswer,
    Cancelled,
    CancelOutcome,
    Failed,
    LeaseExpired,
    LeaseLost,
    PhaseCrashed,
    PhaseFailed,
    PhaseOutcome,
    PhaseSucceeded,
    Prepared,
    PrepareTaskActivation,
    PublishProgress,
    RetentionStats,
    SlotExpired,
    SlotState,
    TaskPhase,
    TaskSnapshot,
    WatchLost,
    WorkerCommand,
    WriterStarted,
    Written,
)
from blockx_core.worker._watch_stream import (
    UnknownTask,
    WatchedTask,
    WatchStart,
    WatchStream,
)


class WorkerCore(TaskBook):
    """See the module docstring. ``incarnation`` makes slot ids unique across restarts.

    Every operation costs O(log n) in the tasks and slots in use, whatever
    ``task_slots`` is: timers sit in heaps (:class:`DeadlineHeap`), counts by state
    are kept by the slot table.
    """

    # ---- admission -------------------------------------------------------------------

    def effective_task_deadline_ms(self, task_timeout_ms: int) -> int | Refusal:
        """The timeout a task gets: 0 means TaskDeadlineMs; negative or above
        MaxTaskTimeoutMs is invalid."""
        cfg = self._config
        if task_timeout_ms < 0:
            return Refusal(
                ErrorCode.INVALID_ARGUMENT, f"task_timeout_ms must be >= 0 (got {task_timeout_ms})"
            )
        if task_timeout_ms > cfg.max_task_timeout_ms:
            return Refusal(
                ErrorCode.INVALID_ARGUMENT,
                f"task_timeout_ms {task_timeout_ms} exceeds MAX_TASK_TIMEOUT_MS "
                f"({cfg.max_task_timeout_ms})",
            )
        return task_timeout_ms or cfg.task_deadline_ms

    def handle_request_task_slot(
        self, task_id: str, ttl_ms: int, now_ms: int
    ) -> TaskSnapshot | Refusal:
        if ttl_ms <= 0:
            return Refusal(ErrorCode.INVALID_ARGUMENT, f"ttl_ms must be > 0 (got {ttl_ms})")
        if ttl_ms > self._config.max_slot_ttl_ms:
            return Refusal(
                ErrorCode.INVALID_ARGUMENT,
                f"ttl_ms {ttl_ms} exceeds MAX_SLOT_TTL_MS ({self._config.max_slot_ttl_ms})",
            )
        problem = task_id_problem(task_id)
        if problem is not None:
            return Refusal(ErrorCode.INVALID_ARGUMENT, problem)
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        slot = self._slots.by_task(task_id)
        if slot is not None:
            # Idempotent: the same task_id keeps its slot (and its lease).
            return self._snapshot_of_slot(slot)
        retained = self._retained.snapshot(task_id, now_ms)
        if retained is not None:
            # Already ran: SubmitTask with this slot_id answers the retained result.
            return retained
        if not self._slots.has_free():
            return Refusal(
                ErrorCode.NO_SLOT,
                f"no free slot: all {self._config.task_slots} task slots are reserved or running",
            )
        slot = self._slots.allocate(task_id, now_ms + ttl_ms)
        self._directory.seen(task_id, now_ms, self._lookup)
        return self._snapshot_of_slot(slot)

    def handle_submit_task(
        self, task: TaskInput, slot_id: str, now_ms: int
    ) -> tuple[TaskSnapshot, list[WorkerCommand]] | Refusal:
        """Admit a task. A new task answers RUNNING and comes with a
        PrepareTaskActivation; a known task_id answers its current state and never
        starts a second execution."""
        problem = task_id_problem(task.task_id, "task.task_id")
        if problem is not None:
            return Refusal(ErrorCode.INVALID_ARGUMENT, problem)
        timeout = self.effective_task_deadline_ms(task.task_timeout_ms)
        if isinstance(timeout, Refusal):
            return timeout
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        running = self._tasks.get(task.task_id)
        if running is not None:
            return TaskSnapshot(
                task_id=task.task_id, slot_id=running.slot.slot_id, state=TaskState.RUNNING
            ), []
        retained = self._retained.snapshot(task.task_id, now_ms)
        if retained is not None:
            return retained, []
        if not slot_id:
            reserved = self.handle_request_task_slot(
                task.task_id, self._config.default_ttl_ms, now_ms
            )
            if isinstance(reserved, Refusal):
                return reserved
            slot_id = reserved.slot_id
        slot = self._slots.by_id(slot_id)
        if (
            slot is None
            or slot.state is not SlotState.ALLOCATED
            or slot.task_id != task.task_id
            or slot.lease_deadline_ms <= now_ms
        ):
            return Refusal(ErrorCode.INVALID_SLOT, why_invalid(slot, slot_id, task.task_id))
        record = Task(task, slot, now_ms + timeout, self._new_token())
        self._tasks[task.task_id] = record
        self._task_deadlines.set(task.task_id, record.deadline_ms)
        self._watches.submitted(task.task_id, now_ms)
        self._directory.submitted(
            task.task_id, task.function_call_config.type, task.function, task.chain
        )
        snapshot = TaskSnapshot(task_id=task.task_id, slot_id=slot_id, state=TaskState.RUNNING)
        return snapshot, [
            PrepareTaskActivation(
                task_id=task.task_id,
                task=task,
                deadline_ms=record.deadline_ms,
                token=record.token,
            )
        ]

    def input_differs(self, task: TaskInput, now_ms: int) -> bool:
        """Whether ``task.task_id`` runs, or ran and is retained (or a tombstone), with
        another input than ``task``'s: a resubmission that SubmitTask answered with the
        earlier task's state. False for the submission that started the task."""
        running = self._tasks.get(task.task_id)
        if running is not None:
            return running.input is not task and input_digest(running.input) != input_digest(task)
        kept = self._retained.input_digest(task.task_id, now_ms)
        return kept is not None and kept != input_digest(task)

    # ---- phases ----------------------------------------------------------------------

    def handle_task_activation_prepared(
        self, task_id: str, token: int, now_ms: int
    ) -> list[WorkerCommand]:
        task = self._answering(task_id, token)
        if task is None:
            return []  # stale: e.g. its lease expired meanwhile (SLOT_LOST)
        if task.slot.lease_deadline_ms <= now_ms:
            # The lease ran out while preparing; the timer tick may not have seen it yet.
            return self._fail(
                task, LeaseLost(), FailureCode.SLOT_LOST, True, SLOT_LOST_TEXT, now_ms
            )
        return self._advance(task, Prepared())

    def handle_task_activation_failed(
        self,
        task_id: str,
        token: int,
        code: FailureCode,
        message: str,
        now_ms: int,
        *,
        retryable: bool | None = None,
    ) -> list[WorkerCommand]:
        """Activation failed; ``retryable`` overrides the code's own (a task naming
        a chain this Worker does not serve fails the same way on every Worker)."""
        task = self._answering(task_id, token)
        if task is None:
            return []
        if retryable is None:
            retryable = is_retryable(code, otherwise=True)
        return self._fail(task, Failed(), code, retryable, message, now_ms)

    def handle_plugin_not_found(
        self, task_id: str, token: int, message: str, now_ms: int
    ) -> list[WorkerCommand]:
        """The adapter has no Call Builder (in the BUILDER phase) or Writer Plugin
        (WRITER) by the name the task gives; ``message`` says what it has.

        The task fails BUILDER_NOT_FOUND or PLUGIN_NOT_FOUND, not retryable (another
        Worker of the same build has the same plug-ins); a missing writer is also
        named in pluginResults."""
        task = self._answering(task_id, token)
        if task is None:
            return []
        phase = task.phase
        code = NOT_FOUND.get(phase)
        if code is None:
            raise BlockxUsageError(f"{phase.value} is not a phase that runs a plug-in")
        handler = task.input.result_handler
        missing = PluginResult(
            plugin_name="" if handler is None else handler.type,
            success=False,
            failure_code=code,
            failure_message=message,
        )
        results = (missing,) if phase is TaskPhase.WRITER and handler is not None else ()
        return self._fail(
            task, Failed(), code, is_retryable(code), message, now_ms, plugin_results=results
        )

    def handle_task_phase_finished(
        self, task_id: str, token: int, outcome: PhaseOutcome, now_ms: int
    ) -> list[WorkerCommand]:
        """The phase started with ``token`` ended with ``outcome``; a stale token (the
        task timed out, was cancelled, ...) is refused with no commands."""
        task = self._answering(task_id, token)
        if task is None:
            return []  # a late answer for a task that has moved on (timed out, ...)
        phase = task.phase
        default = DEFAULT_FAILURE.get(phase)
        if default is None:
            raise BlockxUsageError(f"{phase.value} is not a phase that finishes with an outcome")
        match outcome:
            case PhaseSucceeded():
                return self._succeeded(task, outcome, now_ms)
            case PhaseFailed():
                code = outcome.failure.kind
                if not isinstance(code, FailureCode):
                    raise BlockxUsageError(f"a phase fails with a FailureCode, not {code!r}")
                retryable = is_retryable(code, otherwise=outcome.failure.retryable)
                return self._fail(
                    task,
                    Failed(),
                    code,
                    retryable,
                    outcome.failure.message,
                    now_ms,
                    plugin_results=outcome.plugin_results,
                    call_failures=outcome.call_failures,
                    call_failures_omitted=outcome.call_failures_omitted,
                )
            case PhaseCrashed():
                retryable = is_retryable(default, otherwise=True)
                return self._fail(task, Failed(), default, retryable, outcome.message, now_ms)
            case _:
                assert_never(outcome)

    def _succeeded(self, task: Task, outcome: PhaseSucceeded, now_ms: int) -> list[WorkerCommand]:
        match task.phase:
            case TaskPhase.WRITER:
                result = TaskResult(success=True, plugin_results=outcome.plugin_results)
                return self._converge(task, Written(), TaskState.SUCCEEDED, result, now_ms)
            case TaskPhase.CALLS:
                return self._advance(task, CallsDone())
            case TaskPhase.BUILDER:
                if now_ms >= task.deadline_ms:
                    # The deadline is checked before Calls take an executor slot.
                    return self._time_out(task, now_ms)
                if outcome.call_count == 0:
                    return self._advance(task, BuiltNothing())
                return self._advance(task, Built())
            case _:
                raise BlockxUsageError(f"{task.phase.value} does not finish with an outcome")

    def handle_writer_started(self, task_id: str, token: int, now_ms: int) -> list[WorkerCommand]:
        """The adapter hands the task's outputs to its Writer Plugin now: from here a
        CancelTask lets the write finish (``handle_cancel_task``)."""
        task = self._answering(task_id, token)
        if task is None:
            return []
        self._advance(task, WriterStarted())
        task.writing = True
        return []

    def handle_calls_progress(
        self, task_id: str, progress: CallProgress, now_ms: int
    ) -> list[WorkerCommand]:
        """The adapter counted the task's calls again. Kept for ListTasks; a
        ``PublishProgress`` when the task's progress watchers are to hear it now."""
        task = self._tasks.get(task_id)
        if task is None or task.phase is not TaskPhase.CALLS:
            return []  # a late count of a task that has moved on
        self._directory.counted(task_id, progress)
        if self._progress.counted(task_id, progress, now_ms):
            return [PublishProgress(task_id=task_id, progress=progress)]
        return []

    # ---- cancel (a BlockX addition) --------------------------------------------------

    def handle_cancel_task(
        self, task_id: str, now_ms: int
    ) -> tuple[CancelAnswer, list[WorkerCommand]] | Refusal:
        """CancelTask, by where the task is:

        * submitted, its Writer Plugin not writing yet (PREPARING, BUILDER, CALLS, or
          WRITER waiting for a writer slot): ``AbortTaskWork``, and the task converges
          FAILED / CANCELLED, not retryable, ``CANCELLED_BY_CLIENT`` (CANCELLED);
        * its Writer Plugin writing: nothing changes, it ends with the writer's
          outcome (WRITING);
        * terminal and retained (a tombstone too): its state, CANCELLED when a client
          cancelled it (so twice is the same as once), else FINISHED;
        * reserved, not submitted: NOT_SUBMITTED (nothing runs; the slot frees itself
          at its lease's end, or runs the task if SubmitTask comes first);
        * unknown or expired: NOT_FOUND.

        Answered while draining too: it admits nothing."""
        problem = task_id_problem(task_id)
        if problem is not None:
            return Refusal(ErrorCode.INVALID_ARGUMENT, problem)
        task = self._tasks.get(task_id)
        if task is not None:
            if task.writing:
                running = self._snapshot_of_slot(task.slot)
                return CancelAnswer(outcome=CancelOutcome.WRITING, snapshot=running), []
            result = TaskResult(
                success=False,
                failure_code=FailureCode.CANCELLED,
                retryable=False,
                failure_message=CANCELLED_BY_CLIENT,
            )
            commands: list[WorkerCommand] = [AbortTaskWork(task_id=task_id)]
            commands += self._converge(task, Cancelled(), TaskState.FAILED, result, now_ms)
            snapshot = TaskSnapshot(
                task_id=task_id, slot_id=task.slot.slot_id, state=TaskState.FAILED, result=result
            )
            return CancelAnswer(outcome=CancelOutcome.CANCELLED, snapshot=snapshot), commands
        slot = self._slots.by_task(task_id)
        if slot is not None:
            return Refusal(
                ErrorCode.NOT_SUBMITTED,
                f"task {shown(task_id)} is reserved (slot {slot.slot_id}) but not submitted: "
                "nothing runs to cancel; its slot frees itself when its lease ends in "
                f"{max(0, slot.lease_deadline_ms - now_ms)} ms, unless SubmitTask comes first",
            )
        retained = self._retained.snapshot(task_id, now_ms)
        if retained is None:
            return self._not_found(task_id)
        outcome = (
            CancelOutcome.CANCELLED
            if cancelled_by_client(retained.result)
            else CancelOutcome.FINISHED
        )
        return CancelAnswer(outcome=outcome, snapshot=retained), []

    # ---- watch streams ---------------------------------------------------------------

    def handle_open_watch(
        self, task_ids: Sequence[str], now_ms: int, *, progress: bool = False
    ) -> WatchStream | Refusal:
        """WatchTasks opens: the request checked, what the stream is told first of each
        task, and each task not yet terminal guarded by the stream (see
        ``_watch_stream.py``); ``progress``: the stream asked for call progress."""
        unique = tuple(dict.fromkeys(task_ids))
        if len(unique) > MAX_WATCH_TASK_IDS:
            return Refusal(
                ErrorCode.INVALID_ARGUMENT,
                f"{len(unique)} task_ids in one WatchTasks; at most {MAX_WATCH_TASK_IDS}",
            )
        for task_id in unique:
            problem = task_id_problem(task_id)
            if problem is not None:
                return Refusal(ErrorCode.INVALID_ARGUMENT, f"task_ids: {problem}")
        first: list[WatchStart] = []
        for task_id in unique:
            snapshot = self._lookup(task_id, now_ms)
            if snapshot is None:
                first.append(UnknownTask(task_id=task_id))
                continue
            counts = self._directory.progress(task_id) if progress else None
            first.append(WatchedTask(snapshot=snapshot, progress=counts))
            if not snapshot.state.is_terminal:
                self.watch_attached(task_id, now_ms, progress=progress)
        return WatchStream(unique, first, progress=progress)

    def handle_close_watch(self, stream: WatchStream, now_ms: int) -> None:
        """The stream is gone: the tasks it still waited for lose it as a credential
        (the watch grace may start)."""
        for task_id in stream.pending:
            self.watch_detached(task_id, now_ms, progress=stream.with_progress)

    # ---- watch as run credential -----------------------------------------------------

    def watch_attached(self, task_id: str, now_ms: int, *, progress: bool = False) -> None:
        """A Watch stream on a reserved or submitted task opened; ``progress``: it
        asked for progress updates."""
        if self._slots.by_task(task_id) is None:
            return  # unknown or already terminal: nothing to guard
        self._watches.attached(task_id)
        if progress:
            self._progress.watch_attached(task_id)

    def watch_detached(self, task_id: str, now_ms: int, *, progress: bool = False) -> None:
        """The Worker confirmed a Watch stream on the task is gone."""
        self._watches.detached(task_id, task_id in self._tasks, now_ms)
        if progress:
            self._progress.watch_detached(task_id)

    # ---- timers ----------------------------------------------------------------------

    def tick_timers(self, now_ms: int) -> list[WorkerCommand]:
        """Reclaim expired leases, time out tasks, rule lost watches, publish held
        progress, purge results.

        Costs O(k log n) for the k timers that are due, nothing for the others."""
        out: list[WorkerCommand] = []
        for slot in list(self._slots.expired_leases(now_ms)):
            task = self._tasks.get(slot.task_id)
            if task is not None:
                # Activation is still being prepared: stop it (its answer would be stale).
                out.append(AbortTaskWork(task_id=task.task_id))
                out += self._fail(
                    task, LeaseLost(), FailureCode.SLOT_LOST, True, SLOT_LOST_TEXT, now_ms
                )
            else:
                out.append(SlotExpired(task_id=slot.task_id, slot_id=slot.slot_id))
                self._release(slot, LeaseExpired())
        for task_id in list(self._task_deadlines.pop_due(now_ms)):
            task = self._tasks[task_id]
            out.append(AbortTaskWork(task_id=task_id))
            out += self._time_out(task, now_ms)
        for task_id in list(self._watches.lost(now_ms)):
            out.append(AbortTaskWork(task_id=task_id))
            out += self._fail(
                self._tasks[task_id],
                WatchLost(),
                FailureCode.WATCH_DISCONNECTED,
                False,
                f"no Watch stream for {self._config.watch_disconnect_grace_ms} ms "
                "(WATCH_DISCONNECT_GRACE_MS)",
                now_ms,
            )
        for task_id, progress in self._progress.due(now_ms):
            out.append(PublishProgress(task_id=task_id, progress=progress))
        self._retained.purge(now_ms)
        return out

    def take_purged(self) -> Sequence[str]:
        """The task ids whose retained results were purged since the last call."""
        return self._retained.take_purged()

    def next_deadline_ms(self) -> int | None:
        """The earliest moment tick_timers has work to do (aioquic-style timer).

        Cheap enough to ask after every event: the earliest of five heaps."""
        candidates = (
            self._slots.next_lease_end_ms(),
            self._task_deadlines.earliest_ms(),
            self._watches.next_loss_ms(),
            self._retained.next_purge_ms(),
            self._progress.next_due_ms(),
        )
        return min((d for d in candidates if d is not None), default=None)

    # ---- queries ---------------------------------------------------------------------

    def handle_get_task_result(self, task_id: str, now_ms: int) -> TaskSnapshot | Refusal:
        problem = task_id_problem(task_id)
        if problem is not None:
            return Refusal(ErrorCode.INVALID_ARGUMENT, problem)
        found = self._lookup(task_id, now_ms)
        if found is not None:
            return found
        return self._not_found(task_id)

    def _not_found(self, task_id: str) -> Refusal:
        return Refusal(
            ErrorCode.NOT_FOUND,
            f"task {shown(task_id)} is unknown here, or its result has expired "
            f"(results are kept {self._config.result_retention_ms} ms)",
        )

    def handle_list_tasks(self, query: ListTasksQuery, now_ms: int) -> TaskListing | Refusal:
        """A page of the tasks held here (active, retained, tombstones); see ``_listing``."""
        listing = query_problem(query) or self._directory.page(query, now_ms, self._lookup)
        return Refusal(ErrorCode.INVALID_ARGUMENT, listing) if isinstance(listing, str) else listing

    def recent_failures(self, limit: int, now_ms: int) -> list[ListedTask]:
        """The last ``limit`` failed tasks, newest first, expired ones marked (those
        whose results are gone; at most FAILED_TASKS_KEPT are remembered)."""
        return self._directory.recent_failures(limit, now_ms, self._lookup)

    def running_tasks(self, limit: int, now_ms: int) -> list[RunningTask]:
        """The first ``limit`` submitted tasks not yet converged, oldest first."""
        found: list[RunningTask] = []
        for task_id, task in self._tasks.items():
            if len(found) >= limit:
                break
            listed = self._directory.listed(task_id, now_ms, self._lookup)
            if listed is not None:
                found.append(
                    RunningTask(task=listed, phase=task.phase, deadline_ms=task.deadline_ms)
                )
        return found

    def take_slots_peak(self) -> int:
        """The most slots reserved or running at once since the last take."""
        return self._slots.take_peak_in_use()

    @property
    def slots_peak(self) -> int:
        """What ``take_slots_peak`` would answer now, without starting a new interval."""
        return self._slots.peak_in_use

    def derive_heartbeat(self) -> tuple[int, int, int]:
        """``(taskSlots, reservedSlots, runningTasks)`` from the slot table's counts."""
        slots = self._slots
        return slots.capacity, slots.count(SlotState.ALLOCATED), slots.count(SlotState.RUNNING)

    def retention_stats(self) -> RetentionStats:
        """Retained results, their bytes, tombstones and results dropped so far."""
        return self._retained.stats()

    def slot_states(self) -> list[SlotState]:
        """Every slot's state by index. O(task_slots): for tests and debugging."""
        return self._slots.states()

    def task_phase(self, task_id: str) -> TaskPhase | None:
        task = self._tasks.get(task_id)
        return None if task is None else task.phase

    def call_progress(self, task_id: str) -> CallProgress | None:
        """The task's call counts as last handed in: a running task's, or a retained
        one's last (None before its Calls phase, for a task that made no calls)."""
        return self._directory.progress(task_id)

    def phase_token(self, task_id: str) -> int | None:
        """The token of the task's current activation (None unless it is submitted and
        not terminal): for tests and debugging; the adapter reads it off commands."""
        task = self._tasks.get(task_id)
        return None if task is None else task.token

    def task_deadline_ms(self, task_id: str) -> int | None:
        task = self._tasks.get(task_id)
        return None if task is None else task.deadline_ms
