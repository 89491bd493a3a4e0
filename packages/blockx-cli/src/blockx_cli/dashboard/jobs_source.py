"""The jobs page's data: backfill and follow progress, as the jobs publish it in
etcd (``blockx_client.jobs``).

A job record is written by whatever process runs the job, or by anyone who can
write etcd: the dashboard trusts none of it. Each record is decoded as a
``JobProgress``, whose every field is typed and bounded (numbers finite and in a
range a page can show, text of bounded length); a record that is not valid JSON,
too big, or out of bounds is a ``BadJobRecord`` naming its key and why, shown as
one row, and the page shows everything else.
"""

from __future__ import annotations

from typing import Final

from blockx_cli.dashboard.config import DashboardConfig
from blockx_cli.dashboard.sources import now_ms
from blockx_cli.dashboard.views import BadJobRecord, JobRow, JobsPage, Problem
from blockx_client import BlockxError
from blockx_client.jobs import JobProgress, JobState, decode_job, read_job_records

# What of a bad record's key and of the reason a row shows.
MAX_KEY_SHOWN: Final = 300
MAX_REASON_SHOWN: Final = 300


def _shown(text: str, bound: int) -> str:
    return text if len(text) <= bound else text[:bound] + "\N{HORIZONTAL ELLIPSIS}"


def decode_record(key: bytes, value: bytes) -> JobProgress | BadJobRecord:
    """The record under ``key``, or why it cannot be shown."""
    decoded = decode_job(value)
    if isinstance(decoded, JobProgress):
        return decoded
    return BadJobRecord(
        key=_shown(key.decode(errors="replace"), MAX_KEY_SHOWN),
        error=_shown(decoded, MAX_REASON_SHOWN),
    )


def job_row(job: JobProgress, at_ms: int) -> JobRow:
    return JobRow(
        job_id=job.job_id,
        kind=job.kind.value,
        state=job.state.value,
        started_ms=job.started_ms,
        updated_ms=job.updated_ms,
        updated_age_ms=max(0, at_ms - job.updated_ms),
        function=job.function,
        sink_table=job.sink_table,
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
        message=job.message,
    )


async def jobs_page(config: DashboardConfig) -> JobsPage:
    """Running jobs first, then the most recently updated; then the bad records."""
    try:
        records = await read_job_records(
            list(config.etcd_endpoints),
            prefix=config.jobs_prefix,
            timeout_s=config.timeout_s,
            access=config.access,
        )
    except BlockxError as exc:
        return JobsPage(
            now_ms=now_ms(), jobs=(), problems=(Problem(source="etcd", error=exc.message),)
        )
    at = now_ms()
    found: list[JobProgress] = []
    bad: list[BadJobRecord] = []
    for key, value in records:
        match decode_record(key, value):
            case JobProgress() as job:
                found.append(job)
            case BadJobRecord() as refused:
                bad.append(refused)
    found.sort(key=lambda j: (j.state is not JobState.RUNNING, -j.updated_ms, j.job_id))
    return JobsPage(now_ms=at, jobs=tuple(job_row(j, at) for j in found), bad_records=tuple(bad))
