"""Typed values the client takes and returns (msgspec Structs)."""

from __future__ import annotations

import enum
import json
import uuid
from pathlib import Path
from typing import Any

import msgspec

from blockx_proto import worker_v1


class TaskState(enum.Enum):
    ALLOCATED = "ALLOCATED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    # Only on a terminal update for a task that will never run here
    # (``error`` = "not_found" or "slot_expired").
    UNKNOWN = "UNKNOWN"

    @property
    def is_terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.UNKNOWN)


class Cluster(enum.Enum):
    BLOCK = "block"
    BUNDLE = "bundle"


class PluginConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A Call Builder or Writer Plugin: its ``type`` and its ``config`` (any JSON value)."""

    type: str
    config: Any = msgspec.field(default_factory=dict)

    def config_text(self) -> str:
        return self.config if isinstance(self.config, str) else json.dumps(self.config)


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

    def to_pb(self) -> worker_v1.TaskInput:
        handler = self.result_handler
        return worker_v1.TaskInput(
            task_id=self.task_id,
            function_call_config=worker_v1.FunctionCallConfig(
                type=self.function_call_config.type,
                config=self.function_call_config.config_text(),
            ),
            result_handler=(
                worker_v1.ResultHandler(type=handler.type, config=handler.config_text())
                if handler is not None
                else None
            ),
            task_timeout_ms=self.task_timeout_ms,
        )


class TaskFileError(ValueError):
    """A task file or dict that is not a TaskInput."""


def _pick(data: dict[str, Any], snake: str, camel: str) -> Any:
    if snake in data and camel in data:
        raise TaskFileError(f"both {snake!r} and {camel!r} are given")
    return data.get(snake, data.get(camel))


def _plugin(value: Any, where: str) -> PluginConfig | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str) or not value["type"]:
        raise TaskFileError(f"{where} must be an object with a non-empty 'type'")
    config = value.get("config", {})
    if isinstance(config, str):
        try:
            json.loads(config or "{}")
        except ValueError as exc:
            raise TaskFileError(f"{where}.config is a string but not JSON: {exc}") from None
    return PluginConfig(type=value["type"], config=config)


def task_from_dict(data: Any) -> Task:
    """A Task from the proto-JSON spellings (``task_id`` / ``taskId``, ...), with
    ``config`` as an object or as JSON text, as the seeds' example writes it."""
    if not isinstance(data, dict):
        raise TaskFileError("a task is a JSON object")
    known = {
        "task_id",
        "taskId",
        "function_call_config",
        "functionCallConfig",
        "result_handler",
        "resultHandler",
        "task_timeout_ms",
        "taskTimeoutMs",
    }
    unknown = sorted(set(data) - known)
    if unknown:
        raise TaskFileError(f"unknown field(s) {', '.join(unknown)}")
    fcc = _plugin(_pick(data, "function_call_config", "functionCallConfig"), "functionCallConfig")
    if fcc is None:
        raise TaskFileError("functionCallConfig is required")
    timeout = _pick(data, "task_timeout_ms", "taskTimeoutMs") or 0
    if isinstance(timeout, str) and timeout.isdigit():
        timeout = int(timeout)  # proto-JSON writes int64 as a string
    if not isinstance(timeout, int) or isinstance(timeout, bool):
        raise TaskFileError("taskTimeoutMs must be an integer")
    task_id = _pick(data, "task_id", "taskId") or ""
    if not isinstance(task_id, str):
        raise TaskFileError("taskId must be a string")
    return Task(
        function_call_config=fcc,
        result_handler=_plugin(_pick(data, "result_handler", "resultHandler"), "resultHandler"),
        task_id=task_id,
        task_timeout_ms=timeout,
    )


def load_task_file(path: str | Path) -> Task:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise TaskFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TaskFileError(f"{path} is not JSON: {exc}") from None
    try:
        return task_from_dict(data)
    except TaskFileError as exc:
        raise TaskFileError(f"{path}: {exc}") from None


class Reservation(msgspec.Struct, frozen=True):
    task_id: str
    worker_addr: str
    slot_id: str


class PluginOutput(msgspec.Struct, frozen=True, kw_only=True):
    plugin_name: str
    success: bool
    failure_code: str = ""
    failure_message: str = ""
    result: bytes = b""

    def value(self) -> Any:
        """The plugin's result decoded from JSON (None when empty)."""
        return json.loads(self.result) if self.result else None


class TaskResult(msgspec.Struct, frozen=True, kw_only=True):
    """Where a task ended. ``retryable`` says whether resubmitting (under a new
    task_id) may succeed; ``attempt`` / ``original_task_id`` record retries."""

    task_id: str
    state: TaskState
    worker_addr: str = ""
    success: bool = False
    failure_code: str = ""
    failure_message: str = ""
    retryable: bool = False
    plugin_results: tuple[PluginOutput, ...] = ()
    error: str = ""
    attempt: int = 1
    original_task_id: str = ""

    @property
    def ok(self) -> bool:
        return self.state is TaskState.SUCCEEDED

    def outputs(self) -> Any:
        """The first plugin's result (for ReturnValueResultHandler: the call outputs)."""
        return self.plugin_results[0].value() if self.plugin_results else None


class TaskUpdate(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    state: TaskState
    is_terminal: bool
    worker_addr: str = ""
    timestamp_ms: int = 0
    error: str = ""
    result: TaskResult | None = None


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


class Invocation(msgspec.Struct, frozen=True, kw_only=True):
    """One Sync Invoker call. ``output`` and ``io_trace`` are set by a debug invoke."""

    call_id: str
    success: bool
    value: Any = None
    failure_code: str = ""
    failure_message: str = ""
    retryable: bool = False
    durations: Durations = Durations()
    output: str = ""
    io_trace: tuple[IoTrace, ...] = ()
    # The Function Code View epoch the call ran in.
    code_epoch: int = 0


class Precheck(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    failure_code: str = ""
    message: str = ""
    signature: str = ""
    is_async: bool = False
    code_epoch: int = 0


_STATES = {
    worker_v1.TaskState.ALLOCATED: TaskState.ALLOCATED,
    worker_v1.TaskState.RUNNING: TaskState.RUNNING,
    worker_v1.TaskState.SUCCEEDED: TaskState.SUCCEEDED,
    worker_v1.TaskState.FAILED: TaskState.FAILED,
}


def state_from_pb(state: worker_v1.TaskState) -> TaskState:
    return _STATES.get(state, TaskState.UNKNOWN)


def result_from_pb(
    task_id: str,
    state: worker_v1.TaskState,
    pb: worker_v1.TaskResult | None,
    worker_addr: str = "",
    error: str = "",
) -> TaskResult:
    er = pb.execute_result if pb is not None else None
    return TaskResult(
        task_id=task_id,
        state=state_from_pb(state),
        worker_addr=worker_addr,
        success=bool(pb and pb.success),
        failure_code=er.failure_code if er else "",
        failure_message=er.failure_message if er else "",
        retryable=bool(er and er.retryable),
        plugin_results=tuple(
            PluginOutput(
                plugin_name=p.plugin_name,
                success=p.success,
                failure_code=p.failure_code,
                failure_message=p.failure_message,
                result=p.result,
            )
            for p in (er.plugin_results if er else [])
        ),
        error=error,
    )


def update_from_pb(update: worker_v1.TaskUpdate) -> TaskUpdate:
    result = None
    if update.is_terminal:
        result = result_from_pb(
            update.task_id, update.state, update.result, update.worker_addr, update.error
        )
    return TaskUpdate(
        task_id=update.task_id,
        state=state_from_pb(update.state),
        is_terminal=update.is_terminal,
        worker_addr=update.worker_addr,
        timestamp_ms=update.timestamp_ms,
        error=update.error,
        result=result,
    )
