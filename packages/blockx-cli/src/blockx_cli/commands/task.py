"""Tasks: ``reserve``, ``submit``, ``watch``, ``get-result``, ``cancel``.

``watch``, ``get-result`` and ``cancel`` without ``--worker`` ask every registered
Worker which one holds each task id (``commands/tasks.py``)."""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Final

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from blockx_cli.addresses import host_port_option
from blockx_cli.commands._task_view import (
    NOT_KNOWN,
    STATE_STYLE,
    print_result,
    progress_line,
    watch_line,
    watch_table,
)
from blockx_cli.commands.tasks import locate
from blockx_cli.options import JsonOpt, task_id_option
from blockx_cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Output,
    console,
    fail,
    print_whole,
    result_dict,
)
from blockx_cli.runner import TASK_FILE_HINT, run
from blockx_cli.settings import Settings, settings_of
from blockx_client import (
    CallProgress,
    CancelOutcome,
    Client,
    Cluster,
    PluginConfig,
    SubmitAnswer,
    Task,
    TaskFileError,
    TaskInputDiffersError,
    TaskNotFoundError,
    TaskResult,
    TaskState,
    TaskUpdate,
    load_task_file,
)
from blockx_core.ids import shown
from blockx_core.json_text import parse_json

app = typer.Typer()

ClusterOpt = Annotated[
    Cluster | None, typer.Option(case_sensitive=False, help="Override the task's cluster routing.")
]
FindWorkerOpt = Annotated[
    str | None,
    typer.Option(
        callback=host_port_option,
        help="The worker's host:port.",
        show_default="ask every registered worker",
    ),
]


@app.command()
def reserve(
    ctx: typer.Context,
    *,
    task_id: Annotated[
        str | None,
        typer.Option(callback=task_id_option, help="Idempotency key.", show_default="a uuid4"),
    ] = None,
    cluster: Annotated[Cluster, typer.Option(case_sensitive=False)] = Cluster.BLOCK,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 30.0,
    json_: JsonOpt = False,
) -> None:
    """Reserve a slot (ReserveWorkerSlot), backing off while every worker is full."""
    out = Output(console, json_)
    run(_reserve(settings_of(ctx), out, task_id, cluster, timeout))


@app.command()
def submit(
    ctx: typer.Context,
    task_file: Annotated[
        Path | None, typer.Argument(help="A TaskInput JSON file (camelCase or snake_case).")
    ] = None,
    *,
    function: Annotated[str | None, typer.Option(help="CallListCallConfig: the function.")] = None,
    call: Annotated[
        list[str] | None,
        typer.Option(help="A JSON array of arguments; repeat for more calls, e.g. --call '[1]'."),
    ] = None,
    handler: Annotated[
        str, typer.Option(help="Result handler type ('' for none).")
    ] = "ReturnValueResultHandler",
    task_id: Annotated[
        str | None,
        typer.Option(callback=task_id_option, help="Idempotency key.", show_default="a uuid4"),
    ] = None,
    timeout_ms: Annotated[int, typer.Option(help="task_timeout_ms (0 = the worker default).")] = 0,
    cluster: ClusterOpt = None,
    worker: Annotated[
        str | None,
        typer.Option(
            callback=host_port_option,
            help="Submit straight to this worker (it reserves inline).",
        ),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Watch the task to its end.")] = False,
    deadline: Annotated[float | None, typer.Option(help="Seconds to wait for a slot.")] = None,
    json_: JsonOpt = False,
) -> None:
    """Submit a task from a JSON file or from --function/--call; --wait to see its end."""
    out = Output(console, json_)
    task = build_task(task_file, function, call, handler, task_id, timeout_ms)
    code = run(_submit(settings_of(ctx), out, task, cluster, worker, wait, deadline))
    raise typer.Exit(code)


@app.command()
def watch(
    ctx: typer.Context,
    task_ids: Annotated[
        list[str], typer.Argument(callback=task_id_option, help="Task ids to watch.")
    ],
    *,
    worker: FindWorkerOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Watch tasks to their end: a live table with states, calls done and totals.

    With --json, one JSON object per line for each update, as it happens: the
    snapshots, the call-progress updates (is_terminal false, with a "progress"
    object: calls_done, calls_total, total_known, calls_failed) and the terminal
    updates."""
    out = Output(console, json_)
    raise typer.Exit(run(_watch(settings_of(ctx), out, task_ids, worker)))


@app.command("get-result")
def get_result(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(callback=task_id_option)],
    *,
    worker: FindWorkerOpt = None,
    json_: JsonOpt = False,
) -> None:
    """A task's state and result (kept RESULT_RETENTION_MS after it ends)."""
    out = Output(console, json_)
    raise typer.Exit(run(_get_result(settings_of(ctx), out, task_id, worker)))


@app.command()
def cancel(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(callback=task_id_option)],
    *,
    worker: FindWorkerOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Cancel a task: a running one stops (its calls are cancelled, its writer skipped)
    and ends FAILED CANCELLED, not retryable, so backfill and follow never run it
    again. A writer already writing finishes; a finished task shows its state.

    Exit codes: 0 the task is over (cancelled, now or before, or finished); 1 not
    cancelled (its writer is writing, it is only reserved, or no worker knows it);
    2 usage; 3 a worker or etcd cannot be reached."""
    out = Output(console, json_)
    raise typer.Exit(run(_cancel(settings_of(ctx), out, task_id, worker)))


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
            fail(str(exc), EXIT_USAGE, hint=TASK_FILE_HINT)
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
            args = parse_json(raw)
        except ValueError as exc:
            fail(f"--call {shown(raw)} is not JSON: {exc}", EXIT_USAGE)
        if not isinstance(args, list):
            example = "e.g. '[1, \"a\"]'"
            fail(f"--call {shown(raw)} must be a JSON array of arguments, {example}", EXIT_USAGE)
        call_list.append(args)
    return Task(
        function_call_config=PluginConfig(
            type="CallListCallConfig", config={"function": function, "callList": call_list}
        ),
        result_handler=PluginConfig(type=handler) if handler else None,
        task_id=task_id or "",
        task_timeout_ms=timeout_ms,
    )


async def _reserve(
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
            f"reserved slot [bold]{escape(slot.slot_id)}[/] on worker "
            f"[bold]{escape(slot.worker_addr)}[/] for task {escape(slot.task_id)}"
        )


async def _submit(
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
            try:
                with progress_line(out, task.task_id) as on_progress:
                    result = await client.run(
                        task,
                        cluster=cluster,
                        worker_addr=worker,
                        deadline_s=deadline,
                        on_progress=on_progress,
                    )
            except TaskInputDiffersError as exc:
                _warn_input_differs(exc.answer)
                if exc.answer.result is None:
                    return EXIT_FAILED
                result = exc.answer.result
            print_result(out, result)
            return EXIT_OK if result.ok else EXIT_FAILED
        answer = await client.place(task, cluster=cluster, worker_addr=worker, deadline_s=deadline)
        if answer.input_differs:
            _warn_input_differs(answer)
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
            f"submitted task [bold]{escape(answer.task_id)}[/] to worker "
            f"[bold]{escape(answer.worker_addr)}[/]: {answer.state.value}",
            soft_wrap=True,
        )
        task_id, worker_addr = shlex.quote(answer.task_id), shlex.quote(answer.worker_addr)
        print_whole(
            out.console, f"watch it: blockx watch {task_id} --worker {worker_addr}", style="dim"
        )
    return EXIT_OK


def _warn_input_differs(answer: SubmitAnswer) -> None:
    typer.echo(
        f"warning: task {answer.task_id} already ran on {answer.worker_addr} with another "
        f"input; what follows is that earlier task ({answer.state.value}), not a run of this "
        "one. Submit the changed task under a new task_id (or none, to have one generated).",
        err=True,
    )


async def _get_result(settings: Settings, out: Output, task_id: str, worker: str | None) -> int:
    async with settings.client() as client:
        if worker is None:
            result = await locate(client, settings, task_id)
            print_result(out, result)
            return EXIT_FAILED if result.state is TaskState.FAILED else EXIT_OK
        try:
            result = await client.get_task_result(task_id, worker_addr=worker)
        except TaskNotFoundError:
            _print_not_found(out, task_id, worker)
            return EXIT_FAILED
    print_result(out, result)
    if result.state is TaskState.FAILED:
        return EXIT_FAILED
    return EXIT_OK


# What ``blockx cancel`` says of each outcome, and its exit code.
_CANCELLED: Final = {
    CancelOutcome.CANCELLED: ("cancelled", EXIT_OK),
    CancelOutcome.FINISHED: ("already finished", EXIT_OK),
    CancelOutcome.WRITING: (
        "not cancelled: its writer is writing, and the task ends with the writer's outcome",
        EXIT_FAILED,
    ),
    CancelOutcome.NOT_SUBMITTED: ("not cancelled: reserved, not submitted", EXIT_FAILED),
}


async def _cancel(settings: Settings, out: Output, task_id: str, worker: str | None) -> int:
    async with settings.client() as client:
        if worker is None:
            worker = (await locate(client, settings, task_id)).worker_addr
        try:
            answer = await client.cancel(task_id, worker_addr=worker)
        except TaskNotFoundError:
            answer = None
    if answer is None:
        _print_not_found(out, task_id, worker)
        return EXIT_FAILED
    said, code = _CANCELLED[answer.outcome]
    if out.json_mode:
        out.emit(
            {
                "task_id": answer.task_id,
                "worker_addr": answer.worker_addr,
                "outcome": answer.outcome.value,
                "state": answer.state.value,
                "result": None if answer.result is None else result_dict(answer.result),
                "detail": answer.detail,
            }
        )
        return code
    line = f"task {escape(task_id)} on {escape(answer.worker_addr)}: {said}"
    result = answer.result
    if answer.outcome is CancelOutcome.NOT_SUBMITTED:
        line += f" ({escape(answer.detail)})"
    elif result is not None:
        line += f" ({_ended(result)})"
    else:
        line += (
            f"; watch it: blockx watch {escape(shlex.quote(task_id))} "
            f"--worker {escape(shlex.quote(answer.worker_addr))}"
        )
    out.console.print(line, highlight=False, soft_wrap=True)
    return code


def _ended(result: TaskResult) -> str:
    """How a task ended, in a few words: ``SUCCEEDED``, ``FAILED CANCELLED: why``."""
    style = STATE_STYLE[result.state]
    text = f"[{style}]{result.state.value}[/]"
    if result.failure_code:
        text += f" {escape(result.failure_code)}"
    first = result.failure_message.strip().split("\n", 1)[0]
    if first:
        text += f": {escape(first)}"
    return text


def _print_not_found(out: Output, task_id: str, worker: str) -> None:
    """The worker does not know the task: not an error of the client (results are
    kept RESULT_RETENTION_MS only)."""
    if out.json_mode:
        out.emit({"task_id": task_id, "state": TaskState.NOT_FOUND.value, "worker_addr": worker})
    else:
        out.console.print(
            f"task {escape(task_id)} on {escape(worker)}: "
            f"[magenta]{TaskState.NOT_FOUND.value}[/] ({NOT_KNOWN})"
        )


async def _watch(settings: Settings, out: Output, task_ids: list[str], worker: str | None) -> int:
    latest: dict[str, TaskUpdate] = {}
    async with settings.client() as client:
        groups = await _watch_groups(client, settings, task_ids, worker)
        if out.json_mode:

            def emit_line(update: TaskUpdate) -> None:
                latest[update.task_id] = update
                # One object per line, flushed, so a pipe sees each update at once.
                print(json.dumps(watch_line(update), sort_keys=True), flush=True)

            await _follow(client, groups, emit_line)
        else:
            progress = Progress(
                TextColumn("[bold]tasks"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            bar = progress.add_task("tasks", total=len(set(task_ids)))
            with Live(console=out.console, refresh_per_second=8) as live:
                calls: dict[str, CallProgress] = {}

                def show(update: TaskUpdate) -> None:
                    latest[update.task_id] = update
                    if update.progress is not None:
                        calls[update.task_id] = update.progress
                    done = sum(1 for u in latest.values() if u.is_terminal)
                    progress.update(bar, completed=done)
                    live.update(Group(watch_table(latest, calls, out.console), progress))

                await _follow(client, groups, show)
            if not out.console.is_terminal:
                out.console.line()  # rich ends the last render with a newline on a terminal only
    failed = [u for u in latest.values() if not (u.result is not None and u.result.ok)]
    return EXIT_FAILED if failed else EXIT_OK


async def _watch_groups(
    client: Client, settings: Settings, task_ids: list[str], worker: str | None
) -> dict[str, list[str]]:
    """The task ids to watch on each worker: all on ``worker``, or each on the one
    registered worker that holds it."""
    if worker is not None:
        return {worker: task_ids}
    groups: dict[str, list[str]] = {}
    for task_id in dict.fromkeys(task_ids):
        found = await locate(client, settings, task_id)
        groups.setdefault(found.worker_addr, []).append(task_id)
    return groups


async def _follow(
    client: Client, groups: dict[str, list[str]], on_update: Callable[[TaskUpdate], None]
) -> None:
    """One Watch stream per worker, asking for call progress; each update (progress
    ones too) handed to ``on_update`` as it comes."""

    async def one(addr: str, ids: list[str]) -> None:
        async for update in client.watch_tasks(ids, worker_addr=addr, progress=True):
            on_update(update)

    async with asyncio.TaskGroup() as streams:
        for addr, ids in groups.items():
            streams.create_task(one(addr, ids))
