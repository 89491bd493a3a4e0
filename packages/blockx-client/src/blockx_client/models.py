"""Typed values the client takes and returns (msgspec Structs), free of wire types.

``TaskState`` is the one the Worker uses (``blockx_core.task``), and so are a
failed call attempt's summary (``CallFailureSummary``), a task's call progress
(``CallProgress``), a task as ListTasks shows it (``ListedTask``) and a
Worker's description (``WorkerDescription`` with its ``ExecutorState``,
``RunningCall``, ``RunningTask``, ``CallsWaiting`` and ``LoadPoint``);
``_convert`` turns these values into protobuf messages and back.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Callable
from typing import Any, TypeVar, overload

import msgspec

from blockx_client._typed import as_type
from blockx_client.errors import BlockxError
from blockx_core.call_record import CallRecord
from blockx_core.dispatch import CallsWaiting, ExecutorState, RunningCall
from blockx_core.failures import CallFailureKind, ClientFailureCode, FailureCode, PrecheckFailure
from blockx_core.load_series import LoadPoint
from blockx_core.task import CallFailureSummary, PluginConfig, TaskState
from blockx_core.worker import (
    CallProgress,
    CancelOutcome,
    ListedTask,
    RunningTask,
    TaskPhase,
    WorkerDescription,
)

T = TypeVar("T")

__all__ = [
    "CallFailureSummary",
    "CallProgress",
    "CallRecord",
    "CallsWaiting",
    "CancelOutcome",
    "Cancellation",
    "Cluster",
    "ClusterTasks",
    "Durations",
    "ExecutorState",
    "Invocation",
    "IoTrace",
    "ListedTask",
    "LoadPoint",
    "PluginConfig",
    "PluginOutput",
    "Precheck",
    "Reservation",
    "RunningCall",
    "RunningTask",
    "SubmitAnswer",
    "Task",
    "TaskHolders",
    "TaskInputDiffersError",
    "TaskPhase",
    "TaskResult",
    "TaskState",
    "TaskUpdate",
    "UnreachableWorker",
    "WorkerDescription",
]


class Cluster(enum.Enum):
    BLOCK = "block"
    BUNDLE = "bundle"


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """What to run. ``task_id`` is the idempotency key; empty = generate a uuid4."""

    function_call_config: PluginConfig
    result_handler: PluginConfig | None = None
    task_id: str = ""
    task_timeout_ms: int = 0

    @classmethod
    def call_list(
        cls,
        function: str,
        calls: list[list[Any]],
        *,
        handler: str | None = "ReturnValueResultHandler",
        task_id: str = "",
        task_timeout_ms: int = 0,
    ) -> Task:
        """``function`` once per argument list, outputs returned (the common case)."""
        return cls(
            function_call_config=PluginConfig(
                type="CallListCallConfig", config={"function": function, "callList": calls}
            ),
            result_handler=PluginConfig(type=handler, config={}) if handler else None,
            task_id=task_id,
            task_timeout_ms=task_timeout_ms,
        )

    def with_id(self) -> Task:
        """This task with a task_id (a fresh uuid4 when it has none)."""
        return self if self.task_id else msgspec.structs.replace(self, task_id=str(uuid.uuid4()))


class Reservation(msgspec.Struct, frozen=True):
    task_id: str
    worker_addr: str
    slot_id: str


class PluginOutput(msgspec.Struct, frozen=True, kw_only=True):
    """One Result Handler's or Writer Plugin's result, as a Worker reported it.
    ``failure_code`` is None unless it failed (or its code is one this client does
    not know, from a newer Worker: ``failure_message`` still says what failed).

    The Worker's ``blockx_core.task.PluginResult`` has the same fields; the SDK's
    name for it is this one, which adds ``value()``."""

    plugin_name: str
    success: bool
    failure_code: FailureCode | None = None
    failure_message: str = ""
    result: bytes = b""

    def value(self) -> Any:
        """The plugin's result decoded from JSON (None when empty)."""
        return json.loads(self.result) if self.result else None


class TaskResult(msgspec.Struct, frozen=True, kw_only=True):
    """Where a task ended. ``retryable`` says whether resubmitting (under a new
    task_id) may succeed; ``attempt`` / ``original_task_id`` record retries.

    ``failure_code`` is the Worker's (``FailureCode``: ``CALL_FAILED``,
    ``TIMED_OUT``, ...) or the client's (``ClientFailureCode``: ``WORKER_LOST``,
    ``NO_SLOT``, ...); None where nothing failed, and where a newer Worker sent a
    code this client does not know (``failure_message`` still says what failed).
    ``may_have_run`` is False only when the client knows no Worker accepted the task
    (it could not be placed); a Worker's own result, or WORKER_LOST after SubmitTask
    was accepted, says True: its calls and writes may have happened.
    ``call_failures`` lists every failed call attempt of a CALL_FAILED task (the
    first 100; ``call_failures_omitted`` counts the rest).
    """

    task_id: str
    state: TaskState
    worker_addr: str = ""
    success: bool = False
    failure_code: FailureCode | ClientFailureCode | None = None
    failure_message: str = ""
    retryable: bool = False
    plugin_results: tuple[PluginOutput, ...] = ()
    error: str = ""
    attempt: int = 1
    original_task_id: str = ""
    may_have_run: bool = False
    call_failures: tuple[CallFailureSummary, ...] = ()
    call_failures_omitted: int = 0

    @property
    def ok(self) -> bool:
        return self.state is TaskState.SUCCEEDED

    @overload
    def outputs(self) -> Any: ...
    @overload
    def outputs(self, result_type: type[T]) -> T: ...
    def outputs(self, result_type: type[T] | None = None) -> T | Any:
        """The first plugin's result (for ReturnValueResultHandler: the call outputs).

        With ``result_type`` (e.g. ``list[str]``) it is converted to that type and
        typed as such; ResultTypeError when it does not fit."""
        value = self.plugin_results[0].value() if self.plugin_results else None
        if result_type is None:
            return value
        return as_type(value, result_type, what=f"the outputs of task {self.task_id}")


# Called with a task's call progress while ``Client.run`` waits for it.
ProgressCallback = Callable[[CallProgress], None]


class TaskUpdate(msgspec.Struct, frozen=True, kw_only=True):
    """One update of a Watch stream. ``progress`` is set only on a stream opened with
    ``progress=True``: on its progress updates (``is_terminal`` false, state RUNNING)
    and on the snapshot and terminal update of a task whose calls have started."""

    task_id: str
    state: TaskState
    is_terminal: bool
    worker_addr: str = ""
    timestamp_ms: int = 0
    error: str = ""
    result: TaskResult | None = None
    progress: CallProgress | None = None


class Cancellation(msgspec.Struct, frozen=True, kw_only=True):
    """A Worker's answer to cancelling ``task_id``: the ``outcome``, and the task as it
    stands after the request (``state``; ``result`` once terminal). ``detail`` is the
    Worker's own words where it refused (NOT_SUBMITTED)."""

    task_id: str
    worker_addr: str
    outcome: CancelOutcome
    state: TaskState
    result: TaskResult | None = None
    detail: str = ""


class Durations(msgspec.Struct, frozen=True, kw_only=True):
    queue_us: int = 0
    cpu_us: int = 0
    io_us: int = 0


class IoTrace(msgspec.Struct, frozen=True, kw_only=True):
    backend: str
    op: str
    request: str
    duration_us: int
    success: bool
    error: str = ""
    # A read cache hit, a read shared with an identical one in flight, time waited.
    cached: bool = False
    shared: bool = False
    queue_us: int = 0


class Invocation(msgspec.Struct, frozen=True, kw_only=True):
    """One Sync Invoker call. ``output``, ``io_trace`` and ``record`` are set by a
    debug invoke: ``record`` is the call's record (its arguments, code, every IO
    request with its answer and how it ended), the fixture a replay runs offline;
    None when the server records no calls (CALL_RECORD_MAX_BYTES=0).

    ``failure_code`` is the call's own kind (``CallFailureKind``), or the run's
    ``FailureCode`` where no call is to blame (``OUTPUT_BYTES_EXCEEDED``); None when
    it succeeded, and when a newer server sent a code this client does not know
    (``failure_message`` still says what failed)."""

    call_id: str
    success: bool
    value: Any = None
    failure_code: CallFailureKind | FailureCode | None = None
    failure_message: str = ""
    retryable: bool = False
    durations: Durations = Durations()
    output: str = ""
    io_trace: tuple[IoTrace, ...] = ()
    # The Function Code View epoch the call ran in.
    code_epoch: int = 0
    record: CallRecord | None = None


class Precheck(msgspec.Struct, frozen=True, kw_only=True):
    """A function's precheck: ``failure_code`` is None when ``ok`` (and when a newer
    server sent a code this client does not know; ``message`` says what failed)."""

    ok: bool
    failure_code: PrecheckFailure | None = None
    message: str = ""
    signature: str = ""
    is_async: bool = False
    code_epoch: int = 0


class SubmitAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """SubmitTask's answer: RUNNING, or the terminal result of an earlier run of the
    same task_id (``result``; a worker never runs a task_id twice)."""

    task_id: str
    state: TaskState
    slot_id: str
    worker_addr: str
    result: TaskResult | None = None
    # The worker already had this task_id with another input (builder and writer
    # types and configs): ``state`` and ``result`` are that earlier task's.
    input_differs: bool = False


class TaskInputDiffersError(BlockxError):
    """``run`` resubmitted a task_id that the worker already ran (or is running) with
    another input; the worker answers such a submission with the earlier task's
    state and never runs the new input. ``answer`` is that answer (its ``result``
    the earlier task's, when it has ended). Submit the new input under a new
    task_id (leave ``task_id`` empty to have one generated)."""

    def __init__(self, answer: SubmitAnswer) -> None:
        super().__init__(
            f"task {answer.task_id!r} already ran on {answer.worker_addr} with another input "
            f"({answer.state.value}); the worker never runs a task_id twice: submit the "
            "changed task under a new task_id"
        )
        self.answer = answer


class UnreachableWorker(msgspec.Struct, frozen=True, kw_only=True):
    """A registered Worker that did not answer (in time); ``error`` says how."""

    worker_addr: str
    error: str


class ClusterTasks(msgspec.Struct, frozen=True, kw_only=True):
    """The tasks of every Worker asked, oldest first. ``workers`` were asked;
    ``unreachable`` did not answer; ``truncated`` held more than the per-worker
    limit (their oldest are listed)."""

    tasks: tuple[ListedTask, ...]
    workers: tuple[str, ...]
    unreachable: tuple[UnreachableWorker, ...] = ()
    truncated: tuple[str, ...] = ()


class TaskHolders(msgspec.Struct, frozen=True, kw_only=True):
    """Which of the Workers asked know a task id, with what each answered."""

    task_id: str
    results: tuple[TaskResult, ...]
    workers: tuple[str, ...]
    unreachable: tuple[UnreachableWorker, ...] = ()


class WorkerEligibility(msgspec.Struct, frozen=True, kw_only=True):
    """One worker as the coordinator judges it now. ``kind`` is a
    ``blockx_core.coordinator.ReasonKind`` value; ``reason`` says it in words."""

    worker_addr: str
    eligible: bool
    kind: str
    reason: str
    task_slots: int
    used_slots: int
    cpu_fraction: float
    memory_fraction: float
    error_rate: float
    heartbeat_age_ms: int
    breaker_remaining_ms: int
    recent_failures: int


class RefusedWorker(msgspec.Struct, frozen=True, kw_only=True):
    """What one worker answered a refused reservation, or why it was not asked."""

    worker_addr: str
    kind: str
    reason: str


class RecentRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """A ReserveWorkerSlot the coordinator refused (``at_ms`` on its clock), with the
    explanation it carried; ``omitted`` more workers were left out for size."""

    task_id: str
    at_ms: int
    code: str
    message: str
    workers: tuple[RefusedWorker, ...] = ()
    omitted: int = 0


class PlacementReport(msgspec.Struct, frozen=True, kw_only=True):
    """Eligible workers first, in the order the coordinator would choose them;
    ``recent_refusals``: the coordinator's last refusals, newest first."""

    coordinator: str
    view_trusted: bool
    not_ready_reason: str
    now_ms: int
    workers: tuple[WorkerEligibility, ...]
    recent_refusals: tuple[RecentRefusal, ...] = ()

    @property
    def eligible(self) -> tuple[WorkerEligibility, ...]:
        return tuple(w for w in self.workers if w.eligible)
