"""Functions, through the Sync Invoker: ``invoke``, ``precheck``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from blockx_cli.options import JsonOpt
from blockx_cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Output,
    console,
    fail,
    invocation_dict,
    print_whole,
)
from blockx_cli.runner import run
from blockx_cli.settings import Settings, settings_of
from blockx_client import Invocation
from blockx_core.json_text import parse_json
from blockx_server.calls.functions import FunctionStoreError
from blockx_server.calls.load_check import DEFAULT_TIMEOUT_S, precheck_directory

app = typer.Typer()


@app.command()
def invoke(
    ctx: typer.Context,
    function: Annotated[str, typer.Argument()],
    args: Annotated[list[str] | None, typer.Argument(help="Arguments, each a JSON value.")] = None,
    *,
    debug: Annotated[bool, typer.Option("--debug", help="Also show output and IO trace.")] = False,
    timeout_ms: Annotated[int, typer.Option(help="Call budget (0 = default).")] = 0,
    chain: Annotated[
        str | None,
        typer.Option(
            "--chain",
            help="The chain the call reads, by its name in the Sync Invoker's "
            "chains.NAME table (default: its only chain).",
        ),
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            "--record",
            help="Save the call's record (its arguments, code, every IO request with its "
            "answer, how it ended) to FILE: `blockx replay --fixture FILE` runs it again "
            "offline, and tests use it as a fixture.",
        ),
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """Run one function once through the Sync Invoker."""
    out = Output(console, json_)
    values = parse_args(args or [])
    if record is not None and not record.parent.is_dir():
        fail(f"cannot write the record to {record}: no directory {record.parent}", EXIT_USAGE)
    invoking = _invoke(settings_of(ctx), out, function, values, debug, timeout_ms, chain, record)
    raise typer.Exit(run(invoking))


@app.command()
def precheck(
    ctx: typer.Context,
    function: Annotated[str, typer.Argument()],
    args: Annotated[list[str] | None, typer.Argument(help="Arguments, each a JSON value.")] = None,
    *,
    functions: Annotated[
        Path | None,
        typer.Option(
            "--functions",
            envvar="FUNCTIONS_DIR",
            help="Check this functions directory here, loading the module as a call "
            "would (its top level runs, in a child process); without it, ask the Sync "
            "Invoker, which does not run the module.",
        ),
    ] = None,
    load_timeout: Annotated[
        float, typer.Option(help="Seconds the module's top level may take to load.")
    ] = DEFAULT_TIMEOUT_S,
    json_: JsonOpt = False,
) -> None:
    """Check a function compiles and accepts the arguments, without calling it."""
    out = Output(console, json_)
    values = parse_args(args or [])
    check_args = args is not None
    if functions is not None:
        checking = _precheck_directory(out, functions, function, values, check_args, load_timeout)
        raise typer.Exit(run(checking))
    raise typer.Exit(run(_precheck(settings_of(ctx), out, function, values, check_args)))


def parse_args(values: list[str]) -> list[Any]:
    """Each argument is a JSON value; a bare word that is not JSON is a string."""
    parsed = []
    for value in values:
        try:
            parsed.append(parse_json(value))
        except ValueError:
            parsed.append(value)
    return parsed


async def _invoke(
    settings: Settings,
    out: Output,
    function: str,
    args: list[Any],
    debug: bool,
    timeout_ms: int,
    chain: str | None,
    record: Path | None,
) -> int:
    async with settings.client() as client:
        handle = client.function(function)
        # DebugInvoke is the call that returns a record.
        result = await (
            handle.debug(*args, timeout_ms=timeout_ms, chain=chain)
            if debug or record is not None
            else handle.invoke(*args, timeout_ms=timeout_ms, chain=chain)
        )
    if record is not None:
        _save_record(record, result)
    if not debug:
        # A debug invoke made only for its record is shown as a plain one.
        result = msgspec.structs.replace(result, output="", io_trace=())
    if out.json_mode:
        shown = invocation_dict(result)
        out.emit(shown if record is None else {**shown, "record": str(record)})
    else:
        _print_invocation(out, function, args, result)
        if record is not None:
            out.console.print(
                f"[dim]record saved to {escape(str(record))}: "
                f"`blockx replay --fixture {escape(str(record))}` runs the call again here[/]",
                highlight=False,
                soft_wrap=True,
            )
    return EXIT_OK if result.success else EXIT_FAILED


def _save_record(path: Path, result: Invocation) -> None:
    from blockx_core.call_record import encode_record

    if result.record is None:
        fail(
            "the Sync Invoker kept no record of the call: its CALL_RECORD_MAX_BYTES is 0",
            EXIT_FAILED,
            hint="start it with CALL_RECORD_MAX_BYTES > 0 (default 4 MiB) to record calls",
        )
    try:
        path.write_bytes(encode_record(result.record))
    except OSError as exc:
        fail(f"cannot write the record to {path}: {exc.strerror}", EXIT_USAGE)


def _print_invocation(out: Output, function: str, args: list[Any], result: Invocation) -> None:
    d = result.durations
    call = f"{function}({', '.join(json.dumps(a) for a in args)})"
    if result.success:
        print_whole(out.console, f"{call} = {json.dumps(result.value)}")
    else:
        out.console.print(
            f"{escape(call)} failed: [red]{result.failure_code or ''}[/] "
            f"(retryable={result.retryable})"
        )
        out.console.print(result.failure_message, highlight=False, markup=False)
    out.console.print(
        f"[dim]call {escape(result.call_id)}: queue {d.queue_us} µs, cpu {d.cpu_us} µs, "
        f"io {d.io_us} µs[/]"
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
                t.backend,
                t.op,
                Text(t.request),
                str(t.duration_us),
                "yes" if t.success else Text(t.error),
            )
        out.console.print(table)


async def _precheck(
    settings: Settings, out: Output, function: str, args: list[Any], check_args: bool
) -> int:
    async with settings.client() as client:
        result = await client.function(function).precheck(*args, check_args=check_args)
    if out.json_mode:
        out.emit(
            {
                "ok": result.ok,
                "failure_code": result.failure_code or "",
                "message": result.message,
                "signature": result.signature,
                "is_async": result.is_async,
            }
        )
    elif result.ok:
        kind = "async def" if result.is_async else "def"
        out.console.print(
            f"[green]ok[/]: {kind} {escape(function + result.signature)}", highlight=False
        )
        out.console.print(
            "[dim]its module's top level was not run; --functions DIR loads it as a call would[/]"
        )
    else:
        out.console.print(
            f"[red]{result.failure_code or ''}[/]: {escape(result.message)}", highlight=False
        )
    return EXIT_OK if result.ok else EXIT_FAILED


async def _precheck_directory(
    out: Output,
    directory: Path,
    function: str,
    args: list[Any],
    check_args: bool,
    timeout_s: float,
) -> int:
    try:
        result = await precheck_directory(
            directory, function, args if check_args else None, timeout_s=timeout_s
        )
    except FunctionStoreError as exc:
        fail(str(exc), EXIT_USAGE)
    if out.json_mode:
        out.emit(
            {
                "ok": result.ok,
                "failure_code": result.failure_code,
                "message": result.message,
                "detail": result.detail,
                "signature": result.signature,
                "is_async": result.is_async,
                "loaded": result.loaded,
                "functions_dir": str(directory),
            }
        )
    elif result.ok:
        kind = "async def" if result.is_async else "def"
        out.console.print(
            f"[green]ok[/]: {kind} {escape(function + result.signature)} (its module loads)",
            highlight=False,
        )
        if result.message:
            out.console.print(f"[dim]{escape(result.message)}[/]", highlight=False)
    else:
        out.console.print(f"[red]{result.failure_code}[/]: ", end="", highlight=False)
        out.console.print(result.message, highlight=False, markup=False, soft_wrap=True)
    return EXIT_OK if result.ok else EXIT_FAILED
