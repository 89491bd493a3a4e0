"""Task files: a TaskInput written as JSON, in either proto-JSON spelling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blockx_client.models import PluginConfig, Task
from blockx_core.json_text import parse_json


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
            parse_json(config or "{}")
        except ValueError as exc:
            raise TaskFileError(f"{where}.config is a string but not JSON: {exc}") from None
    return PluginConfig(type=value["type"], config=config)


def task_from_dict(data: Any) -> Task:
    """A Task from the proto-JSON spellings (``task_id`` / ``taskId``, ...), with
    ``config`` as an object or as JSON text (as examples/tasks/hello_world.json does)."""
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
        data = parse_json(Path(path).read_text())
    except OSError as exc:
        raise TaskFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TaskFileError(f"{path} is not JSON: {exc}") from None
    try:
        return task_from_dict(data)
    except TaskFileError as exc:
        raise TaskFileError(f"{path}: {exc}") from None
