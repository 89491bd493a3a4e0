"""States, events, outcomes and commands of the WorkerCore."""

from __future__ import annotations

import enum

import msgspec

from blockx_core.failures import FailureCode
from blockx_core.task import CallFailureSummary, PluginResult, TaskInput, TaskResult, TaskState
from blockx_core.worker._progress import CallProgress


class SlotState(enum.Enum):
    FREE = "FREE"
    ALLOCATED = "ALLOCATED"
    RUNNING = "RUNNING"


class TaskPhase(enum.Enum):
    """Internal phases; all but TERMINAL show as RUNNING to clients."""

    PREPARING = "PREPARING"
    BUILDER = "BUILDER"
    CALLS = "CALLS"
    WRITER = "WRITER"
    TERMINAL = "TERMINAL"


# ---- slot events (the keys of the transition table) ----------------------------------


class Allocate(msgspec.Struct, frozen=True):
    pass


class Activate(msgspec.Struct, frozen=True):
    pass


class LeaseExpired(msgspec.Struct, frozen=True):
    pass


class Converge(msgspec.Struct, frozen=True):
    pass


SlotEvent = Allocate | Activate | LeaseExpired | Converge


class InvalidTransition(Exception):
    """A (state, event) pair the slot table does not allow: a bug in the caller."""


# ---- answers -----------------------------------------------------------------------


class TaskSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    slot_id: str
    state: TaskState
    lease_deadline_ms: int = 0
    result: TaskResult | None = None
    # A tombstone's answer: the task ran and ended in ``state``, but its outputs
    # were dropped for RESULT_RETENTION_MAX_BYTES (``result`` says so, without them).
    outputs_dropped: bool = False


class CancelOutcome(enum.Enum):
    """What a CancelTask found, from the task's state after it (so a second CancelTask
    answers what the first did)."""

    # The task ended FAILED / CANCELLED by a client: by this request, or an earlier one.
    CANCELLED = "CANCELLED"
    # The task had ended before, otherwise (SUCCEEDED, or FAILED for another reason).
    FINISHED = "FINISHED"
    # Its Writer Plugin is writing: the write is not interrupted, and the task ends
    # with the writer's outcome.
    WRITING = "WRITING"


class CancelAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """CancelTask's answer: the outcome, and the task as it stands after the request
    (terminal with its result, or RUNNING while its writer writes)."""

    outcome: CancelOutcome
    snapshot: TaskSnapshot


class RetentionStats(msgspec.Struct, frozen=True, kw_only=True):
    """What the retention holds now, and how many results it dropped so far."""

    results: int
    retained_bytes: int
    tombstones: int
    dropped: int


class PhaseOutcome(msgspec.Struct, frozen=True, kw_only=True):
    success: bool
    failure_code: FailureCode | None = None
    # Used where the failure code alone does not decide it (BUILDER_FAILED, PLUGIN_FAILED).
    retryable: bool = False
    message: str = ""
    plugin_results: tuple[PluginResult, ...] = ()
    # Builder phase: how many calls it built, when known up front. Zero skips the Calls
    # phase (an empty call list takes no executor slot); None always runs it.
    call_count: int | None = None
    # Calls phase, failed: every failed call attempt (bounded) and how many more.
    call_failures: tuple[CallFailureSummary, ...] = ()
    call_failures_omitted: int = 0


# ---- commands ------------------------------------------------------------------------


class PrepareTaskActivation(msgspec.Struct, frozen=True, kw_only=True):
    """Resolve and pin the code epoch, create the task's IO scope."""

    task_id: str
    task: TaskInput
    deadline_ms: int


class StartBuilderPhase(msgspec.Struct, frozen=True, kw_only=True):
    """Run the task's Call Builder. If the adapter has no builder by that name it
    answers ``handle_plugin_not_found`` instead of running a phase."""

    task_id: str


class StartCallPhase(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str


class StartWriterPhase(msgspec.Struct, frozen=True, kw_only=True):
    """Run the task's Writer Plugin (none: the phase succeeds with no pluginResults).
    A writer the adapter lacks is answered with ``handle_plugin_not_found``."""

    task_id: str


class AbortTaskWork(msgspec.Struct, frozen=True, kw_only=True):
    """Stop whatever the adapter is running for the task (its Builder, its calls, which
    get CancelCall, or its Writer Plugin's wait for a writer slot); the core has
    converged the task, so the stopped phase reports nothing."""

    task_id: str


class TaskConverged(msgspec.Struct, frozen=True, kw_only=True):
    """Terminal: the slot is free again; tell subscribers, clean up the task's runtime."""

    task_id: str
    slot_id: str
    state: TaskState
    result: TaskResult
    # The last counts of its Calls phase; None when the task never reached it.
    progress: CallProgress | None = None


class PublishProgress(msgspec.Struct, frozen=True, kw_only=True):
    """Tell the task's Watch streams that asked for progress how far its calls are."""

    task_id: str
    progress: CallProgress


class SlotExpired(msgspec.Struct, frozen=True, kw_only=True):
    """An ALLOCATED slot was reclaimed without a submission."""

    task_id: str
    slot_id: str


WorkerCommand = (
    PrepareTaskActivation
    | StartBuilderPhase
    | StartCallPhase
    | StartWriterPhase
    | AbortTaskWork
    | TaskConverged
    | SlotExpired
    | PublishProgress
)
