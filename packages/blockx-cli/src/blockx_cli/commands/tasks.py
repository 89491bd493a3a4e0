"""The cluster's tasks: ``tasks``, and finding the Worker that holds a task id."""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Final

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from blockx_cli.commands._task_view import STATE_STYLE, count_states
from blockx_cli.options import JsonOpt
from blockx_cli.output import EXIT_FAILED, EXIT_OK, EXIT_SERVICE, EXIT_USAGE, Output, console, fail
from blockx_cli.runner import run
from blockx_cli.settings import Settings, settings_of
from blockx_cli.tables import Column, fitted_table
from blockx_client import (
    Client,
    ClusterTasks,
    ListedTask,
    Registry,
    TaskFilter,
    TaskResult,
    TaskState,
    UnreachableWorker,
)
from blockx_core.registry import DEFAULT_REGISTRY_PREFIXES

app = typer.Typer()

_LISTED_STATES: Final = [s.value for s in TaskState if s is not TaskState.NOT_FOUND]
_UNITS_MS: Final = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration_ms(text: str, flag: str) -> int:
    """``90``, ``90s``, ``1500ms``, ``5m``, ``2h``, ``1d`` as milliseconds (bare: seconds)."""
    match = _DURATION.match(text)
    if match is None:
        fail(f"{flag} {text!r} is not a duration: say e.g. 90s, 5m, 2h or 1500ms", EXIT_USAGE)
    number, unit = match.groups()
    return int(float(number) * _UNITS_MS[unit or "s"])


@app.command()
def tasks(
    ctx: typer.Context,
    *,
    state: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Only tasks in this state; repeat for more ({', '.join(_LISTED_STATES)})."
        ),
    ] = None,
    function: Annotated[
        str | None, typer.Option(help="Only tasks whose config names this root function.")
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(help="Only tasks first seen at least this long ago (90s, 5m, 2h)."),
    ] = None,
    newer_than: Annotated[
        str | None, typer.Option(help="Only tasks first seen at most this long ago (90s, 5m, 2h).")
    ] = None,
    worker: Annotated[
        list[str] | None,
        typer.Option(
            help="Ask only this worker (host:port); repeat for more (default: all registered)."
        ),
    ] = None,
    prefix: Annotated[
        list[str] | None,
        typer.Option(help="Registry prefixes (default: the block and bundle clusters')."),
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many tasks per worker.")] = 10_000,
    timeout: Annotated[float, typer.Option(help="Seconds each worker has to answer.")] = 5.0,
    json_: JsonOpt = False,
) -> None:
    """The tasks of every registered worker: reserved, running and retained results;
    with --state failed also the failures whose results expired (marked expired)."""
    out = Output(console, json_)
    states: list[TaskState] = []
    for name in state or []:
        if name.upper() not in _LISTED_STATES:
            fail(f"--state {name!r}: use one of {', '.join(_LISTED_STATES)}", EXIT_USAGE)
        states.append(TaskState(name.upper()))
    if limit < 1:
        fail(f"--limit must be >= 1 (got {limit})", EXIT_USAGE)
    if timeout <= 0:
        fail(f"--timeout must be > 0 seconds (got {timeout})", EXIT_USAGE)
    task_filter = TaskFilter(
        states=tuple(states),
        function=function or "",
        min_age_ms=parse_duration_ms(older_than, "--older-than") if older_than else 0,
        max_age_ms=parse_duration_ms(newer_than, "--newer-than") if newer_than else 0,
        # Asked for failures: the ones whose results expired too (marked expired).
        include_expired=TaskState.FAILED in states,
    )
    if task_filter.max_age_ms and task_filter.min_age_ms > task_filter.max_age_ms:
        fail("--older-than is longer than --newer-than: no task can be both", EXIT_USAGE)
    settings = settings_of(ctx)
    raise typer.Exit(run(_tasks(settings, out, task_filter, worker, prefix or [], limit, timeout)))


def registry_of(settings: Settings, prefixes: list[str] | None = None) -> Registry:
    return Registry(
        endpoints=tuple(settings.etcd_endpoints()),
        prefixes=tuple(prefixes or DEFAULT_REGISTRY_PREFIXES),
        access=settings.etcd_access(),
        setting=settings.etcd_setting(),
    )


async def _tasks(
    settings: Settings,
    out: Output,
    task_filter: TaskFilter,
    workers: list[str] | None,
    prefixes: list[str],
    limit: int,
    timeout_s: float,
) -> int:
    async with settings.client() as client:
        found = await client.list_tasks(
            task_filter,
            workers=workers,
            registry=registry_of(settings, prefixes),
            limit_per_worker=limit,
            worker_timeout_s=timeout_s,
        )
    now_ms = int(time.time() * 1000)
    if out.json_mode:
        out.emit(
            {
                "tasks": [listed_dict(t, now_ms) for t in found.tasks],
                "workers": list(found.workers),
                "unreachable": [unreachable_dict(u) for u in found.unreachable],
                "truncated": list(found.truncated),
            }
        )
    else:
        out.console.print(_table(found, now_ms, out.console))
        warn_unreachable(found.unreachable)
        for addr in found.truncated:
            out.console.print(
                f"[yellow]{escape(addr)} holds more than {limit} matching tasks; its oldest "
                "are shown (narrow the filters or raise --limit)[/]"
            )
    if found.workers and len(found.unreachable) == len(found.workers):
        return EXIT_SERVICE  # nobody answered: the listing says nothing
    return EXIT_OK


# By rank: what an operator needs to act first (which task, its state, why it
# failed), the rest as the terminal has room.
_COLUMNS: Final = (
    Column(header="task", rank=0),
    Column(header="state", rank=1, narrowest=9),
    Column(header="worker", rank=5),
    Column(header="function", rank=3, narrowest=12),
    Column(header="chain", rank=8),
    Column(header="calls", rank=6),
    Column(header="age", rank=4),
    Column(header="ended", rank=7),
    Column(header="failure", rank=2, narrowest=24),
)


def _table(found: ClusterTasks, now_ms: int, console: Console) -> Table:
    answered = len(found.workers) - len(found.unreachable)
    rows = []
    for t in found.tasks:
        state = Text(t.state.value, style=STATE_STYLE[t.state])
        if t.tombstone:
            state.append(" (outputs dropped)", style="dim")
        if t.expired:
            state.append(" (expired)", style="dim")
        failure = Text(t.failure_code or "")
        if t.failure_summary:
            failure.append(f": {_shortened(t.failure_summary)}")
        if t.call_failures > 1:
            failure.append(f" ({t.call_failures} failed calls)", style="dim")
        cells = {
            "task": Text(t.task_id),
            "state": state,
            "failure": failure,
            "function": Text(t.function or t.call_builder),
            "chain": Text(t.chain),
            "age": Text(_age(now_ms - t.created_ms)),
            "worker": Text(t.worker_addr),
            "calls": Text("" if t.progress is None else t.progress.shown()),
            "ended": Text(_age(now_ms - t.converged_ms) + " ago" if t.converged_ms else ""),
        }
        rows.append([cells[c.header] for c in _COLUMNS])
    return fitted_table(
        console,
        _COLUMNS,
        rows,
        title=f"{len(found.tasks)} task(s) on {answered} worker(s)",
        caption=count_states(t.state for t in found.tasks),
    )


def _shortened(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _age(ms: int) -> str:
    seconds = max(0, ms) / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def listed_dict(t: ListedTask, now_ms: int) -> dict[str, Any]:
    return {
        "task_id": t.task_id,
        "state": t.state.value,
        "worker_addr": t.worker_addr,
        "function": t.function,
        "call_builder": t.call_builder,
        "chain": t.chain,
        "slot_id": t.slot_id,
        "created_ms": t.created_ms,
        "converged_ms": t.converged_ms,
        "age_ms": now_ms - t.created_ms,
        "failure_code": t.failure_code or "",
        "failure_summary": t.failure_summary,
        "tombstone": t.tombstone,
        "expired": t.expired,
        "retryable": t.retryable,
        "call_failures": t.call_failures,
        "calls_done": t.calls_done,
        "calls_total": t.calls_total,
        "calls_total_known": t.calls_total_known,
    }


def unreachable_dict(u: UnreachableWorker) -> dict[str, str]:
    return {"worker_addr": u.worker_addr, "error": u.error}


def warn_unreachable(unreachable: tuple[UnreachableWorker, ...]) -> None:
    for u in unreachable:
        console.print(
            f"[yellow]worker {escape(u.worker_addr)} did not answer: {escape(u.error)}[/]",
            highlight=False,
        )


async def locate(client: Client, settings: Settings, task_id: str) -> TaskResult:
    """The one registered Worker's answer for ``task_id``; a clear exit when no
    worker knows it, or more than one does."""
    # One task id: each worker gets the client's RPC timeout, not the listing's 5 s.
    holders = await client.find_task(
        task_id, registry=registry_of(settings), worker_timeout_s=client.rpc_timeout_s
    )
    if len(holders.results) == 1:
        return holders.results[0]
    if holders.results:
        where = ", ".join(r.worker_addr for r in holders.results)
        fail(
            f"task {task_id} is known to {len(holders.results)} workers ({where})",
            EXIT_USAGE,
            hint="pass --worker HOST:PORT to choose one",
        )
    asked = len(holders.workers)
    missing = f"no registered worker knows task {task_id} (asked {asked})"
    if holders.unreachable:
        down = ", ".join(u.worker_addr for u in holders.unreachable)
        missing += f"; {len(holders.unreachable)} did not answer and may hold it: {down}"
    fail(
        missing,
        EXIT_FAILED,
        hint="results are kept RESULT_RETENTION_MS after a task ends; "
        "`blockx tasks` lists what the workers hold, `blockx tasks --state failed` "
        "also the failures whose results expired",
    )
