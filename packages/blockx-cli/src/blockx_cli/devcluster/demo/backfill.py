"""The demo's backfill stage: the block range through the bundle cluster into the sink.

``backfill_stage`` splits the range into tasks of consecutive blocks
(``BlockBundleCallConfig``, ``BlockBundleWriteResultHandler``), runs them on the
bundle cluster at once, and re-runs a retryable failure under a new task_id. The
progress bar counts the blocks the sink's ledger (``_blockx_written``) holds, so it
moves as each bundle's transaction commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from pathlib import Path
from typing import Final

import msgspec
from rich.console import Console

from blockx_chain.sink import LEDGER
from blockx_chain.url import SqliteUrl, parse_blockdb_url
from blockx_cli.devcluster.demo.chain import progress_bar
from blockx_cli.devcluster.demo.job import ChainJob
from blockx_client import Client, TaskResult

_POLL_S: Final = 0.1
MAX_ATTEMPTS: Final = 3


class BackfillFigures(msgspec.Struct, frozen=True, kw_only=True):
    blocks: int
    rows: int
    tasks: int
    failed: list[str]
    seconds: float

    @property
    def blocks_per_s(self) -> float:
        return self.blocks / self.seconds if self.seconds > 0 else 0.0


def split(first: int, last: int, tasks: int) -> list[tuple[int, int]]:
    """``[first, last]`` as at most ``tasks`` ranges of consecutive blocks, in order."""
    total = last - first + 1
    size = -(-total // max(tasks, 1))
    return [(start, min(start + size - 1, last)) for start in range(first, last + 1, size)]


def ledger_blocks(sink_db_url: str, table: str, first: int, last: int) -> int:
    """Blocks of ``[first, last]`` the sink's ledger records for ``table`` (SQLite only)."""
    url = parse_blockdb_url(sink_db_url)
    if not isinstance(url, SqliteUrl) or not Path(url.path).exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{url.path}?mode=ro", uri=True)) as db:
            row = db.execute(
                f"SELECT count(*) FROM {LEDGER} WHERE table_name = ? "
                "AND block_number BETWEEN ? AND ?",
                (table, first, last),
            ).fetchone()
    except sqlite3.Error:
        return 0  # not created yet
    return int(row[0])


async def backfill_stage(
    client: Client,
    job: ChainJob,
    first: int,
    last: int,
    *,
    sink_db_url: str,
    console: Console,
    tasks: int = 8,
    bundle_size: int = 50,
) -> BackfillFigures:
    """Blocks ``first``..``last`` of ``job`` through the bundle cluster, with progress."""
    started = time.monotonic()
    ranges = split(first, last, tasks)
    run_id = f"demo-{os.getpid()}-backfill"
    outcomes: list[TaskResult] = []

    async def one(index: int, lo: int, hi: int) -> None:
        task = job.bundle_task(lo, hi, bundle_size, f"{run_id}-{index:02d}")
        attempts = await client.run_with_retries(task, max_attempts=MAX_ATTEMPTS)
        outcomes.append(attempts[-1])

    total = last - first + 1
    with progress_bar(console) as progress:
        bar = progress.add_task("blocks written", total=total, rate="")
        runs = [asyncio.create_task(one(i, lo, hi)) for i, (lo, hi) in enumerate(ranges)]
        while not all(run.done() for run in runs):
            await asyncio.wait(runs, timeout=_POLL_S)
            written = await asyncio.to_thread(
                ledger_blocks, sink_db_url, job.sink_table, first, last
            )
            rate = written / max(time.monotonic() - started, 1e-9)
            progress.update(
                bar,
                completed=written,
                rate=f"{rate:,.0f} blocks/s, tasks {len(outcomes)}/{len(ranges)}",
            )
        for run in runs:
            run.result()  # a client error surfaces here
    seconds = time.monotonic() - started
    blocks = rows = 0
    failed = []
    for result in outcomes:
        if not result.ok:
            failed.append(f"{result.task_id}: {result.failure_code} {result.failure_message}")
            continue
        written_value = result.outputs() or {}
        blocks += int(written_value.get("blocks", 0))
        rows += int(written_value.get("rows", 0))
    return BackfillFigures(
        blocks=blocks, rows=rows, tasks=len(ranges), failed=failed, seconds=seconds
    )
