"""worker.v1 wire messages <-> core values (the only protobuf conversion of the Worker)."""

from __future__ import annotations

from typing import Final

import msgspec

from blockx_core.errors import ErrorCode, Refusal
from blockx_core.task import PluginSpec, TaskInput, TaskResult, TaskState
from blockx_proto import worker_v1
from blockx_server.runtime.json_bounds import check_json

_STATE: Final = {
    TaskState.ALLOCATED: worker_v1.TaskState.ALLOCATED,
    TaskState.RUNNING: worker_v1.TaskState.RUNNING,
    TaskState.SUCCEEDED: worker_v1.TaskState.SUCCEEDED,
    TaskState.FAILED: worker_v1.TaskState.FAILED,
}


def state_to_pb(state: TaskState | None) -> worker_v1.TaskState:
    return worker_v1.TaskState.UNSPECIFIED if state is None else _STATE[state]


def result_to_pb(result: TaskResult | None) -> worker_v1.TaskResult | None:
    if result is None:
        return None
    return worker_v1.TaskResult(
        success=result.success,
        execute_result=worker_v1.ExecuteResult(
            failure_code=result.failure_code.value if result.failure_code else "",
            retryable=result.retryable,
            failure_message=result.failure_message,
            plugin_results=[
                worker_v1.PluginResult(
                    plugin_name=p.plugin_name,
                    success=p.success,
                    failure_code=p.failure_code.value if p.failure_code else "",
                    result=p.result,
                    failure_message=p.failure_message,
                )
                for p in result.plugin_results
            ],
        ),
    )


def _check_json(text: str, field: str) -> Refusal | None:
    # A large config is checked without building its values: it costs a scan.
    try:
        check_json(text or "{}")
    except msgspec.DecodeError as exc:
        return Refusal(ErrorCode.INVALID_ARGUMENT, f"{field} is not valid JSON: {exc}")
    return None


def config_chars(request: worker_v1.SubmitTaskRequest) -> int:
    """How much JSON ``task_from_pb`` checks (decides whether it runs on a thread)."""
    pb = request.task
    if pb is None:
        return 0
    fcc, handler = pb.function_call_config, pb.result_handler
    return len(fcc.config if fcc is not None else "") + len(
        handler.config if handler is not None else ""
    )


def task_from_pb(request: worker_v1.SubmitTaskRequest) -> TaskInput | Refusal:
    """Validate the wire task (``submitTaskFromPB`` in the specification): config must be JSON."""
    pb = request.task
    if pb is None:
        return Refusal(ErrorCode.INVALID_ARGUMENT, "task is required")
    fcc = pb.function_call_config
    if fcc is None or not fcc.type:
        return Refusal(
            ErrorCode.INVALID_ARGUMENT,
            "task.function_call_config.type is required (e.g. CallListCallConfig)",
        )
    bad = _check_json(fcc.config, "task.function_call_config.config")
    if bad is not None:
        return bad
    handler: PluginSpec | None = None
    if pb.result_handler is not None and pb.result_handler.type:
        bad = _check_json(pb.result_handler.config, "task.result_handler.config")
        if bad is not None:
            return bad
        handler = PluginSpec(type=pb.result_handler.type, config=pb.result_handler.config or "{}")
    return TaskInput(
        task_id=pb.task_id,
        function_call_config=PluginSpec(type=fcc.type, config=fcc.config or "{}"),
        result_handler=handler,
        task_timeout_ms=pb.task_timeout_ms,
    )
