"""How the task commands show tasks: a result (with its failed calls), the live
watch table with each task's calls, a ``watch --json`` line, and the calls of a
task ``submit --wait`` waits for."""

from __future__ import annotations

import collections
import contextlib
import json
from collections.abc import Iterable, Iterator
from typing import Any, Final

import msgspec
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from blockx_cli.output import Output, print_whole, result_dict, update_dict
from blockx_cli.tables import Column, fitted_table
from blockx_client import CallProgress, ProgressCallback, TaskResult, TaskState, TaskUpdate

# What NOT_FOUND means, wherever the CLI shows it.
NOT_KNOWN: Final = (
    "not known to the worker: never submitted there, the worker restarted since, or "
    "its result has expired (kept RESULT_RETENTION_MS)"
)

# The failed calls print_result shows; the rest are counted (--json has them all).
_SHOWN_CALL_FAILURES: Final = 20

STATE_STYLE: Final = {
    TaskState.ALLOCATED: "yellow",
    TaskState.RUNNING: "cyan",
    TaskState.SUCCEEDED: "green",
    TaskState.FAILED: "red",
    TaskState.NOT_FOUND: "magenta",
}


@contextlib.contextmanager
def progress_line(out: Output, task_id: str) -> Iterator[ProgressCallback]:
    """What ``submit --wait`` shows of the calls while it waits: a live line on a
    terminal, or a line on stderr per update otherwise (stdout keeps only the
    result, for scripts); nothing with --json."""
    if out.json_mode:
        yield lambda progress: None
        return
    if not out.console.is_terminal:

        def print_line(progress: CallProgress) -> None:
            typer.echo(f"task {task_id}: calls {progress.shown()}", err=True)

        yield print_line
        return
    with out.console.status(f"task {task_id}: waiting for its calls") as status:

        def update_status(progress: CallProgress) -> None:
            status.update(f"task {task_id}: calls {progress.shown()}")

        yield update_status


def watch_line(update: TaskUpdate) -> dict[str, Any]:
    """An update as ``watch --json`` prints it: ``update_dict``, and its progress."""
    data = update_dict(update)
    if update.progress is not None:
        data["progress"] = msgspec.structs.asdict(update.progress)
    return data


def count_states(states: Iterable[TaskState]) -> str:
    """A table's caption: how many tasks in each state."""
    counts = collections.Counter(state.value for state in states)
    return "  ".join(f"{state}: {n}" for state, n in sorted(counts.items()))


# By rank: the watch table keeps the task, its state and what happened first.
_WATCH_COLUMNS: Final = (
    Column(header="task", rank=0),
    Column(header="state", rank=0),
    Column(header="worker", rank=3),
    Column(header="calls", rank=1),
    Column(header="detail", rank=2, narrowest=24),
)


def watch_table(
    latest: dict[str, TaskUpdate], calls: dict[str, CallProgress], console: Console
) -> Table:
    rows = []
    for update in latest.values():
        detail = NOT_KNOWN if update.state is TaskState.NOT_FOUND else update.error
        if update.result is not None and update.result.failure_code:
            detail = f"{update.result.failure_code}: {update.result.failure_message[:60]}"
        shown = calls.get(update.task_id)
        rows.append(
            [
                Text(update.task_id),
                Text(update.state.value, style=STATE_STYLE[update.state]),
                Text(update.worker_addr),
                Text("" if shown is None else f"calls {shown.shown()}"),
                Text(detail),
            ]
        )
    return fitted_table(
        console,
        _WATCH_COLUMNS,
        rows,
        title=f"watching {len(latest)} task(s)",
        caption=count_states(u.state for u in latest.values()),
    )


def print_result(out: Output, result: TaskResult) -> None:
    if out.json_mode:
        out.emit(result_dict(result))
        return
    style = STATE_STYLE[result.state]
    out.console.print(
        f"task [bold]{escape(result.task_id)}[/] on {escape(result.worker_addr)}: "
        f"[{style}]{result.state.value}[/]"
    )
    if result.failure_code:
        out.console.print(
            f"  failure: [red]{result.failure_code}[/] (retryable={result.retryable}, "
            f"may_have_run={result.may_have_run})",
            highlight=False,
        )
        if result.failure_message:
            out.console.print(result.failure_message, highlight=False, markup=False)
        _print_call_failures(out, result)
    if result.error:
        out.console.print(f"  {result.error}", highlight=False, markup=False)
    for plugin in result.plugin_results:
        value = plugin.value()
        shown = json.dumps(value) if value is not None else ""
        print_whole(out.console, f"  {plugin.plugin_name}: {shown}")


def _print_call_failures(out: Output, result: TaskResult) -> None:
    failures = result.call_failures
    if not failures:
        return
    total = len(failures) + result.call_failures_omitted
    out.console.print(f"  failed calls ({total}):", highlight=False)
    for f in failures[:_SHOWN_CALL_FAILURES]:
        which = f"#{f.root_index}" if f.root_index >= 0 else "sub-call"
        again = ", retried" if f.retried else ""
        first_line = f.message.strip().split("\n", 1)[0]
        out.console.print(
            f"    {which} {f.function} (attempt {f.attempt}{again}): {f.kind}: {first_line}",
            highlight=False,
            markup=False,
        )
    more = total - min(len(failures), _SHOWN_CALL_FAILURES)
    if more:
        out.console.print(f"    ... and {more} more (--json lists the first 100)", highlight=False)
