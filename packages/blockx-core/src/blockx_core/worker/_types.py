"""States, events, outcomes and commands of the WorkerCore."""

from __future__ import annotations

import enum

import msgspec

from blockx_core.errors import BlockxUsageError
from blockx_core.failures import Failure
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


class InvalidTransition(BlockxUsageError):
    """A (state, event) pair a transition table does not allow: a bug in the caller."""


# ---- task phase events (the keys of the phase transition table) ----------------------


class Prepared(msgspec.Struct, frozen=True):
    """The adapter prepared the activation (code epoch pinned, IO scope open)."""


class Built(msgspec.Struct, frozen=True):
    """The Call Builder gave calls (or a stream of them)."""


class BuiltNothing(msgspec.Struct, frozen=True):
    """The Call Builder gave an empty call list: the Calls phase is skipped."""


class CallsDone(msgspec.Struct, frozen=True):
    """Every call of the task succeeded."""


class WriterStarted(msgspec.Struct, frozen=True):
    """The Writer Plugin has the outputs: from now a CancelTask lets it finish."""


class Written(msgspec.Struct, frozen=True):
    """The Writer phase succeeded: the task converges SUCCEEDED."""


class Failed(msgspec.Struct, frozen=True):
    """Activation or the running phase failed, or its plug-in is missing."""


class TimedOut(msgspec.Struct, frozen=True):
    """The task's deadline passed."""


class Cancelled(msgspec.Struct, frozen=True):
    """A client cancelled the task (CancelTask)."""


class WatchLost(msgspec.Struct, frozen=True):
    """No Watch stream for WATCH_DISCONNECT_GRACE_MS."""


class LeaseLost(msgspec.Struct, frozen=True):
    """The slot's lease ran out before the task was activated (SLOT_LOST)."""


PhaseEvent = (
    Prepared
    | Built
    | BuiltNothing
    | CallsDone
    | WriterStarted
    | Written
    | Failed
    | TimedOut
    | Cancelled
    | WatchLost
    | LeaseLost
)


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


class CancelOutcome(enum.StrEnum):
    """What a CancelTask found, from the task's state after it (so a second CancelTask
    answers what the first did)."""

    # The task ended FAILED / CANCELLED by a client: by this request, or an earlier one.
    CANCELLED = "CANCELLED"
    # The task had ended before, otherwise (SUCCEEDED, or FAILED for another reason).
    FINISHED = "FINISHED"
    # Its Writer Plugin is writing: the write is not interrupted, and the task ends
    # with the writer's outcome.
    WRITING = "WRITING"
    # Reserved, not submitted (ALLOCATED): nothing runs to cancel; its slot frees
    # itself when its lease ends, unless the task is submitted first. The core
    # refuses such a cancel (``ErrorCode.NOT_SUBMITTED``); this is what a client
    # reads for that refusal, so no CancelAnswer ever carries it.
    NOT_SUBMITTED = "NOT_SUBMITTED"


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


class PhaseSucceeded(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A phase did its work."""

    plugin_results: tuple[PluginResult, ...] = ()
    # Builder phase: how many calls it built, when known up front. Zero skips the Calls
    # phase (an empty call list takes no executor slot); None always runs it.
    call_count: int | None = None


class PhaseFailed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A phase failed with a task failure (``failure.kind`` is a ``FailureCode``;
    ``failure.retryable`` counts where ``RETRYABLE`` leaves it to the failure:
    BUILDER_FAILED, PLUGIN_FAILED)."""

    failure: Failure
    plugin_results: tuple[PluginResult, ...] = ()
    # Calls phase: every failed call attempt (bounded) and how many more.
    call_failures: tuple[CallFailureSummary, ...] = ()
    call_failures_omitted: int = 0


class PhaseCrashed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The phase's work raised unexpectedly (a bug in the Worker): the task fails with
    the phase's own failure code (BUILDER_FAILED, CALL_FAILED, PLUGIN_FAILED),
    retryable where that code lets the failure decide."""

    message: str


PhaseOutcome = PhaseSucceeded | PhaseFailed | PhaseCrashed


# ---- commands ------------------------------------------------------------------------


class PrepareTaskActivation(msgspec.Struct, frozen=True, kw_only=True):
    """Resolve and pin the code epoch, create the task's IO scope; answer with
    ``handle_task_activation_*`` and ``token``."""

    task_id: str
    task: TaskInput
    deadline_ms: int
    # This activation's token: the answer hands it back, so a stale answer is refused.
    token: int


class StartBuilderPhase(msgspec.Struct, frozen=True, kw_only=True):
    """Run the task's Call Builder. If the adapter has no builder by that name it
    answers ``handle_plugin_not_found`` instead of running a phase."""

    task_id: str
    token: int


class StartCallPhase(msgspec.Struct, frozen=True, kw_only=True):
    """Run the task's calls; answer ``handle_task_phase_finished`` with ``token``."""

    task_id: str
    token: int


class StartWriterPhase(msgspec.Struct, frozen=True, kw_only=True):
    """Run the task's Writer Plugin (none: the phase succeeds with no pluginResults).
    A writer the adapter lacks is answered with ``handle_plugin_not_found``."""

    task_id: str
    token: int


PhaseStart = StartBuilderPhase | StartCallPhase | StartWriterPhase


class AbortTaskWork(msgspec.Struct, frozen=True, kw_only=True):
    """Stop whatever the adapter is running for the task (its Builder, its calls, which
    get CancelCall, or its Writer Plugin's wait for a writer slot); the core has
    converged the task, and refuses whatever the stopped phase still answers."""

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
