"""A backfill's events folded into its job record (``blockx_drive.jobs``)."""

from __future__ import annotations

from typing import assert_never

import msgspec

from blockx_drive._backfill.progress import (
    BackfillDone,
    BackfillEvent,
    BackfillPlanned,
    TaskFinished,
    TaskOutcome,
)
from blockx_drive.job_progress import highest, with_failure
from blockx_drive.jobs import MAX_MESSAGE, JobProgress, JobState


def backfill_progress(job: JobProgress, event: BackfillEvent, now_ms: int) -> JobProgress:
    replace = msgspec.structs.replace
    match event:
        case BackfillPlanned():
            return replace(
                job,
                updated_ms=now_ms,
                from_block=event.from_block,
                to_block=event.to_block,
                blocks_total=event.blocks,
                tasks_total=event.tasks,
                tasks_skipped=event.skipped_tasks,
            )
        case TaskFinished():
            last = event.to_block if event.outcome is TaskOutcome.WRITTEN else None
            failures = job.failures
            message = job.message
            if event.outcome is not TaskOutcome.WRITTEN:
                what = f"blocks {event.from_block}..{event.to_block}"
                message = f"{what}: {event.failure_code}: {event.failure_message}"[:MAX_MESSAGE]
            if event.outcome is TaskOutcome.FAILED:
                failures = with_failure(
                    job, event, from_block=event.from_block, to_block=event.to_block, at_ms=now_ms
                )
            return replace(
                job,
                updated_ms=now_ms,
                blocks_done=event.blocks_done,
                rows_done=event.rows_done,
                tasks_done=event.tasks_done,
                tasks_failed=event.tasks_failed,
                retries=job.retries + (event.outcome is TaskOutcome.RETRYING),
                blocks_per_s=event.blocks_per_s,
                eta_s=event.eta_s,
                last_block=highest(job.last_block, last),
                failures=failures,
                message=message,
            )
        case BackfillDone():
            return replace(
                job,
                updated_ms=now_ms,
                state=JobState.FAILED if event.failed else JobState.FINISHED,
                blocks_done=event.blocks,
                rows_done=event.rows,
                tasks_failed=event.failed,
                retries=event.retries,
                blocks_per_s=event.blocks_per_s,
                eta_s=0.0,
            )
        case _:
            assert_never(event)
