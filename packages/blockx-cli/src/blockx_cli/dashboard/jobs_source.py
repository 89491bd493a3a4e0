"""The jobs page's data: backfill and follow progress, as the jobs publish it in
etcd (``blockx_client.jobs``)."""

from __future__ import annotations

from blockx_cli.dashboard.config import DashboardConfig
from blockx_cli.dashboard.sources import now_ms
from blockx_cli.dashboard.views import JobRow, JobsPage, Problem
from blockx_client import BlockxError
from blockx_client.jobs import JobProgress, JobState, list_jobs


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
    """Running jobs first, then the most recently updated."""
    try:
        found = await list_jobs(
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
    found.sort(key=lambda j: (j.state is not JobState.RUNNING, -j.updated_ms, j.job_id))
    return JobsPage(now_ms=at, jobs=tuple(job_row(j, at) for j in found))
