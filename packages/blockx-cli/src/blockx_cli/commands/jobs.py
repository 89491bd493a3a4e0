"""The backfill and follow jobs recorded in a sink: ``jobs``.

Each run of ``blockx backfill`` / ``blockx follow`` (and ``blockx_drive.backfill`` /
``blockx_drive.follow``) keeps a record in the sink it writes (``blockx_drive.jobs``);
this command reads them there, opening the sink read-only: it makes nothing.

Exit codes: 0 shown; 1 no such job; 2 a bad flag or URL; 3 the sink cannot be
read (no SQLite file there, a server that does not answer).
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import msgspec
import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from blockx_chain.sink import SinkError, SinkUnavailable
from blockx_chain.url import BlockDbUrl, describe
from blockx_cli.dashboard.formatting import age
from blockx_cli.databases import SinkDbOpt, database_url
from blockx_cli.launch import collect_cycles
from blockx_cli.options import JsonOpt
from blockx_cli.output import EXIT_FAILED, EXIT_OK, EXIT_SERVICE, Output, console, fail
from blockx_drive.jobs import (
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    STALE_AFTER_MS,
    BadJobRecord,
    JobProgress,
    JobState,
    LagFrom,
    read_jobs,
)

app = typer.Typer()

_STATE_STYLE = {
    JobState.RUNNING: "cyan",
    JobState.FINISHED: "green",
    JobState.FAILED: "red",
    JobState.STOPPED: "yellow",
    JobState.INTERRUPTED: "magenta",
}


@app.command()
def jobs(
    job_id: Annotated[
        str | None, typer.Argument(help="One job's record in full; without it, the newest jobs.")
    ] = None,
    *,
    sink_db: SinkDbOpt = None,
    limit: Annotated[
        int, typer.Option(min=1, max=MAX_LIST_LIMIT, help="The most recently updated jobs shown.")
    ] = DEFAULT_LIST_LIMIT,
    json_: JsonOpt = False,
) -> None:
    """Backfill and follow jobs, from their records in the sink database: state,
    progress, blocks/s, lag, last failures, the command that started each.

    A running job whose driver has not updated its record for a minute shows as
    interrupted: its process died or lost its sink."""
    out = Output(console, json_)
    url, _ = database_url(sink_db, "--sink-db", "SINK_DB_URL", "sink database")
    raise typer.Exit(_read(out, url, job_id, limit))


def _read(out: Output, url: BlockDbUrl, job_id: str | None, limit: int) -> int:
    collect_cycles()
    try:
        records = asyncio.run(read_jobs(url, limit=limit, job_id=job_id))
    except SinkUnavailable as exc:
        fail(str(exc), EXIT_SERVICE)
    except SinkError as exc:
        fail(f"cannot read the job records of {describe(url)}: {exc}", EXIT_SERVICE)
    now_ms = time.time_ns() // 1_000_000
    found = [r for r in records if isinstance(r, JobProgress)]
    bad = [r for r in records if isinstance(r, BadJobRecord)]
    if job_id is not None and not found:
        why = f": {bad[0].error}" if bad else ""
        fail(f"no job {job_id!r} in {describe(url)}{why}", EXIT_FAILED)
    if out.json_mode:
        out.emit(
            {
                "jobs": [_as_json(job, now_ms) for job in found],
                "bad_records": [msgspec.to_builtins(b) for b in bad],
            }
        )
    elif job_id is not None:
        _show(out, found[0], now_ms)
    else:
        _list(out, url, found, bad, now_ms)
    return EXIT_OK


def _as_json(job: JobProgress, now_ms: int) -> dict[str, Any]:
    shown: dict[str, Any] = msgspec.to_builtins(job)
    # What the state reads as now: a stale running record is interrupted.
    shown["shown_state"] = job.shown_state(now_ms).value
    return shown


def _state(job: JobProgress, now_ms: int) -> Text:
    state = job.shown_state(now_ms)
    return Text(state.value, style=_STATE_STYLE[state])


def _blocks(job: JobProgress) -> str:
    if job.blocks_total is not None:
        return f"{job.blocks_done:,}/{job.blocks_total:,}"
    return f"{job.blocks_done:,}"


def _chain(job: JobProgress) -> str:
    """The chain's name (``-``: the Workers' only chain) and chain id."""
    if job.chain_id is None:
        return job.chain or "-"
    return f"{job.chain or '-'} ({job.chain_id})"


def _lag(job: JobProgress) -> str:
    parts = []
    if job.head_lag_blocks is not None:
        parts.append(f"{job.head_lag_blocks:,} blocks")
    if job.lag_ms is not None:
        since = "" if job.lag_from is LagFrom.INGEST else " (since follow saw it)"
        parts.append(f"{age(job.lag_ms)}{since}")
    return ", ".join(parts) or "-"


def _list(
    out: Output, url: BlockDbUrl, found: list[JobProgress], bad: list[BadJobRecord], now_ms: int
) -> None:
    found.sort(key=lambda j: (j.shown_state(now_ms) is not JobState.RUNNING, -j.updated_ms))
    table = Table(title=f"{len(found)} job(s) in {describe(url)}", title_justify="left")
    for column in (
        "job",
        "state",
        "chain",
        "function → table",
        "blocks",
        "rows",
        "tasks ok/failed",
    ):
        table.add_column(column, no_wrap=column == "job")
    for column in ("blocks/s", "lag", "started", "updated"):
        table.add_column(column, justify="right")
    for job in found:
        table.add_row(
            Text(job.job_id),
            _state(job, now_ms),
            Text(_chain(job)),
            Text(f"{job.function} → {job.sink_table}"),
            _blocks(job),
            f"{job.rows_done:,}",
            f"{job.tasks_done:,}/{job.tasks_failed:,}",
            f"{job.blocks_per_s:,.1f}",
            _lag(job),
            f"{age(now_ms - job.started_ms)} ago",
            f"{age(now_ms - job.updated_ms)} ago",
        )
    out.console.print(table)
    for record in bad:
        out.console.print(
            f"[red]bad record[/] {escape(record.job_id)}: {escape(record.error)}", highlight=False
        )
    if not found and not bad:
        out.console.print("no backfill or follow job has a record in this sink", highlight=False)


def _show(out: Output, job: JobProgress, now_ms: int) -> None:
    state = job.shown_state(now_ms)
    end = "head" if job.to_block is None else f"{job.to_block:,}"
    skipped = f" ({job.tasks_skipped} tasks skipped as written)" if job.tasks_skipped else ""
    lines = [
        ("job", f"{job.job_id} ({job.kind.value})"),
        ("state", state.value),
        ("command", job.command or "-"),
        ("chain", _chain(job)),
        ("function", f"{job.function} over {job.source_table} → sink table {job.sink_table}"),
        ("task ids", f"{job.task_prefix}…"),
        ("range", f"{job.from_block:,} → {end}"),
        ("blocks", _blocks(job) + skipped),
        ("rows", f"{job.rows_done:,}"),
        ("tasks", f"{job.tasks_done:,} written, {job.tasks_failed:,} failed"),
        ("retries", f"{job.retries:,}"),
        ("blocks/s", f"{job.blocks_per_s:,.1f}"),
        ("lag", _lag(job)),
        ("started", f"{age(now_ms - job.started_ms)} ago"),
        ("updated", f"{age(now_ms - job.updated_ms)} ago"),
    ]
    if job.ended_ms is not None:
        lines.append(("ended", f"{age(now_ms - job.ended_ms)} ago"))
    if state is JobState.INTERRUPTED:
        lines.append(
            ("note", f"not updated for over {STALE_AFTER_MS // 1000} s: its driver stopped")
        )
    if job.message:
        lines.append(("message", job.message))
    for name, value in lines:
        out.console.print(f"[bold]{name:>9}[/]  {escape(value)}", highlight=False)
    if job.failures:
        table = Table(title=f"last {len(job.failures)} failure(s)", title_justify="left")
        for column in ("blocks", "task", "attempt", "code", "message"):
            table.add_column(column)
        for failure in job.failures:
            table.add_row(
                f"{failure.from_block}..{failure.to_block}",
                Text(failure.task_id),
                str(failure.attempt),
                Text(failure.code),
                Text(failure.message.split("\n", 1)[0]),
            )
        out.console.print(table)
