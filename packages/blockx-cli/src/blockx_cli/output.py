"""Printing for people (rich) or for scripts (``--json``), and the exit codes."""

from __future__ import annotations

import json
from typing import Any, Final, NoReturn

import msgspec
import typer
from rich.console import Console
from rich.markup import escape

from blockx_client import Invocation, TaskResult, TaskUpdate

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1  # the task or function failed
EXIT_USAGE: Final = 2  # bad flags or input
EXIT_SERVICE: Final = 3  # unreachable, unavailable, no slot in time

# Where commands print for people; errors go to stderr.
console = Console()
_errors = Console(stderr=True)


def fail(message: str, code: int, hint: str | None = None) -> NoReturn:
    """One clear line (and a hint) on stderr, then exit; never a traceback."""
    _errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    if hint:
        _errors.print(f"[dim]hint: {escape(hint)}[/]", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


class Output:
    def __init__(self, console: Console, json_mode: bool) -> None:
        self.console = console
        self.json_mode = json_mode

    def emit(self, data: Any) -> None:
        """One JSON document per command in --json mode."""
        print(json.dumps(data, indent=2, sort_keys=True))


def result_dict(result: TaskResult) -> dict[str, Any]:
    return {
        "task_id": result.task_id,
        "state": result.state.value,
        "worker_addr": result.worker_addr,
        "success": result.success,
        "failure_code": result.failure_code,
        "failure_message": result.failure_message,
        "retryable": result.retryable,
        "may_have_run": result.may_have_run,
        "error": result.error,
        "plugin_results": [
            {
                "plugin_name": p.plugin_name,
                "success": p.success,
                "failure_code": p.failure_code,
                "failure_message": p.failure_message,
                "result": p.value(),
            }
            for p in result.plugin_results
        ],
        "call_failures": [msgspec.to_builtins(f) for f in result.call_failures],
        "call_failures_omitted": result.call_failures_omitted,
    }


def update_dict(update: TaskUpdate) -> dict[str, Any]:
    data: dict[str, Any] = {
        "task_id": update.task_id,
        "state": update.state.value,
        "is_terminal": update.is_terminal,
        "worker_addr": update.worker_addr,
        "timestamp_ms": update.timestamp_ms,
        "error": update.error,
    }
    if update.result is not None:
        data["result"] = result_dict(update.result)
    return data


def invocation_dict(result: Invocation) -> dict[str, Any]:
    return {
        "call_id": result.call_id,
        "success": result.success,
        "value": result.value,
        "failure_code": result.failure_code,
        "failure_message": result.failure_message,
        "retryable": result.retryable,
        "durations_us": {
            "queue": result.durations.queue_us,
            "cpu": result.durations.cpu_us,
            "io": result.durations.io_us,
        },
        "output": result.output,
        "io_trace": [
            {
                "backend": t.backend,
                "op": t.op,
                "request": t.request,
                "duration_us": t.duration_us,
                "success": t.success,
                "error": t.error,
            }
            for t in result.io_trace
        ],
    }
