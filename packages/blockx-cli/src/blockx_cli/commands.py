"""What each ``blockx`` command does; ``app.py`` only declares the options."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from blockx_cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Output,
    fail,
    invocation_dict,
    result_dict,
    update_dict,
)
from blockx_client import (
    BlockxError,
    Cluster,
    ConnectError,
    Invocation,
    NoSlotError,
    PluginConfig,
    Task,
    TaskFileError,
    TaskNotFoundError,
    TaskResult,
    TaskState,
    TaskUpdate,
    UnavailableError,
    list_workers,
    load_task_file,
)

if TYPE_CHECKING:
    from blockx_cli.app import Settings

_STATE_STYLE = {
    TaskState.ALLOCATED: "yellow",
    TaskState.RUNNING: "cyan",
    TaskState.SUCCEEDED: "green",
    TaskState.FAILED: "red",
    TaskState.UNKNOWN: "magenta",
}


def hint_for(exc: BlockxError) -> str | None:
    if isinstance(exc, ConnectError):
        return "is the cluster running? `blockx dev up` starts one locally"
    if isinstance(exc, NoSlotError):
        return "every worker is busy; try again later or wait longer (--deadline / --timeout)"
    if isinstance(exc, UnavailableError):
        return "the coordinator sees no live worker yet (is etcd up, is a worker registered?)"
    return None


def parse_args(values: list[str]) -> list[Any]:
    """Each argument is a JSON value; a bare word that is not JSON is a string."""
    parsed = []
    for value in values:
        try:
            parsed.append(json.loads(value))
        except ValueError:
            parsed.append(value)
    return parsed


def build_task(
    task_file: Path | None,
    function: str | None,
    calls: list[str] | None,
    handler: str,
    task_id: str | None,
    timeout_ms: int,
) -> Task:
    if task_file is not None and function is not None:
        fail("give a task file or --function, not both", EXIT_USAGE)
    if task_file is not None:
        try:
            task = load_task_file(task_file)
        except TaskFileError as exc:
            fail(str(exc), EXIT_USAGE, hint="see examples/tasks/hello_world.json for the format")
        if task_id:
            task = Task(
                function_call_config=task.function_call_config,
                result_handler=task.result_handler,
                task_id=task_id,
                task_timeout_ms=task.task_timeout_ms,
            )
        return task
    if function is None:
        fail("give a task file or --function NAME with --call '[args]'", EXIT_USAGE)
    call_list = []
    for raw in calls or ["[]"]:
        try:
            args = json.loads(raw)
        except ValueError as exc:
            fail(f"--call {raw!r} is not JSON: {exc}", EXIT_USAGE)
        if not isinstance(args, list):
            fail(f"--call {raw!r} must be a JSON array of arguments, e.g. '[1, \"a\"]'", EXIT_USAGE)
        call_list.append(args)
    return Task(
        function_call_config=PluginConfig(
            type="CallListCallConfig", config={"function": function, "callList": call_list}
        ),
        result_handler=PluginConfig(type=handler) if handler else None,
        task_id=task_id or "",
        task_timeout_ms=timeout_ms,
    )


# ---- commands ----------------------------------------------------------------------------


async def reserve(
    settings: Settings, out: Output, task_id: str | None, cluster: Cluster, within_s: float
) -> None:
    async with settings.client() as client:
        slot = await client.reserve_worker_slot(task_id, cluster=cluster, deadline_s=within_s)
    if out.json_mode:
        out.emit(
            {"task_id": slot.task_id, "worker_addr": slot.worker_addr, "slot_id": slot.slot_id}
        )
    else:
        out.console.print(
            f"reserved slot [bold]{slot.slot_id}[/] on worker [bold]{slot.worker_addr}[/] "
            f"for task {slot.task_id}"
        )


async def submit(
    settings: Settings,
    out: Output,
    task: Task,
    cluster: Cluster | None,
    worker: str | None,
    wait: bool,
    deadline: float | None,
) -> int:
    task = task.with_id()
    async with settings.client() as client:
        if wait:
            result = await client.run(
                task, cluster=cluster, worker_addr=worker, deadline_s=deadline
            )
            _print_result(out, result)
            return EXIT_OK if result.ok else EXIT_FAILED
        answer = await client.place(task, cluster=cluster, worker_addr=worker, deadline_s=deadline)
    if out.json_mode:
        out.emit(
            {
                "task_id": answer.task_id,
                "state": answer.state.value,
                "worker_addr": answer.worker_addr,
                "slot_id": answer.slot_id,
            }
        )
    else:
        out.console.print(
            f"submitted task [bold]{answer.task_id}[/] to worker [bold]{answer.worker_addr}[/]: "
            f"{answer.state.value}\n"
            f"[dim]watch it: blockx watch {answer.task_id} --worker {answer.worker_addr}[/]"
        )
    return EXIT_OK


async def get_result(settings: Settings, out: Output, task_id: str, worker: str) -> int:
    async with settings.client() as client:
        try:
            result = await client.get_task_result(task_id, worker_addr=worker)
        except TaskNotFoundError:
            # Not an error of the client: results are kept RESULT_RETENTION_MS only.
            if out.json_mode:
                out.emit({"task_id": task_id, "state": "NOT_FOUND", "worker_addr": worker})
            else:
                out.console.print(
                    f"task {task_id} is not known to {worker}: never submitted there, or its "
                    "result has expired (kept RESULT_RETENTION_MS)"
                )
            return EXIT_FAILED
    _print_result(out, result)
    if result.state is TaskState.FAILED:
        return EXIT_FAILED
    return EXIT_OK


async def watch(settings: Settings, out: Output, task_ids: list[str], worker: str) -> int:
    latest: dict[str, TaskUpdate] = {}
    started = time.monotonic()
    async with settings.client() as client:
        if out.json_mode:
            async for update in client.watch_tasks(task_ids, worker_addr=worker):
                latest[update.task_id] = update
            out.emit(
                {
                    "updates": [
                        update_dict(latest[t]) for t in dict.fromkeys(task_ids) if t in latest
                    ]
                }
            )
        else:
            progress = Progress(
                TextColumn("[bold]tasks"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            bar = progress.add_task("tasks", total=len(set(task_ids)))
            with Live(console=out.console, refresh_per_second=8) as live:
                async for update in client.watch_tasks(task_ids, worker_addr=worker):
                    latest[update.task_id] = update
                    done = sum(1 for u in latest.values() if u.is_terminal)
                    progress.update(bar, completed=done)
                    live.update(Group(_watch_table(latest, started), progress))
    failed = [u for u in latest.values() if not (u.result is not None and u.result.ok)]
    return EXIT_FAILED if failed else EXIT_OK


def _watch_table(latest: dict[str, TaskUpdate], started: float) -> Table:
    table = Table(title=f"watching {len(latest)} task(s)", expand=False)
    for column in ("task", "state", "worker", "detail"):
        table.add_column(column, no_wrap=column != "detail")
    counts: dict[str, int] = {}
    for update in latest.values():
        counts[update.state.value] = counts.get(update.state.value, 0) + 1
        style = _STATE_STYLE[update.state]
        detail = update.error
        if update.result is not None and update.result.failure_code:
            detail = f"{update.result.failure_code}: {update.result.failure_message[:60]}"
        table.add_row(
            update.task_id, f"[{style}]{update.state.value}[/]", update.worker_addr, detail
        )
    table.caption = "  ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    return table


def _print_result(out: Output, result: TaskResult) -> None:
    if out.json_mode:
        out.emit(result_dict(result))
        return
    style = _STATE_STYLE[result.state]
    out.console.print(
        f"task [bold]{result.task_id}[/] on {result.worker_addr}: [{style}]{result.state.value}[/]"
    )
    if result.failure_code:
        out.console.print(
            f"  failure: [red]{result.failure_code}[/] (retryable={result.retryable})",
            highlight=False,
        )
        if result.failure_message:
            out.console.print(result.failure_message, highlight=False, markup=False)
    if result.error:
        out.console.print(f"  {result.error}")
    for plugin in result.plugin_results:
        value = plugin.value()
        shown = json.dumps(value) if value is not None else ""
        out.console.print(f"  {plugin.plugin_name}: {shown}", highlight=False, markup=False)


async def invoke(
    settings: Settings, out: Output, function: str, args: list[Any], debug: bool, timeout_ms: int
) -> int:
    async with settings.client() as client:
        handle = client.function(function)
        result = await (
            handle.debug(*args, timeout_ms=timeout_ms)
            if debug
            else handle.invoke(*args, timeout_ms=timeout_ms)
        )
    if out.json_mode:
        out.emit(invocation_dict(result))
    else:
        _print_invocation(out, function, args, result)
    return EXIT_OK if result.success else EXIT_FAILED


def _print_invocation(out: Output, function: str, args: list[Any], result: Invocation) -> None:
    d = result.durations
    call = f"{function}({', '.join(json.dumps(a) for a in args)})"
    if result.success:
        out.console.print(f"{call} = {json.dumps(result.value)}", highlight=False, markup=False)
    else:
        out.console.print(
            f"{call} failed: [red]{result.failure_code}[/] (retryable={result.retryable})"
        )
        out.console.print(result.failure_message, highlight=False, markup=False)
    out.console.print(
        f"[dim]call {result.call_id}: queue {d.queue_us} µs, cpu {d.cpu_us} µs, io {d.io_us} µs[/]"
    )
    if result.output:
        out.console.print("[bold]output[/]")
        out.console.print(result.output.rstrip(), highlight=False, markup=False)
    if result.io_trace:
        table = Table(title="IO trace")
        for column in ("backend", "op", "request", "µs", "ok"):
            table.add_column(column)
        for t in result.io_trace:
            table.add_row(
                t.backend, t.op, t.request, str(t.duration_us), "yes" if t.success else t.error
            )
        out.console.print(table)


async def precheck(
    settings: Settings, out: Output, function: str, args: list[Any], check_args: bool
) -> int:
    async with settings.client() as client:
        result = await client.function(function).precheck(*args, check_args=check_args)
    if out.json_mode:
        out.emit(
            {
                "ok": result.ok,
                "failure_code": result.failure_code,
                "message": result.message,
                "signature": result.signature,
                "is_async": result.is_async,
            }
        )
    elif result.ok:
        kind = "async def" if result.is_async else "def"
        out.console.print(f"[green]ok[/]: {kind} {function}{result.signature}", highlight=False)
    else:
        out.console.print(f"[red]{result.failure_code}[/]: {result.message}", highlight=False)
    return EXIT_OK if result.ok else EXIT_FAILED


async def workers(settings: Settings, out: Output, prefixes: list[str]) -> int:
    endpoints = [e.strip() for e in settings.etcd.split(",") if e.strip()]
    found = await list_workers(endpoints, prefixes)
    now_ms = int(time.time() * 1000)
    if out.json_mode:
        out.emit(
            [
                {
                    "worker_addr": w.worker_addr,
                    "prefix": w.prefix,
                    "task_slots": w.task_slots,
                    "reserved_slots": w.reserved_slots,
                    "running_tasks": w.running_tasks,
                    "cpu_percent": w.cpu_percent,
                    "memory_percent": w.memory_percent,
                    "error_rate": w.error_rate,
                    "heartbeat_age_ms": now_ms - w.last_heartbeat_ms,
                }
                for w in found
            ]
        )
        return EXIT_OK
    table = Table(title=f"{len(found)} worker(s) in {', '.join(prefixes)}")
    for column in ("worker", "registry", "slots used", "cpu", "mem", "errors", "heartbeat"):
        table.add_column(column, no_wrap=column in ("worker", "slots used"))
    for w in found:
        table.add_row(
            w.worker_addr,
            w.prefix,
            f"{_bar(w.used_slots, w.task_slots)} {w.used_slots}/{w.task_slots}",
            f"{w.cpu_percent:.0%}",
            f"{w.memory_percent:.0%}",
            f"{w.error_rate:.0%}",
            f"{(now_ms - w.last_heartbeat_ms) / 1000:.1f} s ago",
        )
    out.console.print(table)
    return EXIT_OK


def _bar(used: int, total: int, width: int = 8) -> str:
    filled = 0 if total <= 0 else round(width * min(used, total) / total)
    return "█" * filled + "·" * (width - filled)
