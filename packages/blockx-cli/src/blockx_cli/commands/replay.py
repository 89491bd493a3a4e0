"""``blockx replay``: run a recorded call again here, offline, in a real executor.

``blockx replay TASK_ID [--call N]`` fetches the record a Worker kept of a failed
call of the task, saves it, and replays it; ``blockx replay --fixture FILE``
replays a record file (``blockx invoke --record``, an earlier ``blockx replay``).
The call runs with the record's code (or ``--functions DIR``), every IO request
answered from the record, so a failure shows the same exception at the same line.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import typer
from rich.markup import escape

from blockx_cli.commands.task import FindWorkerOpt
from blockx_cli.launch import collect_cycles
from blockx_cli.options import JsonOpt, task_id_option
from blockx_cli.output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Output, console, fail, print_whole
from blockx_cli.runner import run
from blockx_cli.settings import Settings, settings_of

if TYPE_CHECKING:
    # The replay loads the executor pool and every IO backend: only when it runs.
    from blockx_core.call_record import CallRecord
    from blockx_server.calls.replay import ReplayOutcome

app = typer.Typer()

FunctionsOpt = Annotated[
    Path | None,
    typer.Option(
        "--functions",
        help="Run this functions directory's code (edited code against the recording) "
        "instead of the code the record holds.",
        show_default="the record's code",
    ),
]


@app.command()
def replay(
    ctx: typer.Context,
    task_id: Annotated[
        str | None,
        typer.Argument(
            callback=task_id_option,
            help="A task with a failed call; its Worker keeps the call's record.",
            show_default=False,
        ),
    ] = None,
    *,
    fixture: Annotated[
        Path | None,
        typer.Option(
            "--fixture",
            help="Replay this record file (blockx invoke --record, a saved replay) "
            "instead of a task's.",
        ),
    ] = None,
    call: Annotated[
        int | None,
        typer.Option(
            "--call",
            min=0,
            help="The task's root call of this index (0-based).",
            show_default="the call that failed the task",
        ),
    ] = None,
    worker: FindWorkerOpt = None,
    save: Annotated[
        Path | None,
        typer.Option(
            "--save",
            help="Where to save a task's record.",
            show_default="blockx-replay-TASK_ID.json here",
        ),
    ] = None,
    functions: FunctionsOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Run a recorded call again here, in a real executor, with the IO answers it got:
    a failed call shows the same exception at the same line.

    Exit codes: 0 the replayed call returned; 1 it failed (what it printed says
    whether as recorded), or the task's worker keeps no such record; 2 usage, or a
    record or functions directory that cannot be read; 3 the worker could not be
    reached."""
    out = Output(console, json_)
    if (task_id is None) == (fixture is None):
        fail("give a TASK_ID or --fixture FILE (one of them)", EXIT_USAGE)
    if fixture is not None:
        if call is not None or worker is not None or save is not None:
            fail("--call, --worker and --save go with a TASK_ID, not --fixture", EXIT_USAGE)
        raise typer.Exit(_replay_file(out, fixture, functions))
    assert task_id is not None
    record = run(_fetch(settings_of(ctx), task_id, call, worker))
    path = save or Path(record_file_name(task_id, call))
    _save(path, record)
    if not out.json_mode:
        console.print(
            f"[dim]saved the record of task {escape(task_id)}'s failed call "
            f"{'' if call is None else f'{call} '}to {escape(str(path))}[/]",
            highlight=False,
            soft_wrap=True,
        )
    raise typer.Exit(replay_record(out, record, str(path), functions))


async def _fetch(
    settings: Settings, task_id: str, call: int | None, worker: str | None
) -> CallRecord:
    from blockx_client import TaskNotFoundError

    async with settings.client() as client:
        try:
            return await client.call_record(task_id, call, worker_addr=worker)
        except TaskNotFoundError as exc:
            fail(
                exc.message,
                EXIT_FAILED,
                hint="a Worker keeps the records of failed calls only, while the task's "
                "result is retained (RESULT_RETENTION_MS)",
            )


def _save(path: Path, record: CallRecord) -> None:
    from blockx_core.call_record import encode_record

    try:
        path.write_bytes(encode_record(record))
    except OSError as exc:
        fail(f"cannot save the record to {path}: {exc.strerror}", EXIT_USAGE)


def _replay_file(out: Output, path: Path, functions: Path | None) -> int:
    from blockx_server.calls.replay import ReplayRefused, read_record

    try:
        record = read_record(path)
    except ReplayRefused as exc:
        fail(str(exc), EXIT_USAGE)
    return replay_record(out, record, str(path), functions)


def replay_record(out: Output, record: CallRecord, saved: str, functions: Path | None) -> int:
    """Replay ``record`` (saved at ``saved``) and print how it ended, against how
    the recorded call did."""
    from blockx_server.calls.replay import ReplayRefused

    collect_cycles()
    try:
        outcome = asyncio.run(_replay(record, functions))
    except ReplayRefused as exc:
        fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except TimeoutError:
        fail("the executors did not start within a minute", EXIT_FAILED)
    if out.json_mode:
        out.emit(_outcome_dict(record, outcome, saved, functions))
    else:
        _print_outcome(out, record, outcome, saved, functions)
    return EXIT_OK if _returned(outcome) else EXIT_FAILED


async def _replay(record: CallRecord, functions: Path | None) -> ReplayOutcome:
    from blockx_server.calls.replay import load_functions, replay_once

    code = None if functions is None else await load_functions(functions)
    return await replay_once(record, code=code)


def _returned(outcome: ReplayOutcome) -> bool:
    from blockx_server.calls.replay import ReplayReturned

    return isinstance(outcome, ReplayReturned)


def _call_text(record: CallRecord) -> str:
    arguments = [json.dumps(a) for a in record.args]
    arguments += [f"{k}={json.dumps(v)}" for k, v in record.kwargs.items()]
    return f"{record.function}({', '.join(arguments)})"


def _code_text(record: CallRecord, functions: Path | None) -> str:
    if functions is not None:
        return f"the code in {functions}"
    return f"the code of epoch {record.code_epoch}"


def _recorded_text(record: CallRecord) -> str:
    from blockx_server.calls.replay import raised_at

    if record.failure is None:
        return f"returned {json.dumps(record.result)}"
    where = raised_at(record.failure.message)
    headline = record.failure.message.split("\n", 1)[0]
    return f"failed {record.failure.kind}: {headline}" + (f", raised at {where}" if where else "")


def _print_outcome(
    out: Output,
    record: CallRecord,
    outcome: ReplayOutcome,
    saved: str,
    functions: Path | None,
) -> None:
    from blockx_server.calls.replay import ReplayFailed, ReplayReturned, raised_at, same_ending

    console = out.console
    call = _call_text(record)
    console.print(
        f"[dim]replayed {escape(call)} from {escape(saved)} with "
        f"{escape(_code_text(record, functions))}[/]",
        highlight=False,
        soft_wrap=True,
    )
    match outcome:
        case ReplayReturned():
            print_whole(console, f"{call} = {json.dumps(outcome.value)}")
        case ReplayFailed():
            failure = outcome.failure
            console.print(f"{escape(call)} failed: [red]{failure.kind}[/]", highlight=False)
            console.print(failure.message, highlight=False, markup=False, soft_wrap=True)
            where = raised_at(failure.message)
            if where is not None:
                console.print(f"[bold]raised at {escape(str(where))}[/]", highlight=False)
    if outcome.output:
        console.print("[bold]output[/]")
        console.print(outcome.output.rstrip(), highlight=False, markup=False)
    same = same_ending(record, outcome)
    verdict = "[green]as recorded[/]" if same else "[yellow]not as recorded[/]"
    console.print(
        f"{verdict}: the recorded call {escape(_recorded_text(record))}",
        highlight=False,
        soft_wrap=True,
    )
    truncated = " (the record is truncated: its later requests are missing)"
    console.print(
        f"[dim]{outcome.served} IO answers served from {escape(saved)}"
        f"{truncated if record.truncated else ''}[/]",
        highlight=False,
        soft_wrap=True,
    )


def _outcome_dict(
    record: CallRecord, outcome: ReplayOutcome, saved: str, functions: Path | None
) -> dict[str, Any]:
    from blockx_server.calls.replay import ReplayFailed, ReplayReturned, raised_at, same_ending

    value, failure = None, None
    match outcome:
        case ReplayReturned():
            value = outcome.value
        case ReplayFailed():
            failure = outcome.failure
    where = None if failure is None else raised_at(failure.message)
    return {
        "record": saved,
        "function": record.function,
        "args": record.args,
        "kwargs": record.kwargs,
        "code_epoch": record.code_epoch,
        "functions_dir": None if functions is None else str(functions),
        "success": failure is None,
        "value": value,
        "failure_code": "" if failure is None else str(failure.kind),
        "failure_message": "" if failure is None else failure.message,
        "raised_at": None if where is None else msgspec.to_builtins(where),
        "output": outcome.output,
        "io_served": outcome.served,
        "as_recorded": same_ending(record, outcome),
        "truncated": record.truncated,
    }


def record_file_name(task_id: str, call_index: int | None) -> str:
    """Where ``blockx replay TASK_ID`` saves the record: the task id, made safe for a
    file name."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", task_id)
    return f"blockx-replay-{safe}{'' if call_index is None else f'-{call_index}'}.json"
