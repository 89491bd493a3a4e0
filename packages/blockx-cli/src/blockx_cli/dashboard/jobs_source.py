"""The jobs page's data: the backfill and follow jobs' records, read from the
sink database they write (``blockx_drive.jobs``).

A job record is written by whatever process runs the job, or by anyone who can
write the sink: the dashboard trusts none of it. Each record is decoded as a
``JobProgress``, whose every field is typed and bounded (numbers finite and in a
range a page can show, text of bounded length); a record that is not valid JSON,
too big, or out of bounds is a ``BadJobRecord`` naming its job id and why, shown
as one row, and the page shows everything else. The sink is opened read-only for
each page and never made: a SQLite sink that is not there is a problem on the
page.
"""

from __future__ import annotations

import asyncio
from typing import Final

import msgspec

from blockx_chain.sink import SinkError
from blockx_chain.store import StoreError, open_store
from blockx_chain.url import describe, parse_blockdb_url
from blockx_cli.dashboard.config import DashboardConfig
from blockx_cli.dashboard.sources import now_ms
from blockx_cli.dashboard.views import BadJobRecord, BlockDbState, JobRow, JobsPage, Problem
from blockx_drive.jobs import BadJobRecord as BadRecord
from blockx_drive.jobs import JobProgress, JobState, read_jobs

# The jobs a page shows: the most recently updated.
JOBS_SHOWN: Final = 200
NO_SINK: Final = (
    "no sink database is configured: pass --sink-db, set SINK_DB_URL, or start `blockx dev up`"
)


def job_row(job: JobProgress, at_ms: int) -> JobRow:
    return JobRow(
        job_id=job.job_id,
        kind=job.kind.value,
        state=job.shown_state(at_ms).value,
        started_ms=job.started_ms,
        updated_ms=job.updated_ms,
        updated_age_ms=max(0, at_ms - job.updated_ms),
        ended_ms=job.ended_ms,
        function=job.function,
        sink_table=job.sink_table,
        chain=job.chain,
        chain_id=job.chain_id,
        task_prefix=job.task_prefix,
        command=job.command,
        from_block=job.from_block,
        to_block=job.to_block,
        blocks_total=job.blocks_total,
        blocks_done=job.blocks_done,
        fraction_done=(min(1.0, job.blocks_done / job.blocks_total) if job.blocks_total else None),
        rows_done=job.rows_done,
        tasks_done=job.tasks_done,
        tasks_failed=job.tasks_failed,
        retries=job.retries,
        blocks_per_s=job.blocks_per_s,
        eta_s=job.eta_s,
        head=job.head,
        last_block=job.last_block,
        head_lag_blocks=job.head_lag_blocks,
        lag_ms=job.lag_ms,
        lag_from=None if job.lag_from is None else job.lag_from.value,
        failures=job.failures,
        message=job.message,
    )


def bad_row(bad: BadRecord) -> BadJobRecord:
    return BadJobRecord(key=bad.job_id, error=bad.error)


async def blockdb_state(url_text: str, timeout_s: float) -> BlockDbState | Problem:
    """What the block database holds, read-only (it is never created here)."""
    url = parse_blockdb_url(url_text)
    try:
        async with asyncio.timeout(timeout_s):
            store = await open_store(url, read_only=True)
            try:
                chain, held = await store.chain(), await store.log_filter()
            finally:
                await store.close()
    except (StoreError, TimeoutError) as exc:
        error = str(exc) or f"no answer in {timeout_s:g} s"
        return Problem(source=f"block database {describe(url)}", error=error)
    if chain is None:
        return BlockDbState(database=describe(url), holds="nothing yet")
    return BlockDbState(
        database=describe(url),
        holds="whole blocks" if held is None else "logs",
        head=chain.head_number,
        finalized=chain.finalized_number,
        epoch=chain.epoch,
        addresses=() if held is None else held.addresses,
        topic0s=() if held is None else held.topic0s,
        from_block=None if held is None else held.from_block,
    )


async def jobs_page(config: DashboardConfig) -> JobsPage:
    """The block database's state; running jobs first, then the most recently
    updated; then the bad records."""
    page = await _jobs(config)
    if config.blockdb_url is None:
        return page
    state = await blockdb_state(config.blockdb_url, config.timeout_s)
    if isinstance(state, Problem):
        return msgspec.structs.replace(page, problems=(*page.problems, state))
    return msgspec.structs.replace(page, blockdb=state)


async def _jobs(config: DashboardConfig) -> JobsPage:
    if config.sink_db_url is None:
        return JobsPage(now_ms=now_ms(), jobs=(), problems=(Problem(source="sink", error=NO_SINK),))
    url = parse_blockdb_url(config.sink_db_url)
    try:
        async with asyncio.timeout(config.timeout_s):
            records = await read_jobs(url, limit=JOBS_SHOWN)
    except (SinkError, TimeoutError) as exc:
        error = str(exc) or f"no answer in {config.timeout_s:g} s"
        return JobsPage(
            now_ms=now_ms(),
            jobs=(),
            problems=(Problem(source=f"sink {describe(url)}", error=error),),
        )
    at = now_ms()
    found = sorted(
        (r for r in records if isinstance(r, JobProgress)),
        key=lambda job: (job.shown_state(at) is not JobState.RUNNING, -job.updated_ms, job.job_id),
    )
    bad = tuple(bad_row(r) for r in records if isinstance(r, BadRecord))
    return JobsPage(now_ms=at, jobs=tuple(job_row(j, at) for j in found), bad_records=bad)
