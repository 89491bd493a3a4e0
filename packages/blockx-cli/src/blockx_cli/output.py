"""Printing for people (rich) or for scripts (``--json``), and the exit codes.

On a terminal, lines wrap at its width and tables fit it (``blockx_cli.tables``).
Anywhere else (a pipe, a file) nothing is wrapped, cropped or padded: each line is
printed whole, however long, so ``grep`` and scripts see what was said. JSON never
goes through rich: ``Output.emit`` prints it as it is, whatever the output."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final, NoReturn

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

if TYPE_CHECKING:
    # Types only: ``blockx chain`` starts without loading the cluster's client.
    from blockx_client import Invocation, TaskResult, TaskUpdate

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1  # the task or function failed
EXIT_USAGE: Final = 2  # bad flags or input
EXIT_SERVICE: Final = 3  # unreachable, unavailable, no slot in time

# The width of a console that is not a terminal: no line is ever that long.
_UNBOUNDED = 1 << 20


class CliConsole(Console):
    """A rich Console as wide as its terminal, or unbounded when it writes to
    something else (``COLUMNS`` is then ignored: a pipe has no width)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self.is_terminal:
            return size
        return ConsoleDimensions(_UNBOUNDED, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self.width, self.height = new_size


# Where commands print for people; errors go to stderr.
console = CliConsole()
_errors = CliConsole(stderr=True)


def print_whole(console: Console, text: str, *, style: str | None = None) -> None:
    """A line people copy (a command, a JSON value): never broken by rich, on a
    terminal either (the terminal folds it for the eye, a copy gets it whole)."""
    console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)


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
    import msgspec  # loaded by the client that made ``result``; not by start-up

    return {
        "task_id": result.task_id,
        "state": result.state.value,
        "worker_addr": result.worker_addr,
        "success": result.success,
        # "" where there is none, as the Worker's wire spells it.
        "failure_code": result.failure_code or "",
        "failure_message": result.failure_message,
        "retryable": result.retryable,
        "may_have_run": result.may_have_run,
        "error": result.error,
        "plugin_results": [
            {
                "plugin_name": p.plugin_name,
                "success": p.success,
                "failure_code": p.failure_code or "",
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
        "failure_code": result.failure_code or "",
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
