"""Driving the chain clusters: ``blockx backfill`` and ``blockx follow``.

Both are clients of the cluster (BlockX itself generates no tasks): ``backfill``
runs a block range through the bundle cluster into a sink table, resumably;
``follow`` computes each new block on the block cluster and keeps the sink table
matching the canonical chain across reorgs. ``--json`` prints one JSON object per
line as events happen. The databases come from ``--db`` / ``--sink-db``, else
BLOCKDB_URL / SINK_DB_URL, else the running ``blockx dev up`` (its dev.toml).

SIGINT (Ctrl-C) or SIGTERM cancels the tasks in flight on their workers (best
effort, within a few seconds) and says so on stderr: ``backfill`` stops at once,
``follow`` once they have ended (a block whose task was cancelled so is left for
the next run).

Before any task goes out, the source table, the sink's declared column types and
the function are checked once (``blockx_drive.submission``): a failed check is
one line and exit 2, and nothing is submitted. Each run keeps its job record in
the sink (``blockx jobs``), naming this command line.

Exit codes: 0 done, every block written (``follow``: stopped by SIGINT/SIGTERM);
1 a block failed for good and was not written, or the range is not in the block
database; 2 usage (a bad flag, a failed check, no bundle coordinator configured);
3 a database or the cluster cannot be reached; 130 ``backfill`` interrupted (a
re-run resumes).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, assert_never

import msgspec
import typer
from rich.markup import escape

from blockx_chain.schema import MAX_INTEGER  # a block number is a 63-bit INTEGER column
from blockx_chain.sink.schema import SinkType
from blockx_chain.store.reads import ROW_TABLES
from blockx_chain.url import BlockDbUrl, describe
from blockx_cli.databases import database_url
from blockx_cli.launch import collect_cycles
from blockx_cli.output import EXIT_FAILED, EXIT_SERVICE, EXIT_USAGE, console, fail
from blockx_cli.settings import settings_of
from blockx_core.call_unit import CallUnit
from blockx_core.ids import shown
from blockx_core.json_text import parse_json
from blockx_drive.call_unit import unit_config
from blockx_drive.defaults import (
    DEFAULT_BACKFILL_WRITER,
    DEFAULT_BLOCKS_PER_TASK,
    DEFAULT_BUNDLE_SIZE_LIMIT,
    DEFAULT_FOLLOW_WRITER,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_REORG_WINDOW,
    DEFAULT_TASKS_IN_FLIGHT,
    MAX_ATTEMPTS_LIMIT,
    REORG_WINDOW_LIMIT,
    RESUME_WINDOW,
    OnFailure,
)

if TYPE_CHECKING:
    from rich.table import Table

    from blockx_cli.settings import Settings
    from blockx_client import Client
    from blockx_drive import (
        BackfillDone,
        BackfillEvent,
        BackfillPlanned,
        BlockFailed,
        FollowEvent,
        JobSpec,
        TaskFinished,
    )

# The drivers, the cluster's client, asyncio and the databases' errors are imported
# by the functions that run a command: its help needs the options' defaults alone.

app = typer.Typer()
T = TypeVar("T")


FunctionOpt = Annotated[str, typer.Option("--function", help="The function to run.")]
SourceTableOpt = Annotated[
    str,
    typer.Option(
        "--source-table",
        help=f"The block database table it scans: {', '.join(ROW_TABLES)}.",
    ),
]
WhereOpt = Annotated[
    str | None,
    typer.Option(
        "--where", help='Column equality filter, a JSON object (e.g. \'{"address": "0x…"}\').'
    ),
]
UnitOpt = Annotated[
    CallUnit,
    typer.Option(
        "--unit",
        case_sensitive=False,
        help="row: one call per row; block: one call per block; event: one call per "
        "log decoded as --event of --abi (--source-table logs).",
    ),
]
AbiOpt = Annotated[
    str | None,
    typer.Option(
        "--abi",
        help="With --unit event: the registered ABI the logs decode with "
        "(see `blockx chain abi list`).",
    ),
]
EventOpt = Annotated[
    str | None,
    typer.Option("--event", help="With --unit event: the name of the event in --abi."),
]
SinkTableOpt = Annotated[str, typer.Option("--sink-table", help="The sink table to write.")]
DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="BLOCKDB_URL",
        help="The block database: sqlite:////abs.db, sqlite:///rel.db or "
        "postgresql://user@host:port/db (default: BLOCKDB_URL, else the running "
        "`blockx dev up`'s).",
    ),
]
SinkDbOpt = Annotated[
    str | None,
    typer.Option(
        "--sink-db",
        envvar="SINK_DB_URL",
        help="The sink database the Workers write, in the same forms (default: "
        "SINK_DB_URL, else the running `blockx dev up`'s).",
    ),
]
ChainOpt = Annotated[
    str | None,
    typer.Option(
        "--chain",
        help="The chain the tasks read, by its name in the Workers' chains.NAME table "
        "configuration (default: their only chain); --db is that chain's block database.",
    ),
]
JsonLinesOpt = Annotated[
    bool, typer.Option("--json", help="One JSON object per line, as events happen.")
]
MaxAttemptsOpt = Annotated[
    int,
    typer.Option(
        "--max-attempts",
        min=1,
        max=MAX_ATTEMPTS_LIMIT,
        help="Attempts per task before its blocks are reported failed "
        "(retryable failures and lost Workers are attempted again).",
    ),
]
OnFailureOpt = Annotated[
    OnFailure,
    typer.Option(
        "--on-failure",
        case_sensitive=False,
        help="Once a block failed for good: continue with the others, or stop the run. "
        "Either way the command exits 1.",
    ),
]
_TYPES = ", ".join(t.value for t in SinkType)
ColumnOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--column",
        metavar="NAME=TYPE",
        help=f"Declare a sink column's type ({_TYPES}) instead of inferring it from "
        "the first values written; repeatable.",
    ),
]


def _databases(
    db: str | None, sink_db: str | None, json_mode: bool
) -> tuple[BlockDbUrl, BlockDbUrl]:
    """The block database and the sink, as the drivers take them; a line saying so
    when they are the running ``blockx dev up``'s."""
    from blockx_client.dev_config import dev_config_path

    db_url, db_from_dev = database_url(db, "--db", "BLOCKDB_URL", "block database")
    sink_url, sink_from_dev = database_url(sink_db, "--sink-db", "SINK_DB_URL", "sink database")
    shown = [describe(u) for u, dev in ((db_url, db_from_dev), (sink_url, sink_from_dev)) if dev]
    if shown and not json_mode:
        console.print(
            f"[dim]from the running `blockx dev up` ({dev_config_path()}): "
            f"{escape(' and '.join(shown))}[/]",
            highlight=False,
        )
    return db_url, sink_url


def _columns(pairs: list[str] | None) -> dict[str, Any] | None:
    """``--column NAME=TYPE`` flags as the writer's ``columns``."""
    from blockx_chain.sink import SinkRejected
    from blockx_chain.sink.schema import parse_types

    if not pairs:
        return None
    columns: dict[str, str] = {}
    for pair in pairs:
        name, sep, kind = pair.partition("=")
        name, kind = name.strip(), kind.strip()
        if not sep or not name or not kind:
            fail(f"--column {pair!r}: expected NAME=TYPE, TYPE one of {_TYPES}", EXIT_USAGE)
        twin = next((n for n in columns if n.lower() == name.lower()), None)
        if twin is not None:
            fail(f"--column {name!r} is declared twice (as {twin!r} before)", EXIT_USAGE)
        try:
            parse_types({name: kind})
        except SinkRejected as exc:
            fail(f"--column {pair!r}: {exc}", EXIT_USAGE)
        columns[name] = kind.upper()
    return {"columns": columns}


def _unit(unit: CallUnit, source_table: str, abi: str | None, event: str | None) -> dict[str, Any]:
    """The driver's unit arguments, checked before anything is opened (exit 2)."""
    if unit is CallUnit.EVENT and (abi is None or event is None):
        fail("--unit event needs --abi NAME and --event NAME", EXIT_USAGE)
    if unit is not CallUnit.EVENT and (abi is not None or event is not None):
        fail("--abi and --event go with --unit event", EXIT_USAGE)
    try:
        unit_config(unit.value, source_table, abi, event)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    return {"unit": unit.value, "abi": abi, "event": event}


class _Flags(msgspec.Struct, frozen=True, kw_only=True):
    """The flags both drivers take that become JobSpec fields once read."""

    where: str | None
    unit: CallUnit
    abi: str | None
    event: str | None
    db: str | None
    sink_db: str | None
    column: list[str] | None


def _job(json_mode: bool, flags: _Flags, **fields: Any) -> JobSpec:
    """The drivers' JobSpec: ``fields`` as given, and ``flags`` read and checked (a
    usage error exits 2 before any database is named)."""
    from blockx_drive import JobSpec

    where, units = (
        _where(flags.where),
        _unit(flags.unit, fields["source_table"], flags.abi, flags.event),
    )
    db_url, sink_db_url = _databases(flags.db, flags.sink_db, json_mode)
    return JobSpec(
        **fields,
        where=where,
        **units,
        db_url=db_url,
        sink_db_url=sink_db_url,
        writer_config=_columns(flags.column),
        command=_command_line(),
    )


def _where(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = parse_json(raw)
    except ValueError as exc:
        fail(f"--where must be a JSON object of column: value ({exc})", EXIT_USAGE)
    if not isinstance(value, dict):
        fail(f"--where must be a JSON object of column: value, got {shown(raw)}", EXIT_USAGE)
    return value


def _first_line(message: str) -> str:
    """A failure's first line, for the closing error (its event printed all of it:
    a function's traceback, say)."""
    return message.strip().split("\n", 1)[0]


def _print_json(event: msgspec.Struct) -> None:
    sys.stdout.write(msgspec.json.encode(event).decode() + "\n")
    sys.stdout.flush()


@contextmanager
def _on_signals(handler: Callable[[], object]) -> Iterator[None]:
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handler)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _cancelling(clients: list[Client]) -> None:
    """Say on stderr (stdout may be JSON lines) that the tasks in flight are being
    cancelled on their workers, as Ctrl-C or SIGTERM does."""
    in_flight = sum(len(client.in_flight()) for client in clients)
    if in_flight:
        typer.echo(
            f"interrupted: cancelling {in_flight} task(s) in flight on their workers", err=True
        )


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command: every expected error is one line and an exit code."""
    import asyncio
    import logging

    from blockx_chain.sink import SinkError, SinkUnavailable
    from blockx_chain.store import StoreError, StoreUnavailable
    from blockx_cli.runner import hint_for
    from blockx_client import BlockxError, InvalidRequestError
    from blockx_drive import BackfillError

    # asyncpg's pool logs each failed reconnection with a traceback; a database out
    # of reach is follow's `interrupted` event, and backfill's one-line error.
    logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)
    collect_cycles()
    try:
        return asyncio.run(coro)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    except BackfillError as exc:
        fail(str(exc), EXIT_FAILED)
    except (StoreUnavailable, SinkUnavailable) as exc:
        fail(str(exc), EXIT_SERVICE)
    except (StoreError, SinkError) as exc:
        fail(str(exc), EXIT_FAILED)
    except InvalidRequestError as exc:
        fail(exc.message, EXIT_USAGE, hint="pass --bundle-coordinator or --coordinator")
    except BlockxError as exc:
        fail(exc.message, EXIT_SERVICE, hint=hint_for(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception as exc:  # a bug: still one line, never a traceback
        fail(f"unexpected error: {type(exc).__name__}: {exc}", EXIT_FAILED)


# ---- backfill -------------------------------------------------------------------------


class _View:
    """The live progress table of a backfill."""

    def __init__(self) -> None:
        self.planned: BackfillPlanned | None = None
        self.last: TaskFinished | None = None

    def render(self) -> Table:
        from rich.table import Table

        table = Table(show_header=True, header_style="bold", box=None)
        for column in ("blocks", "rows", "blocks/s", "rows/s", "tasks", "failed", "ETA"):
            table.add_column(column, justify="right")
        planned, last = self.planned, self.last
        if planned is not None:
            blocks = 0 if last is None else last.blocks_done
            eta = None if last is None else last.eta_s
            table.add_row(
                f"{blocks:,}/{planned.blocks:,}",
                f"{0 if last is None else last.rows_done:,}",
                f"{0 if last is None else last.blocks_per_s:,.0f}",
                f"{0 if last is None else last.rows_per_s:,.0f}",
                f"{0 if last is None else last.tasks_done}/{planned.tasks}",
                str(0 if last is None else last.tasks_failed),
                "-" if eta is None else f"{eta:,.0f} s",
            )
        return table


def _announce(job_id: str, function_unchecked: str) -> None:
    """The run's job record, and a function that could not be checked."""
    console.print(f"[dim]job {job_id} (blockx jobs {job_id})[/]", highlight=False)
    if function_unchecked:
        console.print(f"[yellow]warning:[/] {escape(function_unchecked)}", highlight=False)


def _command_line() -> str:
    """This process's command line, as its job record names it (URL passwords are
    redacted when the record is made)."""
    return shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])


async def _backfill(
    settings: Settings, json_mode: bool, job: JobSpec, options: dict[str, Any]
) -> tuple[BackfillDone | None, list[TaskFinished]]:
    import asyncio

    from rich.live import Live

    from blockx_drive import BackfillDone, BackfillPlanned, TaskFinished, TaskOutcome, backfill

    failures: list[TaskFinished] = []
    view = _View()
    live = (
        Live(view.render(), console=console, refresh_per_second=4)
        if (console.is_terminal and not json_mode)
        else None
    )
    summary: BackfillDone | None = None
    clients: list[Client] = []

    async def consume() -> None:
        nonlocal summary
        async with settings.client() as client:
            clients.append(client)
            events: AsyncIterator[BackfillEvent] = backfill(client, job, **options)
            async for event in events:
                if json_mode:
                    _print_json(event)
                match event:
                    case BackfillPlanned():
                        view.planned = event
                        if not json_mode:
                            _announce(event.job_id, event.function_unchecked)
                    case TaskFinished():
                        view.last = event
                        if event.outcome is TaskOutcome.FAILED:
                            failures.append(event)
                        elif event.outcome is TaskOutcome.RETRYING and live is not None:
                            live.console.print(
                                f"[yellow]retrying[/] blocks {event.from_block}.."
                                f"{event.to_block} ({event.failure_code}: "
                                f"{escape(event.failure_message)})",
                                highlight=False,
                            )
                    case BackfillDone():
                        summary = event
                if live is not None:
                    live.update(view.render())

    work = asyncio.ensure_future(consume())

    def interrupt() -> None:
        # The backfill cancels its tasks in flight as it stops (a second signal
        # stops that wait too).
        if not work.cancelling():
            _cancelling(clients)
        work.cancel()

    with _on_signals(interrupt):
        if live is not None:
            live.start()
        try:
            await work
        except asyncio.CancelledError:
            pass  # interrupted: what was written stays, a re-run resumes
        finally:
            if live is not None:
                live.stop()
    return summary, failures


@app.command("backfill")
def backfill_command(
    ctx: typer.Context,
    *,
    function: FunctionOpt,
    source_table: SourceTableOpt,
    from_block: Annotated[int, typer.Option("--from", min=0, max=MAX_INTEGER, help="First block.")],
    to_block: Annotated[int, typer.Option("--to", min=0, max=MAX_INTEGER, help="Last block.")],
    sink_table: SinkTableOpt,
    where: WhereOpt = None,
    unit: UnitOpt = CallUnit.ROW,
    abi: AbiOpt = None,
    event: EventOpt = None,
    blocks_per_task: Annotated[
        int, typer.Option("--blocks-per-task", min=1, help="Blocks per task.")
    ] = DEFAULT_BLOCKS_PER_TASK,
    bundle_size: Annotated[
        int | None,
        typer.Option(
            "--bundle-size",
            min=1,
            help="Blocks per writer transaction (default: the task's blocks, up to "
            f"{DEFAULT_BUNDLE_SIZE_LIMIT:,}).",
        ),
    ] = None,
    tasks_in_flight: Annotated[
        int, typer.Option("--tasks-in-flight", min=1, help="Tasks running at a time.")
    ] = DEFAULT_TASKS_IN_FLIGHT,
    writer: Annotated[
        str, typer.Option("--writer", help="The Writer Plugin.")
    ] = DEFAULT_BACKFILL_WRITER,
    db: DbOpt = None,
    sink_db: SinkDbOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Rewrite ranges already written.")] = False,
    max_attempts: MaxAttemptsOpt = DEFAULT_MAX_ATTEMPTS,
    on_failure: OnFailureOpt = OnFailure.CONTINUE,
    column: ColumnOpt = None,
    chain: ChainOpt = None,
    json_output: JsonLinesOpt = False,
) -> None:
    """Run a block range through the bundle cluster into a sink table, resumably."""
    if to_block < from_block:
        fail(f"--to ({to_block}) is below --from ({from_block})", EXIT_USAGE)
    job = _job(
        json_output,
        _Flags(where=where, unit=unit, abi=abi, event=event, db=db, sink_db=sink_db, column=column),
        function=function,
        source_table=source_table,
        tasks_in_flight=tasks_in_flight,
        sink_table=sink_table,
        writer=writer,
        chain=chain,
        max_attempts=max_attempts,
        on_failure=on_failure,
    )
    options: dict[str, Any] = {
        "from_block": from_block,
        "to_block": to_block,
        "blocks_per_task": blocks_per_task,
        "bundle_size": bundle_size,
        "force": force,
    }
    summary, failures = _run(_backfill(settings_of(ctx), json_output, job, options))
    if summary is None:
        if not json_output:
            console.print("stopped: what was written stays; run again to resume", highlight=False)
        raise typer.Exit(130)
    if not json_output:
        console.print(
            f"backfilled {summary.blocks:,} blocks, {summary.rows:,} rows in "
            f"{summary.tasks} tasks ({summary.skipped} skipped as written, "
            f"{summary.retries} retries, {summary.failed} failed) in "
            f"{summary.seconds:.1f} s: {summary.blocks_per_s:,.0f} blocks/s, "
            f"{summary.rows_per_s:,.0f} rows/s",
            highlight=False,
        )
        if summary.unfinished:
            console.print(
                f"stopped after a failure (--on-failure stop): {summary.unfinished} tasks "
                "not run; run again to resume",
                highlight=False,
            )
    if failures:
        last = failures[-1]
        message = (
            f"{summary.failed} of {summary.tasks} tasks failed; the last: blocks "
            f"{last.from_block}..{last.to_block} after {last.attempt} attempts: "
            f"{last.failure_code}: {_first_line(last.failure_message)}"
        )
        fail(message, EXIT_FAILED)


# ---- follow ---------------------------------------------------------------------------


def _describe(event: FollowEvent) -> str:
    from blockx_drive import (
        BlockFailed,
        BlockRetrying,
        BlocksDeleted,
        BlockWritten,
        FollowStarted,
        LagFrom,
        LedgerReconciled,
        ReorgReconciled,
        WatchInterrupted,
    )

    match event:
        case FollowStarted():
            head = "nothing ingested yet" if event.head is None else f"head {event.head}"
            return f"following from block {event.from_block} ({head})"
        case BlockWritten():
            since = "ingest stored it" if event.lag_from is LagFrom.INGEST else "follow saw it"
            return (
                f"block {event.number} {event.hash[:10]}…: {event.rows} rows, "
                f"written {event.lag_ms:,} ms after {since}"
            )
        case BlockRetrying():
            return (
                f"[yellow]block {event.number} retrying[/] after attempt {event.attempt}: "
                f"{event.failure_code}: {escape(event.failure_message)}"
            )
        case BlockFailed():
            return (
                f"[red]block {event.number} failed[/] after {event.attempt} attempts: "
                f"{event.failure_code}: {escape(event.failure_message)}"
            )
        case ReorgReconciled():
            return (
                f"[yellow]reorg[/] of depth {event.depth} at block {event.fork_block_number}: "
                f"rewriting {len(event.rewritten)} blocks, deleted {len(event.deleted)}"
            )
        case BlocksDeleted():
            return f"deleted blocks {', '.join(map(str, event.numbers))} (no longer in the chain)"
        case LedgerReconciled():
            if event.from_block is None:
                return f"ledger reconciled ({event.reason}): nothing written to check"
            return (
                f"ledger reconciled ({event.reason}): {event.checked} blocks written in "
                f"{event.from_block}..{event.to_block} compared with the chain, "
                f"rewriting {_numbers(event.rewritten)}, deleted {_numbers(event.deleted)}"
            )
        case WatchInterrupted():
            return (
                f"[yellow]cannot read a database[/] ({escape(event.message)}): "
                f"trying again in {event.retry_in_s:.1f} s"
            )
        case _:
            assert_never(event)


def _numbers(numbers: tuple[int, ...]) -> str:
    return ", ".join(map(str, numbers)) if numbers else "none"


async def _follow(
    settings: Settings, json_mode: bool, job: JobSpec, options: dict[str, Any]
) -> dict[int, BlockFailed]:
    """Run follow until it stops; the blocks that failed for good and were not
    written after all, by number."""
    import asyncio

    from blockx_drive import BlockFailed, BlocksDeleted, BlockWritten, FollowStarted, follow

    unwritten: dict[int, BlockFailed] = {}
    stop = asyncio.Event()
    clients: list[Client] = []
    cancels: list[asyncio.Task[Any]] = []

    def interrupt() -> None:
        # Follow stops once its tasks in flight have ended: cancel them, so it ends now.
        if not stop.is_set():
            _cancelling(clients)
            cancels.extend(asyncio.create_task(c.cancel_in_flight()) for c in clients)
        stop.set()

    with _on_signals(interrupt):
        async with settings.client() as client:
            clients.append(client)
            events: AsyncIterator[FollowEvent] = follow(client, job, stop=stop, **options)
            async for event in events:
                if json_mode:
                    _print_json(event)
                else:
                    console.print(_describe(event), highlight=False)
                match event:
                    case FollowStarted() if not json_mode:
                        _announce(event.job_id, event.function_unchecked)
                    case BlockFailed():
                        unwritten[event.number] = event
                    case BlockWritten():
                        unwritten.pop(event.number, None)
                    case BlocksDeleted():
                        for number in event.numbers:
                            unwritten.pop(number, None)
            await asyncio.gather(*cancels)
    return unwritten


@app.command("follow")
def follow_command(
    ctx: typer.Context,
    *,
    function: FunctionOpt,
    source_table: SourceTableOpt,
    sink_table: SinkTableOpt,
    where: WhereOpt = None,
    unit: UnitOpt = CallUnit.ROW,
    abi: AbiOpt = None,
    event: EventOpt = None,
    from_block: Annotated[
        int | None,
        typer.Option(
            "--from",
            min=0,
            max=MAX_INTEGER,
            help="First block.",
            show_default="where the sink table's ledger left off, or the head",
        ),
    ] = None,
    db: DbOpt = None,
    sink_db: SinkDbOpt = None,
    poll_interval: Annotated[
        float,
        typer.Option(
            "--poll-interval",
            min=0.01,
            max=60.0,
            help="Seconds between looks at the block database's head and reorgs.",
        ),
    ] = DEFAULT_POLL_INTERVAL_S,
    reorg_window: Annotated[
        int,
        typer.Option(
            "--reorg-window",
            min=1,
            max=REORG_WINDOW_LIMIT,
            help="Blocks below its head that follow compares with the chain on every "
            "start and after a gap (with every block above the finalized height).",
        ),
    ] = DEFAULT_REORG_WINDOW,
    max_attempts: MaxAttemptsOpt = DEFAULT_MAX_ATTEMPTS,
    on_failure: OnFailureOpt = OnFailure.CONTINUE,
    column: ColumnOpt = None,
    chain: ChainOpt = None,
    json_output: JsonLinesOpt = False,
    writer: Annotated[
        str, typer.Option("--writer", help="The Writer Plugin.")
    ] = DEFAULT_FOLLOW_WRITER,
) -> None:
    """Compute every new block on the block cluster into a sink table, reorgs included,
    until SIGINT/SIGTERM."""
    job = _job(
        json_output,
        _Flags(where=where, unit=unit, abi=abi, event=event, db=db, sink_db=sink_db, column=column),
        function=function,
        source_table=source_table,
        sink_table=sink_table,
        writer=writer,
        chain=chain,
        max_attempts=max_attempts,
        on_failure=on_failure,
    )
    options: dict[str, Any] = {
        "from_block": from_block,
        "poll_interval_s": poll_interval,
        "reorg_window": reorg_window,
    }
    unwritten = _run(_follow(settings_of(ctx), json_output, job, options))
    if unwritten:
        last = list(unwritten.values())[-1]
        fail(
            f"{len(unwritten)} blocks failed for good and were not written "
            f"({_numbers(tuple(sorted(unwritten)))}); the last: block {last.number} after "
            f"{last.attempt} attempts: {last.failure_code}: {_first_line(last.failure_message)}",
            EXIT_FAILED,
            hint="fix the cause and run follow again: without --from it starts at the "
            f"oldest block missing among the last {RESUME_WINDOW:,} of the ledger",
        )
