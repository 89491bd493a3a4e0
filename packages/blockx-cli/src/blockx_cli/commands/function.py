"""Functions, through the Sync Invoker: ``invoke``, ``precheck``."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from blockx_cli.options import JsonOpt
from blockx_cli.output import EXIT_FAILED, EXIT_OK, Output, console, invocation_dict
from blockx_cli.runner import run
from blockx_cli.settings import Settings, settings_of
from blockx_client import Invocation

app = typer.Typer()


@app.command()
def invoke(
    ctx: typer.Context,
    function: Annotated[str, typer.Argument()],
    args: Annotated[list[str] | None, typer.Argument(help="Arguments, each a JSON value.")] = None,
    *,
    debug: Annotated[bool, typer.Option("--debug", help="Also show output and IO trace.")] = False,
    timeout_ms: Annotated[int, typer.Option(help="Call budget (0 = default).")] = 0,
    json_: JsonOpt = False,
) -> None:
    """Run one function once through the Sync Invoker."""
    out = Output(console, json_)
    values = parse_args(args or [])
    raise typer.Exit(run(_invoke(settings_of(ctx), out, function, values, debug, timeout_ms)))


@app.command()
def precheck(
    ctx: typer.Context,
    function: Annotated[str, typer.Argument()],
    args: Annotated[list[str] | None, typer.Argument(help="Arguments, each a JSON value.")] = None,
    *,
    json_: JsonOpt = False,
) -> None:
    """Check a function compiles and accepts the arguments, without running it."""
    out = Output(console, json_)
    values = parse_args(args or [])
    raise typer.Exit(run(_precheck(settings_of(ctx), out, function, values, args is not None)))


def parse_args(values: list[str]) -> list[Any]:
    """Each argument is a JSON value; a bare word that is not JSON is a string."""
    parsed = []
    for value in values:
        try:
            parsed.append(json.loads(value))
        except ValueError:
            parsed.append(value)
    return parsed


async def _invoke(
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


async def _precheck(
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
